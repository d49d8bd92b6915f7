"""OpenLTM's Timer-XL and Timer checkpoints in and out (utils/openltm.py, utils/checkpoint.py): the key
table both ways, loading through --pretrain_model_path and --checkpoint, export, and one-line refusals; a
model reads its own files and the foreign layouts it declares (checkpoint_adapters), no other.

Nothing of OpenLTM is imported: its layout is written out below as fake modules with the names and
shapes of its model code (models/timer_xl.py, models/timer.py, layers/Transformer_EncDec.py,
layers/SelfAttention_Family.py, layers/Attn_Bias.py, layers/Embed.py), independently of the table.
lab/openltm_crosscheck.py runs OpenLTM's own code against ours."""
import argparse
import json
import math

import pytest
import torch
from torch import nn

from exp.export import load_weights, main as checkpoint_main
from helpers import SMALL_TIMERXL, assert_ok, assert_one_error_line, output_args, records, run_cli
from models.foundation import export_formats
from models.Timer import Model as Timer
from models.TimerXL import Model as TimerXL
from utils import openltm
from utils.checkpoint import known_layouts, save_atomic, weights_for
from utils.errors import UserError

OURS = {"TimerXL": TimerXL, "Timer": Timer}
ADAPTER = {"TimerXL": openltm.TIMER_XL, "Timer": openltm.TIMER}
KNOWN_LAYOUTS = known_layouts(export_formats())  # the floor's and every release folder's
SHAPES = [dict(e_layers=1, n_heads=1, d_model=16, d_ff=32, input_token_len=8, output_token_len=8),
          dict(e_layers=3, n_heads=4, d_model=32, d_ff=48, input_token_len=4, output_token_len=12)]


def configs(**shape):
    base = dict(e_layers=2, n_heads=2, d_model=32, d_ff=64, input_token_len=24, output_token_len=24, dropout=0.0,
                activation="relu", covariate=False, use_norm=True)
    return argparse.Namespace(**{**base, **shape})


def ours(model, seed=0, **shape):
    """Our model with every weight random (biases and norms included, so a swapped key shows)."""
    torch.manual_seed(seed)
    built = OURS[model](configs(**shape))
    with torch.no_grad():
        for parameter in built.parameters():
            parameter.copy_(torch.randn_like(parameter))
    return built


# ------------------------------------------------------------ OpenLTM's layout, from its code
class _Projections(nn.Module):
    """layers/SelfAttention_Family.py AttentionLayer: four Linear(d_model, d_model) around inner_attention."""

    def __init__(self, d_model, inner):
        super().__init__()
        self.inner_attention = inner
        self.query_projection = nn.Linear(d_model, d_model)
        self.key_projection = nn.Linear(d_model, d_model)
        self.value_projection = nn.Linear(d_model, d_model)
        self.out_projection = nn.Linear(d_model, d_model)


class _TimeAttention(nn.Module):
    """TimeAttention: qk_proj (QueryKeyProjection / RotaryProjection) holds only non-persistent buffers;
    attn_bias is layers/Attn_Bias.py BinaryAttentionBias, an Embedding(2, num_heads)."""

    def __init__(self, n_heads):
        super().__init__()
        self.attn_bias = nn.Module()
        self.attn_bias.emb = nn.Embedding(2, n_heads)


class _Layer(nn.Module):
    """layers/Transformer_EncDec.py TimerLayer / DecoderOnlyLayer: kernel-size-1 Conv1d feed-forward."""

    def __init__(self, attention, d_model, d_ff):
        super().__init__()
        self.attention = attention
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)


