"""Time-MoE against Time-MoE's own code: the committed fixture tests/fixture/ (beside this file) is a release folder
written by the reference (TimeMoeForPrediction at reduced sizes, random weights, save_pretrained: config.json +
model.safetensors) with the reference's forecasts (Time-MoE's README path: standardise, generate, scale back) and
training loss (its forward with labels and loss masks), made by `python -m models.foundation.time_moe.crosscheck
--write-fixture` in the reference's environment. Here, without it: ours forecasts and trains as it does, and the
balancing term is per forward call, as the reference's per batch (so one micro-batch of 8 is not two of 4). What
every release shares (zero-shot and fine-tuning on several processes, the export's layout, the bad inputs) is
tests/test_foundation.py's contract."""
import json
import shutil
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from helpers import ETTH1_ARGS, trained_on_1_and_2_processes, write_etth1_shaped
from models.foundation.time_moe import TimeMoE
from exp.export import export, load_weights
from utils.errors import UserError
from utils.host_syncs import record_host_syncs, summary, to_meta

FIXTURE = Path(__file__).resolve().parent / "fixture"
REFERENCE = torch.load(FIXTURE / "reference_outputs.pt", weights_only=True)


def configs(folder, seq_len, pred_len, use_norm=1, **sizes):
    return Namespace(seq_len=seq_len, pred_len=pred_len, pretrain_model_path=None if folder is None else str(folder),
                     use_norm=use_norm, **{"d_model": 16, "n_heads": 2, "e_layers": 1, "d_ff": 32, "dropout": 0.0,
                                           **sizes})


def ours(folder, seq_len, pred_len, use_norm=1):
    return load_weights(TimeMoE.Model(configs(folder, seq_len, pred_len, use_norm)), str(folder)).eval()


def forecast(model, series):
    with torch.no_grad():
        return model(series.unsqueeze(-1))[..., 0]


@pytest.mark.parametrize("seq_len, pred_len", [(96, 1), (96, 20), (96, 96)], ids=["one-head", "8+8+1x4", "64+32"])
def test_forecasts_equal_the_references_generate(seq_len, pred_len):
    """pred_len 1 is the first head; 20 is two 8-step heads and four 1-step ones; 96 is 64 then 32, each step fed
    back through the key/value cache, as the reference's generate does."""
    want = REFERENCE[f"forecast_{seq_len}_{pred_len}"]
    got = forecast(ours(FIXTURE, seq_len, pred_len), REFERENCE["windows"][:, -seq_len:])
    assert got.shape == want.shape == (4, pred_len)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_the_heads_are_picked_as_the_reference_picks_them():
    model = TimeMoE.Model(configs(None, 96, 1))
    steps = {}
    for pred_len in (1, 7, 8, 20, 33, 96, 200):
        model.pred_len, remaining, used = pred_len, pred_len, []
        while remaining:
            used.append(min(model.horizons[model.head_for(remaining)], remaining))
            remaining -= used[-1]
        steps[pred_len] = used
    assert steps == {1: [1], 7: [1] * 7, 8: [8], 20: [8, 8, 1, 1, 1, 1], 33: [32, 1], 96: [64, 32],
                     200: [64, 64, 64, 8]}
    model.horizons = [8, 32]  # a first head longer than what is left: it is used, cut
    model.pred_len = 5
    assert forecast(model.eval(), torch.randn(2, 96)).shape == (2, 5)


def test_the_training_loss_is_the_references():
    """Mean of our per-window losses == the reference's loss (Huber per head over the steps inside the sequence,
    averaged over heads, + 0.02 x the balancing loss of the call), on 4 sequences and on the first 2."""
    model = ours(FIXTURE, 30, 10, use_norm=0).train()
    sequence = REFERENCE["sequence"]  # [4, 41]: 30 steps of context, 10 of future, one more as the last label
    for rows, key in ((4, "loss"), (2, "loss_first_two")):
        got = model(sequence[:rows, :30, None], target=sequence[:rows, 30:, None])
        assert got.shape == (rows,)
        assert got.mean().item() == pytest.approx(REFERENCE[key].item(), rel=1e-5)


