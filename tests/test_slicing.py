"""Which outputs are scored: direct horizons, MS / covariate channels, tokens, roll-out length."""
import pytest
import torch

from data_provider.data_factory import data_provider
from exp.forward import forward
from helpers import SMALL_TIMERXL, make_args, make_experiment

TIMERXL = [*SMALL_TIMERXL, "--input_token_len", 24, "--output_token_len", 48]


def _exp_and_batch(*argv, flag="train", batch=4):
    exp = make_experiment(make_args(*argv))
    dataset, _ = data_provider(exp.args, flag)
    return exp, dataset.__getitems__(list(range(batch)))


def test_direct_model_scores_the_horizon_of_every_channel():
    exp, batch = _exp_and_batch("--model", "DLinear", "--pred_len", 24)
    pred, true = forward(exp.raw_model, batch, exp.args, "train", exp.device)
    assert pred.shape == true.shape == (4, 24, 7)
    torch.testing.assert_close(true, batch[1][:, -24:])


def test_a_direct_model_that_returns_the_label_part_too_is_scored_on_its_last_pred_len_steps():
    """TSLib's encoder-decoder models return label_len + pred_len steps; only the horizon is scored."""
    exp, batch = _exp_and_batch("--model", "DLinear", "--seq_len", 96, "--label_len", 48, "--pred_len", 24)
    y = batch[1]  # [B, label_len + pred_len, C]

    def returns_label_and_horizon(x, x_mark_enc, x_dec, x_mark_dec):
        return y * 2  # a forecast of every decoder step

    pred, true = forward(returns_label_and_horizon, batch, exp.args, "train", exp.device)
    torch.testing.assert_close(pred, 2 * y[:, -24:])
    torch.testing.assert_close(true, y[:, -24:])


@pytest.mark.parametrize("model", ["Transformer", "DLinear"])
def test_a_decoder_input_goes_to_the_models_that_read_one(model):
    """TSLib's decoder input, the last label_len known steps then pred_len zeros, goes to a model whose
    inputs_used names x_dec (Transformer), and None to one that does not (DLinear): never the truth."""
    exp, batch = _exp_and_batch("--model", model, "--seq_len", 96, "--label_len", 48, "--pred_len", 24,
                                "--d_model", 16, "--n_heads", 2, "--d_ff", 32)
    y, seen = batch[1], {}

    def spy(x, x_mark_enc, x_dec, x_mark_dec):
        seen["x_dec"] = x_dec
        return y[:, -24:]

    forward(spy, batch, exp.args, "train", exp.device)
    if model == "DLinear":
        assert seen["x_dec"] is None
    else:
        torch.testing.assert_close(seen["x_dec"], torch.cat([y[:, :48], torch.zeros_like(y[:, 48:])], dim=1))


def test_a_direct_windows_target_rows_follow_its_input_rows():
    exp, _ = _exp_and_batch("--model", "DLinear", "--seq_len", 96, "--label_len", 48, "--pred_len", 24)
    dataset, _ = data_provider(exp.args, "train")
    x, y, _, _ = dataset.__getitems__([0, 96])  # window 96 starts where window 0's input ends
    torch.testing.assert_close(y[0, :48], x[0, -48:])  # the label part: the input's last label_len rows
    torch.testing.assert_close(y[0, 48:], x[1, :24])  # the horizon: the next pred_len rows


@pytest.mark.parametrize("flag", ["--features MS", "--covariate"])
def test_ms_and_covariate_score_only_the_target_channel(flag):
    exp, batch = _exp_and_batch("--model", "DLinear", *flag.split())
    pred, true = forward(exp.raw_model, batch, exp.args, "val", exp.device)
    assert pred.shape == true.shape == (4, 96, 1)
    torch.testing.assert_close(true[..., 0], batch[1][:, -96:, -1])  # the target is the last column


def test_token_model_scores_every_token_against_its_next_steps():
    exp, batch = _exp_and_batch(*TIMERXL)
    pred, true = forward(exp.raw_model, batch, exp.args, "train", exp.device)
    assert pred.shape == true.shape == (4, 4, 48, 7)  # 96 / 24 tokens, 48 steps each
    x, y = batch[0], batch[1]
    full = torch.cat([x, y[:, -48:]], dim=1)  # rows 0 .. 96+48 of each window
    for n in range(4):
        torch.testing.assert_close(true[:, n], full[:, (n + 1) * 24:(n + 1) * 24 + 48])