class FakeOpenLTM(nn.Module):
    """OpenLTM's models/timer_xl.py (model "TimerXL") or models/timer.py ("Timer"), parameters only."""

    def __init__(self, model, c):
        super().__init__()
        self.embedding = nn.Linear(c.input_token_len, c.d_model, bias=model == "TimerXL")
        if model == "Timer":  # layers/Embed.py PositionalEmbedding: a persistent buffer of 6500 positions
            self.position_embedding = nn.Module()
            position = torch.arange(6500, dtype=torch.float32).unsqueeze(1)
            div = (torch.arange(0, c.d_model, 2).float() * -(math.log(10000.0) / c.d_model)).exp()
            pe = torch.zeros(6500, c.d_model)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
            self.position_embedding.register_buffer("pe", pe.unsqueeze(0))
        self.blocks = nn.Module()  # TimerBlock / DecoderOnly
        inner = (lambda: _TimeAttention(c.n_heads)) if model == "TimerXL" else nn.Module  # FullAttention: none
        self.blocks.attn_layers = nn.ModuleList(_Layer(_Projections(c.d_model, inner()), c.d_model, c.d_ff)
                                                for _ in range(c.e_layers))
        self.blocks.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.output_token_len)


def fake_openltm(model, seed=1, **shape):
    torch.manual_seed(seed)
    fake = FakeOpenLTM(model, configs(**shape))
    with torch.no_grad():
        for parameter in fake.parameters():
            parameter.copy_(torch.randn_like(parameter))
    return fake.state_dict()


def shapes_of(state):
    return {k: tuple(v.shape) for k, v in state.items()}


# ------------------------------------------------------------ the table
@pytest.mark.parametrize("shape", SHAPES, ids=["small", "deep"])
@pytest.mark.parametrize("model", ["TimerXL", "Timer"])
def test_round_trip_through_openltms_layout_is_exact(model, shape):
    state = ours(model, **shape).state_dict()
    there = openltm.ours_to_openltm(state, model)
    back = openltm.openltm_to_ours(there, model)
    assert list(back) == list(state) or sorted(back) == sorted(state)
    assert all(torch.equal(back[k], state[k]) for k in state)
    recognised = [layout for layout in KNOWN_LAYOUTS if layout.recognise(there, {})]
    assert recognised == [ADAPTER[model]] and not any(layout.recognise(state, {}) for layout in KNOWN_LAYOUTS)


@pytest.mark.parametrize("model", ["TimerXL", "Timer"])
def test_the_table_maps_every_key_onto_openltms_model_and_back(model):
    shape = SHAPES[1]
    mine, theirs = ours(model, **shape).state_dict(), fake_openltm(model, **shape)
    # every key of ours lands on a key OpenLTM's model has, with its shape; nothing of OpenLTM's is left out
    assert shapes_of(openltm.ours_to_openltm(mine, model)) == shapes_of(theirs)
    # and OpenLTM's file becomes exactly our keys and shapes, values moved unchanged (conv weights squeezed)
    converted = openltm.openltm_to_ours(theirs, model)
    assert shapes_of(converted) == shapes_of(mine)
    assert torch.equal(converted["blocks.layers.2.linear1.weight"], theirs["blocks.attn_layers.2.conv1.weight"][..., 0])
    assert torch.equal(converted["head.bias"], theirs["head.bias"])


def test_the_attention_projections_land_on_their_namesakes():
    """Swapping two rows of the table (query / key, say) keeps every key and shape: check values."""
    for model, ours_name in (("TimerXL", "attention.{}_projection"), ("Timer", "attention.causal.{}")):
        theirs = fake_openltm(model, **SHAPES[1])
        converted = openltm.openltm_to_ours(theirs, model)
        for name in ("query", "key", "value", "out"):
            assert torch.equal(converted[f"blocks.layers.1.{ours_name.format(name)}.weight"],
                               theirs[f"blocks.attn_layers.1.attention.{name}_projection.weight"]), (model, name)
        for part in ("norm1", "norm2"):
            assert torch.equal(converted[f"blocks.layers.1.{part}.bias"], theirs[f"blocks.attn_layers.1.{part}.bias"])
    assert torch.equal(openltm.openltm_to_ours(theirs, "Timer")["blocks.layers.0.linear2.weight"],
                       theirs["blocks.attn_layers.0.conv2.weight"][..., 0])