def test_the_balancing_term_belongs_to_the_forward_call():
    """Each window's loss is its own multi-horizon loss plus the call's balancing term: the same window in another
    batch changes by the difference of the two calls' terms, and the term is what makes 1 x 8 differ from 2 x 4."""
    model = ours(FIXTURE, 30, 10, use_norm=0).train()
    sequence = REFERENCE["sequence"].unsqueeze(-1)
    with torch.no_grad():
        whole = model(sequence[:, :30], target=sequence[:, 30:])
        half = model(sequence[:2, :30], target=sequence[:2, 30:])
        model.config["apply_aux_loss"] = False
        bare_whole = model(sequence[:, :30], target=sequence[:, 30:])
        bare_half = model(sequence[:2, :30], target=sequence[:2, 30:])
    torch.testing.assert_close(bare_whole[:2], bare_half, rtol=1e-6, atol=0)
    term_whole, term_half = whole - bare_whole, half - bare_half
    assert torch.allclose(term_whole, term_whole[0]) and torch.allclose(term_half, term_half[0])
    assert abs(term_whole[0] - term_half[0]) > 1e-4  # a batch of 4 routes differently from its first 2


def test_a_series_forecast_does_not_depend_on_its_batch():
    """Every projection pads fewer than 12 rows and the one-column ones are a product and sum: a series alone, or
    among 2, 5 or 9, gets the same bits, through the rollout's small steps too (pred_len 20: 1-token steps), on one
    thread and on two (the attention of new tokens to the cache is matrix products: PyTorch's fused CPU attention
    sums a short query in a batch-dependent order on several threads)."""
    model = ours(FIXTURE, 96, 20)
    series = torch.randn(9, 96, generator=torch.Generator().manual_seed(4)).cumsum(1)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            whole = forecast(model, series)
            for rows in (1, 2, 5):
                assert torch.equal(forecast(model, series[:rows]), whole[:rows]), (count, rows)
            windows = series.view(3, 3, 96).transpose(1, 2).contiguous()  # 3 windows of 3 channels, as loaded
            with torch.no_grad():
                assert torch.equal(model(windows[:1]), model(windows)[:1]), count
    finally:
        torch.set_num_threads(threads)


def test_the_dense_dispatch_forecasts_the_grouped_dispatchs_bits(monkeypatch):
    """Off the CPU (and under torch.compile) every expert runs on every row, its output kept where the row chose it;
    on the CPU the rows are grouped by expert. On the CPU, where a projection's rows do not depend on how many it
    is given, both give the same bits: forecasts through the rollout's small steps, a series alone or among 9, and
    the training loss; the gradients agree to float32 rounding (a weight's gradient sums the rows in other groups)."""
    series = torch.randn(9, 96, generator=torch.Generator().manual_seed(7)).cumsum(1)
    sequence = REFERENCE["sequence"].unsqueeze(-1)
    grouped = {}
    for path in ("grouped", "dense"):
        if path == "dense":
            monkeypatch.setattr(TimeMoE.SparseExperts, "grouped", TimeMoE.SparseExperts.dense)
        got = grouped if path == "grouped" else {}
        for pred_len in (20, 96):
            model = ours(FIXTURE, 96, pred_len)
            got[pred_len] = forecast(model, series)
            assert torch.equal(forecast(model, series[:2]), got[pred_len][:2])
        model = ours(FIXTURE, 30, 10, use_norm=0).train()
        got["loss"] = model(sequence[:, :30], target=sequence[:, 30:])
        got["loss"].sum().backward()
        got["grads"] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    for key in (20, 96, "loss"):
        assert torch.equal(got[key], grouped[key]), key
    assert len(got["grads"]) == len(grouped["grads"])
    for mine, theirs in zip(got["grads"], grouped["grads"]):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-7)