def test_last_token_and_valid_last_score_the_last_token():
    exp, batch = _exp_and_batch(*TIMERXL, "--valid_last", "--dropout", 0)
    model = exp.raw_model.eval()
    every_pred, every_true = forward(model, batch, exp.args, "train", exp.device)  # training scores all 4 tokens
    assert every_pred.shape == (4, 4, 48, 7)
    pred, true = forward(model, batch, exp.args, "val", exp.device)
    torch.testing.assert_close(pred, every_pred[:, -1:])  # validation: the last token only, as it is
    torch.testing.assert_close(true, every_true[:, -1:])
    exp, batch = _exp_and_batch(*TIMERXL, "--last_token", "--covariate", "--dropout", 0)
    model = exp.raw_model.eval()
    pred, true = forward(model, batch, exp.args, "train", exp.device)
    assert pred.shape == true.shape == (4, 1, 48, 1)
    x, y = batch[0], batch[1]
    torch.testing.assert_close(true[:, 0, :, 0], y[:, -48:, -1])  # the last token's next 48 steps of the target
    torch.testing.assert_close(pred[:, 0, :, 0], model(x, None, None, None)[:, -48:, -1])


@pytest.mark.parametrize("horizon", [48, 60, 200])
def test_rollout_reaches_test_pred_len(horizon):
    exp, batch = _exp_and_batch(*TIMERXL, "--test_pred_len", horizon, flag="test")
    pred, true = forward(exp.raw_model, batch, exp.args, "test", exp.device)
    assert pred.shape == true.shape == (4, horizon, 7)


def test_rollout_feeds_predictions_back():
    """The second block of a roll-out equals a forward pass on the history shifted by the first."""
    exp, batch = _exp_and_batch(*TIMERXL, "--test_pred_len", 96, "--dropout", 0, flag="test")
    model = exp.raw_model.eval()
    with torch.no_grad():
        pred, _ = forward(model, batch, exp.args, "test", exp.device)
        first = model(batch[0], None, None, None)[:, -48:]
        shifted = torch.cat([batch[0][:, 48:], first], dim=1)
        second = model(shifted, None, None, None)[:, -48:]
    torch.testing.assert_close(pred, torch.cat([first, second], dim=1))


class MarkReader(torch.nn.Module):
    """A token model that reads time features: it records the marks each roll-out step gives it."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec):
        assert x_mark_enc.shape[:2] == x_enc.shape[:2]
        self.seen.append(x_mark_enc)
        return x_enc


@pytest.mark.parametrize("horizon", [48, 60, 100])
def test_rollout_gives_each_step_the_marks_of_its_input_rows(horizon):
    exp = make_experiment(make_args(*TIMERXL, "--test_pred_len", horizon))
    exp.args = exp.args.replace(model_inputs=("x_enc", "x_mark_enc"))
    dataset, _ = data_provider(exp.args, "test")
    x, y, x_mark, y_mark = batch = dataset.__getitems__([0, 3])
    model = MarkReader()
    pred, _ = forward(model, batch, exp.args, "test", exp.device)
    assert pred.shape[1] == horizon and len(model.seen) == -(-horizon // 48)
    every = torch.cat([x_mark, y_mark], dim=1)  # the window's input and horizon rows
    for step, marks in enumerate(model.seen):
        torch.testing.assert_close(marks, every[:, step * 48:step * 48 + 96], rtol=0, atol=0)


def test_nonautoregressive_needs_long_enough_tokens():
    from utils.errors import UserError

    with pytest.raises(UserError, match="--output_token_len \\(48\\) must cover --test_pred_len \\(96\\)"):
        make_experiment(make_args(*TIMERXL, "--nonautoregressive"))
    exp, batch = _exp_and_batch(*TIMERXL, "--nonautoregressive", "--test_pred_len", 40, flag="test")
    assert forward(exp.raw_model, batch, exp.args, "test", exp.device)[0].shape == (4, 40, 7)