@pytest.mark.parametrize("model", ["TimerXL", "Timer"])
def test_an_openltm_file_loads_strictly_and_forecasts_as_our_own_file(tmp_path, model):
    theirs = fake_openltm(model, **SHAPES[0])
    save_atomic(theirs, tmp_path / "openltm.pth")
    loaded = load_weights(OURS[model](configs(**SHAPES[0])), tmp_path / "openltm.pth").eval()
    save_atomic(loaded.state_dict(), tmp_path / "ours.pth")
    again = load_weights(OURS[model](configs(**SHAPES[0])), tmp_path / "ours.pth").eval()
    x = torch.randn(2, 32, 3)
    with torch.no_grad():
        assert torch.equal(loaded(x), again(x))
    fresh = OURS[model](configs(**SHAPES[0]))
    assert weights_for(fresh, tmp_path / "openltm.pth")[1] is ADAPTER[model]
    assert weights_for(fresh, tmp_path / "ours.pth")[1] is None


def test_none_of_our_models_is_taken_for_a_foreign_layout():
    from models import available_models, get_model_class
    from utils.arguments import parse_args

    args = parse_args(["--seq_len", "96", "--pred_len", "24", "--input_token_len", "24", "--output_token_len", "24",
                       "--d_model", "16", "--d_ff", "16", "--n_heads", "4"])  # head size 4: rotary pairs of half a head
    args.enc_in = args.dec_in = args.c_out = 3
    args.mark_dim = 4  # derived from the data in a run
    for name in available_models():
        state = get_model_class(name)(args).state_dict()
        assert not [layout.what for layout in KNOWN_LAYOUTS if layout.recognise(state, {})], name
        assert openltm.our_model_of(state) == (name if name in OURS else None), name


# ------------------------------------------------------------ what OpenLTM's Timer-XL computes
def openltm_time_attention(attention, x, n_vars, n_tokens):
    """OpenLTM's TimeAttention (layers/SelfAttention_Family.py, the default non-flash path) written out:
    rotary positions over the flattened token index on the first half of each head (interleaved pairs),
    softmax(scale * (q.k + bias)) under TimerMultivariateMask / TimerCovariateMask."""
    batch, seq, d_model = x.shape
    heads, dim = attention.n_heads, d_model // attention.n_heads
    q, k, v = (layer(x).view(batch, seq, heads, dim).transpose(1, 2) for layer in
               (attention.query_projection, attention.key_projection, attention.value_projection))
    width = dim // 2
    theta = 1.0 / 10000 ** (torch.arange(0, width, 2).float() / width)
    angle = (torch.arange(seq).float()[:, None] * theta).repeat_interleave(2, dim=-1)

    def rotate(t):
        part, rest = t[..., :width], t[..., width:]
        turned = torch.stack((-part[..., 1::2], part[..., 0::2]), dim=-1).flatten(-2)
        return torch.cat((part * angle.cos() + turned * angle.sin(), rest), dim=-1)

    variable = torch.arange(seq) // n_tokens
    same = variable[:, None] == variable[None, :]
    emb = attention.variable_bias.emb.weight  # [2, heads]: row 0 different variables, row 1 the same
    bias = torch.where(same, emb[1][:, None, None], emb[0][:, None, None])
    later = torch.triu(torch.ones(n_tokens, n_tokens, dtype=torch.bool), 1)
    if attention.covariate:
        blocked = ~torch.kron(torch.eye(n_vars, dtype=torch.bool), ~later)
        blocked[-n_tokens:, :-n_tokens] = False
    else:
        blocked = torch.kron(torch.ones(n_vars, n_vars, dtype=torch.bool), later)
    scores = (rotate(q) @ rotate(k).transpose(-1, -2) + bias).masked_fill(blocked, float("-inf"))
    out = torch.softmax(scores / math.sqrt(dim), dim=-1) @ v
    return attention.out_projection(out.transpose(1, 2).reshape(batch, seq, d_model))