def test_a_forecast_and_a_training_step_read_nothing_back_off_the_cpu():
    """On a device the experts' dispatch, the rollout and the training loss read no value back to the host
    (counted on the meta device: utils.host_syncs)."""
    model = to_meta(ours(FIXTURE, 96, 20))
    series = to_meta(torch.randn(3, 96, 2))
    with record_host_syncs() as rec, torch.no_grad():
        model(series)
    assert rec.syncs == [], summary(rec)
    model = to_meta(ours(FIXTURE, 30, 10, use_norm=0).train())
    with record_host_syncs() as rec:
        model(series[:, :30], target=series[:, 30:40]).sum().backward()
    assert rec.syncs == [], summary(rec)


def test_a_projections_rows_do_not_depend_on_how_many_it_is_given():
    """At the released widths (hidden 384): a row alone or among 2 ... 39 gets the bits it gets among 64, for a
    one-column output (the shared expert's gate, the 1-step head) and a wide one (an expert's projection)."""
    generator = torch.Generator().manual_seed(5)
    rows = torch.randn(64, 384, generator=generator)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for width in (1, 768):
            layer = TimeMoE.Linear(384, width, bias=False)
            with torch.no_grad():
                whole = layer(rows)
                for count in range(1, 40):
                    assert torch.equal(layer(rows[:count]), whole[:count]), (width, count)
    finally:
        torch.set_num_threads(threads)


def test_a_changed_weight_changes_the_forecast(tmp_path):
    """The agreement is not vacuous: the shared expert's weight changed in the folder changes the forecast."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "changed"
    shutil.copytree(FIXTURE, folder)
    state = load_file(str(folder / "model.safetensors"))
    state["model.layers.1.ffn_layer.shared_expert.down_proj.weight"] *= 1.05
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    want = REFERENCE["forecast_96_96"]
    got = forecast(ours(folder, 96, 96), REFERENCE["windows"])
    assert (got - want).abs().max() > 1e-4 * want.abs().max()


def test_bfloat16_weights_as_released_load(tmp_path):
    """The hub's folders hold bfloat16 tensors: they load into the float32 model."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "bf16"
    shutil.copytree(FIXTURE, folder)
    state = {k: v.to(torch.bfloat16) for k, v in load_file(str(folder / "model.safetensors")).items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    model = ours(folder, 96, 8)
    assert model.heads[1].weight.dtype == torch.float32
    assert torch.equal(model.heads[1].weight, state["lm_heads.1.out_layer.weight"].float())


def test_the_model_is_built_at_the_folders_sizes_and_without_one_at_configs():
    model = TimeMoE.Model(configs(FIXTURE, 96, 24))
    moe = model.layers[0].moe
    assert (len(model.layers), model.norm.weight.shape[0], model.layers[0].attention.heads, len(moe.experts),
            moe.experts[0].gate.out_features, moe.shared.gate.out_features, model.horizons) == \
        (2, 24, 2, 4, 16, 32, [1, 8, 32, 64])
    scratch = TimeMoE.Model(configs(None, 96, 24, e_layers=3))
    moe = scratch.layers[0].moe
    assert (len(scratch.layers), scratch.norm.weight.shape[0], scratch.layers[0].attention.heads, len(moe.experts),
            moe.experts[0].gate.out_features, moe.shared.gate.out_features) == (3, 16, 2, 8, 16, 32)


def test_weights_of_other_unseen_fields_are_refused_in_one_line():
    """The number of heads shows in no weight's shape: weights of 2 heads into a model of 4 are refused."""
    tuned = ours(FIXTURE, 96, 8).state_dict()
    other = TimeMoE.Model(configs(None, 96, 8, d_model=24, n_heads=4, e_layers=2))
    with pytest.raises(UserError) as refused:
        other.load_state_dict(tuned)
    assert "\n" not in str(refused.value) and "num_attention_heads 2 (this model 4)" in str(refused.value)


def test_export_writes_the_released_layout_and_reads_back(tmp_path):
    model = ours(FIXTURE, 96, 96)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    torch.save(model.state_dict(), tmp_path / "checkpoint.pth")
    export(str(tmp_path / "checkpoint.pth"), str(tmp_path / "out"), "time-moe")
    from safetensors.torch import load_file

    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    released = load_file(str(FIXTURE / "model.safetensors"))
    assert {k: v.shape for k, v in written.items()} == {k: v.shape for k, v in released.items()}
    config, fixture = (json.loads((f / "config.json").read_text()) for f in (tmp_path / "out", FIXTURE))
    shared = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "num_experts", "num_experts_per_tok", "horizon_lengths", "max_position_embeddings", "rope_theta",
              "rms_norm_eps", "router_aux_loss_factor", "model_type", "architectures", "use_dense", "input_size")
    assert {k: config[k] for k in shared} == {k: fixture[k] for k in shared}
    back = ours(tmp_path / "out", 96, 96)
    assert torch.equal(forecast(back, REFERENCE["windows"]), forecast(model, REFERENCE["windows"]))