@pytest.mark.parametrize("covariate", [False, True])
def test_openltm_attention_is_openltms_formula_and_the_papers_on_one_variable(covariate):
    from layers.attention import TimeAttention

    torch.manual_seed(0)
    paper = TimeAttention(32, 2, covariate=covariate)
    with torch.no_grad():
        paper.variable_bias.emb.weight.mul_(3)  # a bias large enough to matter
    theirs = TimeAttention(32, 2, covariate=covariate, kind="openltm")
    theirs.load_state_dict(paper.state_dict())
    x = torch.randn(2, 3 * 5, 32)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x, 3, 5), openltm_time_attention(theirs, x, 3, 5), atol=1e-5, rtol=1e-5)
        assert (theirs(x, 3, 5) - paper(x, 3, 5)).abs().max() > 1e-2  # several variables: another function
        one = x[:, :5]
        torch.testing.assert_close(theirs(one, 1, 5), paper(one, 1, 5), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------ run.py: --pretrain_model_path and --checkpoint
RUN = [*SMALL_TIMERXL, "--input_token_len", 24, "--output_token_len", 24, "--seq_len", 48, "--pred_len", 24,
       "--features", "S", "--synthetic_rows", 800, "--num_threads", 1, "--dropout", 0]


def _same_weights_two_layouts(tmp_path):
    model = TimerXL(configs(e_layers=1, n_heads=2, d_model=32, d_ff=64))
    save_atomic(model.state_dict(), tmp_path / "ours.pth")
    save_atomic(openltm.ours_to_openltm(model.state_dict(), "TimerXL"), tmp_path / "openltm.pth")
    return tmp_path / "ours.pth", tmp_path / "openltm.pth"


def test_run_py_evaluates_and_fine_tunes_from_an_openltm_file_as_from_ours(tmp_path):
    mine, theirs = _same_weights_two_layouts(tmp_path)
    for path in (mine, theirs):
        assert_ok(run_cli(tmp_path, *RUN, "--is_training", 0, "--checkpoint", path))
    a, b = records(tmp_path)
    assert a["mse"] == b["mse"] and a["mae"] == b["mae"] and a["vali_loss"] == b["vali_loss"]
    tuned = run_cli(tmp_path, *RUN, "--train_epochs", 1, "--train_steps", 2, "--model_id", "openltm",
                    "--adaptation", "--pretrain_model_path", theirs)
    assert_ok(tuned)
    assert f"fine-tuning from {theirs}" in tuned.stdout
    assert_ok(run_cli(tmp_path, *RUN, "--train_epochs", 1, "--train_steps", 2, "--model_id", "ours",
                      "--adaptation", "--pretrain_model_path", mine))
    from_theirs, from_mine = records(tmp_path)[-2:]

    def losses(record):
        return [{k: v for k, v in epoch.items() if k != "seconds"} for epoch in record["history"]]

    assert from_theirs["mse"] == from_mine["mse"] and losses(from_theirs) == losses(from_mine)


def test_run_py_refuses_a_mismatched_openltm_file_in_one_line(tmp_path):
    theirs = fake_openltm("TimerXL", e_layers=2, n_heads=2, d_model=32, d_ff=128, input_token_len=24,
                          output_token_len=24)
    save_atomic(theirs, tmp_path / "openltm.pth")
    proc = run_cli(tmp_path, *RUN, "--is_training", 0, "--checkpoint", tmp_path / "openltm.pth")
    assert_one_error_line(proc, "(OpenLTM's Timer-XL (models/timer_xl.py), converted) does not fit model TimerXL: "
                                "unexpected: blocks.layers.1.")
    assert "the file has e_layers 2, d_ff 128 where the model has e_layers 1, d_ff 64" in proc.stderr


# ------------------------------------------------------------ refusals
def test_a_mismatched_openltm_file_names_keys_and_shapes_in_one_line(tmp_path):
    save_atomic(fake_openltm("TimerXL", **SHAPES[0]), tmp_path / "openltm.pth")
    with pytest.raises(UserError) as refused:
        load_weights(TimerXL(configs(**{**SHAPES[0], "e_layers": 2, "d_ff": 64})), tmp_path / "openltm.pth")
    message = str(refused.value)
    assert "\n" not in message
    assert "(OpenLTM's Timer-XL (models/timer_xl.py), converted) does not fit model TimerXL: missing: " \
           "blocks.layers.1." in message
    assert "mis-shaped: blocks.layers.0.linear1.bias (file (32,), model (64,))" in message
    assert "the file has e_layers 1, d_ff 32 where the model has e_layers 2, d_ff 64" in message
    save_atomic(fake_openltm("Timer", **SHAPES[0]), tmp_path / "timer.pth")
    with pytest.raises(UserError, match=r"holds OpenLTM's Timer \(models/timer.py\) weights: load it with "
                                        r"--model Timer, not TimerXL$"):
        load_weights(TimerXL(configs(**SHAPES[0])), tmp_path / "timer.pth")


def _hf_decoder(prefix_embedding, ffn):
    """A Hugging Face decoder in the layout thuml's and Maple728's released decoders share
    (model.embed_layer, model.layers.N.self_attn / ffn_layer, model.norm, lm_heads.N)."""
    state = {f"model.embed_layer.{prefix_embedding}": torch.zeros(8, 4), "model.norm.weight": torch.ones(8),
             "lm_heads.0.weight": torch.zeros(4, 8)}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        state[f"model.layers.0.self_attn.{name}.weight"] = torch.zeros(8, 8)
    for name, shape in ffn.items():
        state[f"model.layers.0.ffn_layer.{name}.weight"] = torch.zeros(shape)
    return state


LACKING = {
    "moirai": ({"encoder.attn_layers.0.attention.inner_attention.attn_bias.emb.weight": torch.zeros(2, 2),
                "embedding.weight": torch.zeros(8, 4)}, "OpenLTM's Moirai"),
    "ttm": ({"backbone.patcher.weight": torch.zeros(8, 4)}, "OpenLTM's TTM"),
    "gpt4ts": ({"gpt2.h.0.attn.c_attn.weight": torch.zeros(8, 24), "in_layer.weight": torch.zeros(8, 4)},
               "OpenLTM's GPT4TS"),
}


@pytest.mark.parametrize("name", sorted(LACKING))
def test_a_model_we_do_not_have_is_refused_in_one_line(tmp_path, name):
    state, what = LACKING[name]
    save_atomic(state, tmp_path / "c.pth")
    with pytest.raises(UserError) as refused:
        load_weights(TimerXL(configs()), tmp_path / "c.pth")
    message = str(refused.value)
    assert "\n" not in message and what in message and "which this codebase cannot load" in message, message


def test_run_py_refuses_a_model_we_lack_in_one_line(tmp_path):
    save_atomic(LACKING["ttm"][0], tmp_path / "ttm.pth")
    proc = run_cli(tmp_path, *RUN, "--train_epochs", 1, "--adaptation", "--pretrain_model_path",
                   tmp_path / "ttm.pth")
    assert_one_error_line(proc, "cannot fine-tune from --pretrain_model_path: checkpoint ")
    assert "holds OpenLTM's TTM" in proc.stderr and not (tmp_path / "results" / "results.jsonl").exists()


# ------------------------------------------------------------ safetensors and Hugging Face folders
def test_openltm_and_our_weights_load_from_safetensors_files_and_folders(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    theirs = fake_openltm("TimerXL", **SHAPES[0])
    safetensors.save_file(theirs, str(tmp_path / "timer_xl.safetensors"))
    (tmp_path / "folder").mkdir()
    safetensors.save_file(theirs, str(tmp_path / "folder" / "model.safetensors"))
    for path in (tmp_path / "timer_xl.safetensors", tmp_path / "folder"):
        loaded = load_weights(TimerXL(configs(**SHAPES[0])), path).state_dict()
        assert all(torch.equal(v, openltm.openltm_to_ours(theirs, "TimerXL")[k]) for k, v in loaded.items())


# ------------------------------------------------------------ export
def test_export_writes_openltms_layout_and_back(tmp_path, capsys):
    model = ours("Timer", **SHAPES[1])
    save_atomic({"module." + k: v for k, v in model.state_dict().items()}, tmp_path / "ours.pth")  # a DDP save
    assert checkpoint_main(["export", "--to", "openltm", str(tmp_path / "ours.pth"), str(tmp_path / "o.pth")]) == 0
    assert "our Timer weights in the layout of OpenLTM's Timer (models/timer.py)" in capsys.readouterr().out
    written = torch.load(tmp_path / "o.pth", weights_only=True)
    assert shapes_of(written) == shapes_of(fake_openltm("Timer", **SHAPES[1]))
    checkpoint_main(["export", "--to", "ours", str(tmp_path / "o.pth"), str(tmp_path / "back.pth")])
    back = torch.load(tmp_path / "back.pth", weights_only=True)
    assert sorted(back) == sorted(model.state_dict())
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())
    save_atomic({"Linear_Seasonal.weight": torch.zeros(2, 2)}, tmp_path / "dlinear.pth")
    with pytest.raises(UserError, match="not a TimerXL or Timer checkpoint"):
        checkpoint_main(["export", "--to", "openltm", str(tmp_path / "dlinear.pth"), str(tmp_path / "x.pth")])


@pytest.mark.filterwarnings("ignore:'exp.export' found in sys.modules")  # runpy: run as `python -m` runs it
@pytest.mark.parametrize("where", ["an existing folder", "under a file"])
def test_export_to_a_path_it_cannot_write_says_so_in_one_line(tmp_path, capsys, monkeypatch, where):
    """`python -m exp.export export SRC DST` with DST a folder, or a path no file can take: exit 2,
    one `error:` line, nothing written (it was an IsADirectoryError traceback)."""
    import runpy
    import sys

    save_atomic(ours("Timer", **SHAPES[0]).state_dict(), tmp_path / "ours.pth")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "kept.txt").write_text("mine")
    dst = tmp_path / "out" if where == "an existing folder" else tmp_path / "out" / "kept.txt" / "o.pth"
    monkeypatch.setattr(sys, "argv", ["checkpoint", "export", "--to", "openltm", str(tmp_path / "ours.pth"), str(dst)])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module("exp.export", run_name="__main__")
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == ""
    expected = (f"error: {dst} is a folder: name the file to write, e.g. {dst / 'checkpoint.pth'}"
                if where == "an existing folder" else f"error: cannot write {dst} (")
    assert err.startswith(expected) and err.count("\n") == 1, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["kept.txt"]
    assert (tmp_path / "out" / "kept.txt").read_text() == "mine"


# ------------------------------------------------------------ the layouts a model reads are its own declaration
class InformerLike(nn.Module):
    """A user's model named as TSLib's Transformer, Informer, Autoformer, FEDformer and Non-stationary
    Transformer name their encoders: `encoder.attn_layers.N.attention.query_projection`, which is also
    OpenLTM's Timer before 2024-11-04. It declares no foreign layout."""
    inputs_used = ("x_enc",)

    def __init__(self, configs):
        super().__init__()
        d_model = configs.d_model
        self.value_embedding = nn.Linear(configs.seq_len, d_model)
        self.encoder = nn.Module()
        self.encoder.attn_layers = nn.ModuleList()
        for _ in range(configs.e_layers):
            layer = nn.Module()
            layer.attention = nn.Module()
            for name in ("query", "key", "value", "out"):
                setattr(layer.attention, f"{name}_projection", nn.Linear(d_model, d_model))
            self.encoder.attn_layers.append(layer)
        self.encoder.norm = nn.LayerNorm(d_model)
        self.projection = nn.Linear(d_model, configs.pred_len)

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        tokens = self.value_embedding(x_enc.transpose(1, 2))  # [B, C, D]: one token per channel
        for layer in self.encoder.attn_layers:
            a = layer.attention
            weights = torch.softmax(a.query_projection(tokens) @ a.key_projection(tokens).transpose(1, 2)
                                    / math.sqrt(tokens.shape[-1]), dim=-1)
            tokens = tokens + a.out_projection(weights @ a.value_projection(tokens))
        return self.projection(self.encoder.norm(tokens)).transpose(1, 2)  # [B, pred_len, C]