# ------------------------------------------------------------ through run.py
EVAL = [*ETTH1_ARGS, "--model", "TimeMoE", "--seq_len", 96, "--label_len", 48, "--pred_len", 20,
        "--val_windows", 8, "--test_windows", 8, "--num_threads", 1]


@pytest.fixture(scope="module")
def etth1(tmp_path_factory):
    return write_etth1_shaped(tmp_path_factory.mktemp("etth1"))


TUNE = ["--adaptation", "--train_steps", 2, "--learning_rate", 1e-3, "--test_every_epoch", "false"]


def test_one_batch_of_8_differs_from_two_of_4_by_the_balancing_term(etth1, tmp_path):
    """The reference computes the balancing loss per batch, so one micro-batch of 8 is not two of 4: measured
    (its README states it), and with the term off (router_aux_loss_factor 0) they agree to 1e-6."""
    differences = {}
    for factor in (None, 0.0):
        folder = FIXTURE
        if factor is not None:
            folder = tmp_path / "no_aux"
            shutil.copytree(FIXTURE, folder)
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config, "router_aux_loss_factor": factor}))
        argv = [*EVAL, "--root_path", etth1, "--pretrain_model_path", folder, *TUNE, "--global_batch_size", 8]
        (_, _, one), (_, _, two) = trained_on_1_and_2_processes(tmp_path / str(factor), *argv)
        differences[factor] = max((one[k].float() - two[k].float()).abs().max().item() for k in one)
    assert differences[0.0] <= 1e-6
    assert differences[None] > 1e-5, differences


@pytest.mark.parametrize("name", ["Timer", "TimerXL"])
def test_timer_given_a_time_moe_folder_says_to_load_it_with_time_moe(name):
    """OpenLTM's Timer / Timer-XL refuse Time-MoE's release in one line that names --model TimeMoE."""
    from models import get_model_class
    from utils.arguments import parse_args

    args = parse_args(["--seq_len", "96", "--pred_len", "24", "--input_token_len", "24", "--output_token_len", "24",
                       "--d_model", "16", "--d_ff", "16"])
    args.enc_in = args.dec_in = args.c_out = 7
    with pytest.raises(UserError) as refused:
        load_weights(get_model_class(name)(args), str(FIXTURE))
    message = str(refused.value)
    assert "\n" not in message and "Time-MoE's released checkpoint (Maple728/TimeMoE-*" in message
    assert message.endswith(f"load it with --model TimeMoE, not {name}")


# ------------------------------------------------------------ its release given to OpenLTM's model (tests/test_openltm_checkpoints.py)
def test_timemoes_release_given_to_timerxl_is_named_with_model_timemoe(tmp_path):
    """Maple728/TimeMoE-*'s weights are --model TimeMoE's (this folder's adapter.py): given to TimerXL they are named and
    refused in one line that says which model reads them."""
    from models.TimerXL import Model as TimerXL
    from test_openltm_checkpoints import _hf_decoder, configs
    from utils.checkpoint import save_atomic

    save_atomic(_hf_decoder("emb_layer.weight", {"experts.0.gate_proj": (16, 8), "gate": (2, 8)}), tmp_path / "c.pth")
    with pytest.raises(UserError) as refused:
        load_weights(TimerXL(configs()), tmp_path / "c.pth")
    message = str(refused.value)
    assert "\n" not in message and "holds Time-MoE's released checkpoint (Maple728/TimeMoE-*" in message
    assert message.endswith("load it with --model TimeMoE, not TimerXL"), message