def run_main(monkeypatch, *argv, model=InformerLike):
    """run.py's main in this process; `--model InformerLike` is `model`, as the contract builds a file's model
    (model None: the registry's)."""
    import run

    monkeypatch.setattr(run, "configure_logging", lambda quiet=False: None)  # keep the tsl logger as tests find it
    if model is not None:
        monkeypatch.setattr("exp.settings.get_model_class", lambda name: model)
    return run.main(list(map(str, argv)))


USER_RUN = ["--model", "InformerLike", "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--d_model", 16,
            "--e_layers", 2, "--synthetic_rows", 800, "--synthetic_channels", 3, "--num_threads", 1, "--no_plots",
            "--quiet"]


def test_a_user_model_named_like_openltms_old_timer_reloads_its_own_checkpoint(tmp_path, monkeypatch, capsys):
    """Its own checkpoint.pth was refused as "OpenLTM's Timer from before 2024-11-04": every file was
    matched against OpenLTM's layouts whatever the model. Now a file with the model's keys is the model's."""
    assert run_main(monkeypatch, *USER_RUN, "--train_epochs", 1, *output_args(tmp_path)) == 0
    trained = records(tmp_path)[-1]
    weights = tmp_path / "checkpoints" / trained["setting"] / "checkpoint.pth"
    assert "encoder.attn_layers.1.attention.query_projection.weight" in torch.load(weights, weights_only=True)
    capsys.readouterr()
    assert run_main(monkeypatch, *USER_RUN, "--is_training", 0, "--checkpoint", weights, *output_args(tmp_path)) == 0, \
        capsys.readouterr().err
    evaluated = records(tmp_path)[-1]
    assert evaluated["mse"] == trained["mse"] and evaluated["mae"] == trained["mae"]
    # its own file under another depth is named key by key, not taken for OpenLTM's old Timer
    deeper = argparse.Namespace(seq_len=48, pred_len=24, d_model=16, e_layers=3)
    with pytest.raises(UserError) as refused:
        load_weights(InformerLike(deeper), weights)
    assert "does not fit model test_openltm_checkpoints: missing: encoder.attn_layers.2." in str(refused.value)
    assert "OpenLTM" not in str(refused.value)


class DeclaresTimerXL(TimerXL):
    """A user's model in our TimerXL's layout that declares OpenLTM's Timer-XL adapter."""
    checkpoint_adapters = (openltm.TIMER_XL,)


class DeclaresNothing(TimerXL):
    checkpoint_adapters = ()


def test_a_model_reads_the_foreign_layouts_it_declares_and_no_other(tmp_path):
    theirs = fake_openltm("TimerXL", **SHAPES[0])
    save_atomic(theirs, tmp_path / "openltm.pth")
    loaded = load_weights(DeclaresTimerXL(configs(**SHAPES[0])), tmp_path / "openltm.pth").state_dict()
    assert all(torch.equal(v, openltm.openltm_to_ours(theirs, "TimerXL")[k]) for k, v in loaded.items())
    with pytest.raises(UserError, match=r"holds OpenLTM's Timer-XL \(models/timer_xl.py\) weights: load it with "
                                        r"--model TimerXL, not test_openltm_checkpoints$"):
        load_weights(DeclaresNothing(configs(**SHAPES[0])), tmp_path / "openltm.pth")
    assert TimerXL.checkpoint_adapters == (openltm.TIMER_XL,) and Timer.checkpoint_adapters == (openltm.TIMER,)
    # every adapter that export writes with is declared by the model it names
    from models import get_model_class
    assert all(adapter in get_model_class(adapter.model).checkpoint_adapters for adapter in openltm.ADAPTERS)


def test_an_openltm_timer_xl_file_given_to_dlinear_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    save_atomic(fake_openltm("TimerXL", **SHAPES[0]), tmp_path / "openltm.pth")
    argv = [*USER_RUN[2:], "--model", "DLinear", "--is_training", 0, "--checkpoint", tmp_path / "openltm.pth",
            *output_args(tmp_path)]
    assert run_main(monkeypatch, *argv, model=None) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: checkpoint "), err
    assert ("holds OpenLTM's Timer-XL (models/timer_xl.py) weights: load it with --model TimerXL, not DLinear"
            in err), err


def with_format_version(path, version):
    """`path` rewritten as a newer torch would write it: the archive's version record (<archive>/version)
    says `version`, everything else as torch.save wrote it."""
    import zipfile

    entries = [(info, zipfile.ZipFile(path).read(info.filename)) for info in zipfile.ZipFile(path).infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for info, data in entries:
            archive.writestr(info, f"{version}\n".encode() if info.filename.endswith("/version") else data)
    return path


def test_a_checkpoint_of_a_newer_torch_is_called_so_not_corrupt(tmp_path):
    """A file whose format version is past this torch's reads as what it is: whole, and for a newer torch (it
    was 'truncated, corrupt or not a PyTorch weights file ... Re-train')."""
    model = ours("TimerXL")
    path = with_format_version(save_atomic(model.state_dict(), str(tmp_path / "checkpoint.pth")), 99)
    with pytest.raises(UserError) as refused:
        load_weights(ours("TimerXL", seed=1), path)
    line = str(refused.value)
    assert line.startswith(f"cannot read checkpoint {path}: it was written by a newer PyTorch (file format version 99; "
                           f"torch {torch.__version__} here reads up to version ")
    assert "upgrade PyTorch here (pip install -U torch)" in line and "corrupt" not in line
    assert "\n" not in line
    (tmp_path / "cut.pth").write_bytes((tmp_path / "checkpoint.pth").read_bytes()[:300])  # a cut file stays one
    with pytest.raises(UserError, match="it is truncated, corrupt or not a PyTorch weights file"):
        load_weights(ours("TimerXL"), str(tmp_path / "cut.pth"))


def test_the_weights_loaded_are_named_by_their_files_sha256_and_where_training_saved_them(tmp_path):
    """What a test's record names as its weights (utils.checkpoint.loaded_weights): a release folder's weights
    file (zero-shot), or a training state's weights with its own epoch and step."""
    import hashlib
    import os

    from test_foundation import RELEASES, fixture, ours as release_model
    from utils.checkpoint import loaded_weights

    row = next(row for row in RELEASES.values() if not row.package)  # a release with a committed fixture
    folder = fixture(row.folder)
    release_model(row, folder, row.run[1], row.run[3])
    release = os.path.join(str(folder), "model.safetensors")
    assert loaded_weights() == {"path": str(folder), "file": release, "epoch": None, "step": None,
                                "sha256": hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()}
    assert loaded_weights() is None  # named once, by the record of the test that loaded them
    mid_epoch = {"model": ours("TimerXL").state_dict(), "epoch": 2, "global_step": 40,
                 "position": {"epoch": 3, "global_windows": 96, "end_of_epoch": False}}
    torch.save(mid_epoch, tmp_path / "last.pth")
    load_weights(ours("TimerXL", seed=1), str(tmp_path / "last.pth"))
    loaded = loaded_weights()
    assert (loaded["epoch"], loaded["step"]) == (3, 40)
    assert loaded["sha256"] == hashlib.sha256((tmp_path / "last.pth").read_bytes()).hexdigest()


def test_export_to_a_full_disk_says_so_in_one_line(tmp_path):
    """A release folder exported where the disk fills (RLIMIT_FSIZE: files may grow to 100 kB, model.safetensors
    is 236 kB): exit 2 and one line (safetensors' own SafetensorError was a traceback)."""
    import subprocess
    import sys

    from helpers import REPO, repo_first_env, subprocess_env

    from test_foundation import RELEASES, fixture

    # the committed release fixture with the largest weights file, its export's layout
    row = max((row for row in RELEASES.values() if not row.package),
              key=lambda row: (fixture(row.folder) / "model.safetensors").stat().st_size)
    release = fixture(row.folder)
    assert (release / "model.safetensors").stat().st_size > 200_000  # past the 100 kB the child may write
    child = ("import resource, runpy, signal\n"
             "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"  # then a write past the limit fails with EFBIG
             "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))\n"
             "runpy.run_module('exp.export', run_name='__main__', alter_sys=True)\n")  # python -m exp.export
    proc = subprocess.run([sys.executable, "-c", child, "export", "--to", row.export_to, str(release), str(tmp_path / "out")],
                          cwd=REPO, env=repo_first_env(subprocess_env()), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: cannot write {tmp_path / 'out'} (") and proc.stderr.count("\n") == 1, proc.stderr
    assert "File too large" in proc.stderr and proc.stderr.rstrip().endswith("free space, choose another path or fix "
                                                                             "its folder's permissions")
