"""LoRA through peft (exp.lora, --lora_rank): adapters on a zoo model's and a release's attention and MLP projections,
the base weights frozen, the adapters' dropout keyed by the sample, so the same global batch trains the same
adapters on 1, 2 and 3 processes; --lora_targets that match nothing is one line; a checkpoint holds its base
weights' hash and its adapters, not the base weights, and a resume or an evaluation on other base weights is refused
on every rank, nothing written; `python -m exp.export export --base` merges the adapters into the base (peft's merge)
and writes the release's layout, which its package reads and predicts from as our merged model does; a model file
dropped in as TSLib ships it trains the same adapters on 1 and 2 processes."""
import shutil

import pytest
import torch

from helpers import assert_ok, assert_one_error_line, make_args, records, run_cli

pytest.importorskip("peft", reason="peft (the lora extra) is not installed")

TINY = ("--d_model", 16, "--n_heads", 2, "--d_ff", 16, "--e_layers", 1, "--seq_len", 48, "--pred_len", 24,
        "--synthetic_rows", 400)
TRAIN = ("--train_steps", 3, "--global_batch_size", 12, "--learning_rate", 1e-2, "--test_every_epoch", "false")


def _built(*argv):
    from exp.settings import build_model, resolve_args

    args = make_args(*map(str, argv))
    resolve_args(args, 1)
    return args, build_model(args)


def test_default_targets_are_the_projections_and_only_adapters_train():
    from exp.lora import apply_lora

    args, model = _built("--model", "PatchTST", *TINY, "--lora_rank", 4)
    wrapped = apply_lora(model, args)
    trainable = [name for name, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    adapted = {n.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for n in trainable}
    assert {"query", "key", "value", "out", "linear1", "linear2"} <= adapted and "linear" not in adapted
    # a model of linear maps only (DLinear) adapts every nn.Linear
    args, model = _built("--model", "DLinear", *TINY, "--lora_rank", 2)
    adapted = {n.split(".lora_")[0] for n, p in apply_lora(model, args).named_parameters() if p.requires_grad}
    assert adapted == {"Linear_Seasonal", "Linear_Trend"}


def test_targets_that_match_no_module_are_one_line(tmp_path):
    proc = run_cli(tmp_path, "--model", "PatchTST", *TINY, *TRAIN, "--lora_rank", 4, "--lora_targets", "attn*", "q")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--lora_targets attn* q matches no nn.Linear module" in lines[0], proc.stderr
    assert "query" in lines[0]  # names to choose from
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").rglob("*.pth"))


def test_lora_options_without_a_rank_are_one_line(tmp_path):
    proc = run_cli(tmp_path, "--model", "DLinear", *TINY, *TRAIN, "--lora_dropout", 0.1)
    assert proc.returncode == 2 and "--lora_dropout without --lora_rank" in proc.stderr, proc.stderr


@pytest.mark.parametrize("nproc", [None, 2])
def test_a_model_that_never_reaches_its_adapters_is_one_line(tmp_path, nproc):
    """DLinear forecasts from its layers' weights (one linear map over time), not through the layers: adapters on
    them would train nothing, and the run says so at its first forward on every rank, no checkpoint written."""
    proc = run_cli(tmp_path, "--model", "DLinear", *TINY, *TRAIN, "--lora_rank", 2, *(("--ddp",) if nproc else ()),
                   nproc=nproc)
    assert_one_error_line(proc, "--lora_rank: model DLinear computes its forecast from its nn.Linear modules' weights")
    assert not any(tmp_path.rglob("*.pth"))


def test_the_base_hash_is_of_names_shapes_and_values_whatever_the_order_or_the_float_width():
    """A bf16 release file loaded into an fp32 model has the file's identity (export hashes the file, the run the
    model); one value's last bit, a name or a shape changes it."""
    from exp.lora import base_weights_hash

    weights = {"w": torch.randn(3, 5).bfloat16(), "b": torch.randn(5, dtype=torch.float64), "i": torch.arange(4)}
    same = base_weights_hash(weights)
    assert base_weights_hash(dict(reversed(weights.items()))) == same
    assert base_weights_hash(dict(weights, w=weights["w"].float())) == same
    one_bit = weights["w"].float().clone()
    one_bit.view(torch.int32)[0, 0] ^= 1
    assert base_weights_hash(dict(weights, w=one_bit)) != same
    assert base_weights_hash({"v" if k == "w" else k: v for k, v in weights.items()}) != same
    assert base_weights_hash(dict(weights, w=weights["w"].reshape(5, 3))) != same


def _adapters_on(tmp_path, argv, extra=()):
    """Each world size's checkpoint.pth after training `argv` on 1, 2 and 3 processes, and 1's record."""
    states, first = [], None
    for nproc in (None, 2, 3):
        out = tmp_path / f"nproc{nproc or 1}"
        assert_ok(run_cli(out, *argv, *(("--ddp",) if nproc else extra), nproc=nproc))
        record = records(out)[-1]
        first = first or record
        states.append(torch.load(out / "checkpoints" / record["setting"] / "checkpoint.pth", weights_only=True))
    return states, first


def _assert_same_adapters(states, record, initial=None):
    from exp.lora import BASE_KEY, base_weights_hash

    one = states[0]
    adapters = [k for k in one if ".lora_A." in k or ".lora_B." in k]
    assert adapters and all(set(s) == set(one) for s in states)
    assert max(float(one[k].abs().max()) for k in adapters if ".lora_B." in k) > 1e-6, "the adapters did not train"
    for state in states[1:]:
        for key in one:
            assert torch.allclose(state[key].double(), one[key].double(), rtol=0, atol=1e-6), key
    if initial is not None:  # the adapters, their base's identity and the buffers: no base weight
        base = {name for name, _ in initial.named_parameters(remove_duplicate=False)}
        held = {key.replace(".base_layer.", ".") for key in one}
        assert not held & base, sorted(held & base)[:5]
        assert bytes(one[BASE_KEY].tolist()).hex() == base_weights_hash(initial)
    keyed = {n: ok for n, ok in record["dropout_keyed"].items() if ".lora_dropout." in n}
    assert keyed and all(keyed.values()), record["dropout_keyed"]


def test_the_same_global_batch_trains_the_same_adapters_on_1_2_3_processes(tmp_path):
    # TimerXL: batch-first layers (a token-major model such as iTransformer feeds its projections [N, B, d],
    # whose adapter dropout cannot follow the sample: the run says so); PatchTST's BatchNorm would differ anyway
    argv = ("--model", "TimerXL", *TINY, "--input_token_len", 24, "--output_token_len", 24, *TRAIN, "--lora_rank", 4,
            "--lora_dropout", 0.3, "--dropout", 0.1)
    states, record = _adapters_on(tmp_path, argv)
    _assert_same_adapters(states, record)
    # --is_training 0 evaluates the checkpoint under the same --lora_* arguments: the training run's scores
    checkpoint = tmp_path / "nproc1" / "checkpoints" / record["setting"] / "checkpoint.pth"
    assert_ok(run_cli(tmp_path / "eval", *argv, "--is_training", 0, "--checkpoint", checkpoint))
    assert records(tmp_path / "eval")[-1]["mse"] == pytest.approx(record["mse"], rel=1e-9)
    # outside run.py: load_trained_model builds the base as the run did and loads the adapters on it
    from exp.settings import load_trained_model

    (metrics,) = (tmp_path / "nproc1").rglob("metrics.json")
    loaded = load_trained_model(metrics).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in states[0].items() if ".lora_" in k)


def _lora_rows():
    from test_foundation import RELEASES

    return [name for name, row in RELEASES.items() if "lora" in row.checks]


LORA_RUN = ("--lora_rank", 4, "--lora_dropout", 0.2)


@pytest.fixture(scope="module", params=_lora_rows())
def release_tuned(request, tmp_path_factory):
    """A release's fixture folder LoRA fine-tuned on 1, 2 and 3 processes (one global batch): its row, folder,
    each run's checkpoint.pth and the first run's record and checkpoint path."""
    from test_foundation import RELEASES, needs, released_folder, run_args, write_etth1_shaped

    row = needs(RELEASES[request.param])
    tmp_path = tmp_path_factory.mktemp(f"lora_{row.folder}")
    folder = released_folder(row, tmp_path / "release")
    # 1e-3 as the release's fine-tuning test: Adam's first steps move a weight by about the rate whatever the size
    # of its gradient, a near-zero gradient's rounding residue too
    argv = (*run_args(row, write_etth1_shaped(tmp_path / "etth1"), folder), "--adaptation", "--train_steps", 2,
            "--global_batch_size", 12, "--learning_rate", 1e-3, "--test_every_epoch", "false", *LORA_RUN)
    states, record = _adapters_on(tmp_path, argv)
    checkpoint = tmp_path / "nproc1" / "checkpoints" / record["setting"] / "checkpoint.pth"
    return row, folder, states, record, checkpoint


def test_a_release_trains_the_same_adapters_on_1_2_3_processes(release_tuned):
    from test_foundation import ours

    row, folder, states, record, _ = release_tuned
    _assert_same_adapters(states, record, ours(row, folder, row.run[1], row.run[3]))


def _lora_model(row, folder, checkpoint):
    """Our model of `row` on `folder` with the run's adapters from `checkpoint`, as --is_training 0 builds it."""
    from exp.export import load_weights
    from exp.lora import apply_lora
    from test_foundation import ours

    args = make_args(*map(str, ("--model", row.name, "--seq_len", row.run[1], "--pred_len", row.run[3], *LORA_RUN)))
    return load_weights(apply_lora(ours(row, folder, row.run[1], row.run[3]), args), str(checkpoint)).eval()


def _relative(a, b):
    """The largest difference of forecasts [B, T, C, Q], relative to each series' (window's, channel's) largest
    forecast value: merging rounds the weights, which moves a near-zero quantile by the rounding of its scale."""
    return float(((a - b).abs().amax(dim=(1, 3)) / b.abs().amax(dim=(1, 3)).clamp_min(1e-6)).max())


def test_a_release_exports_merged_and_its_package_predicts_as_our_merged_model(release_tuned, tmp_path):
    from exp.export import export
    from exp.lora import merge_and_unload
    from test_foundation import ours, own_tests

    row, folder, _, _, checkpoint = release_tuned
    exported = tmp_path / "exported" / row.dirname
    export(str(checkpoint), str(exported), row.export_to, base=str(folder))
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(6, row.run[1], 3, generator=generator).cumsum(1) + 10 * torch.rand(6, 1, 3, generator=generator)
    lora = _lora_model(row, folder, checkpoint)
    with torch.no_grad():
        with_adapters = lora(x)
        merged = merge_and_unload(lora)(x)  # peft's merge of our model's own layers
        back = ours(row, exported, row.run[1], row.run[3])(x)  # ours, read from the export
        base = ours(row, folder, row.run[1], row.run[3])(x)
    assert _relative(merged, with_adapters) <= 1e-5 and _relative(back, with_adapters) <= 1e-5
    if row.package:  # installed (needs): the package reads the export (a native release's: its crosscheck.py)
        package = own_tests(row).zero_shot_quantiles(exported, x, row.run[3], None)
        assert _relative(package, merged) <= 1e-5
    assert _relative(with_adapters, base) > 1e-4, "the adapters change too little for the checks above to see them"


def test_export_of_a_lora_checkpoint_without_its_base_is_one_line(release_tuned, tmp_path):
    """No --base, one its adapters were not trained on (the folder with one weight changed, in the place of the
    run's --pretrain_model_path), or none there: refused in one line, exit code 2, nothing written."""
    import subprocess
    import sys

    from helpers import REPO, repo_first_env, subprocess_env
    from test_foundation import released_folder

    row, folder, _, _, checkpoint = release_tuned
    other = released_folder(row, tmp_path / "other")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(other / "model.safetensors"))
    first = sorted(tensors)[0]
    tensors[first] = tensors[first] + 1e-3
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    before = _files(tmp_path)
    cases = {(): "is a LoRA checkpoint: its adapters without the base weights they were trained on",
             ("--base", other): "is not the base weights the LoRA adapters of",
             ("--base", tmp_path / "nowhere"): "not found: pass the folder or file the run fine-tuned from"}
    for extra, message in cases.items():
        proc = subprocess.run([sys.executable, "-m", "exp.export", "export", "--to", row.export_to, *map(str, extra),
                               str(checkpoint), str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True,
                              env=repo_first_env(subprocess_env()), timeout=120)
        assert_one_error_line(proc, message)
    assert _files(tmp_path) == before and not (tmp_path / "out").exists()


def _files(folder):
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_checkpoint_on_other_base_weights_is_refused_on_every_rank(tmp_path):
    from exp.settings import build_model

    model = ("--model", "TimerXL", *TINY, "--input_token_len", 24, "--output_token_len", 24)
    bases = []
    for seed in (1, 2):  # two pre-trained bases of the same shape
        torch.manual_seed(seed)
        bases.append(tmp_path / f"base{seed}.pth")
        torch.save(_built(*model)[1].state_dict(), bases[-1])
    base = tmp_path / "base.pth"
    shutil.copy(bases[0], base)
    argv = (*model, "--lora_rank", 4, "--adaptation", "--pretrain_model_path", base, "--global_batch_size", 12,
            "--test_every_epoch", "false")
    out = tmp_path / "run"
    assert_ok(run_cli(out, *argv, "--train_steps", 2, "--ddp", nproc=2))  # resumed on 2: the same batch plan
    checkpoint = out / "checkpoints" / records(out)[-1]["setting"] / "checkpoint.pth"
    shutil.copy(bases[1], base)  # the same path, other weights: the run's arguments alone cannot tell
    before = _files(out)
    message = "the checkpoint's LoRA adapters were trained on other base weights"
    assert_one_error_line(run_cli(out, *argv, "--train_steps", 4, "--resume", "--ddp", nproc=2), message)
    for nproc in (None, 2):
        ddp = ("--ddp",) if nproc else ()
        assert_one_error_line(run_cli(out, *argv, "--is_training", 0, "--checkpoint", checkpoint, *ddp,
                                      nproc=nproc), message)
    assert _files(out) == before
    shutil.copy(bases[0], base)  # its own base back: it resumes
    assert_ok(run_cli(out, *argv, "--train_steps", 4, "--resume", "--ddp", nproc=2))


# A forecaster written as TSLib writes its model files (its layers' names, its configs fields, its forward), dropped
# into models/ of a scratch copy of this tree, as lab/tslib_models.py drops in TSLib's files.
TSLIB_STYLE_FILE = """import torch
import torch.nn as nn
from layers.Transformer_EncDec import Encoder, EncoderLayer
from layers.SelfAttention_Family import FullAttention, AttentionLayer
from layers.Embed import DataEmbedding_inverted


class Model(nn.Module):
    def __init__(self, configs):
        super(Model, self).__init__()
        self.task_name = configs.task_name
        self.seq_len = configs.seq_len
        self.pred_len = configs.pred_len
        self.enc_embedding = DataEmbedding_inverted(configs.seq_len, configs.d_model, configs.embed, configs.freq,
                                                    configs.dropout)
        self.encoder = Encoder(
            [
                EncoderLayer(
                    AttentionLayer(
                        FullAttention(False, configs.factor, attention_dropout=configs.dropout,
                                      output_attention=False), configs.d_model, configs.n_heads),
                    configs.d_model,
                    configs.d_ff,
                    dropout=configs.dropout,
                    activation=configs.activation
                ) for l in range(configs.e_layers)
            ],
            norm_layer=torch.nn.LayerNorm(configs.d_model)
        )
        self.projection = nn.Linear(configs.d_model, configs.pred_len, bias=True)

    def forecast(self, x_enc, x_mark_enc, x_dec, x_mark_dec):
        means = x_enc.mean(1, keepdim=True).detach()
        x_enc = x_enc - means
        stdev = torch.sqrt(torch.var(x_enc, dim=1, keepdim=True, unbiased=False) + 1e-5)
        x_enc /= stdev
        _, _, N = x_enc.shape
        enc_out = self.enc_embedding(x_enc, None)
        enc_out, attns = self.encoder(enc_out, attn_mask=None)
        dec_out = self.projection(enc_out).permute(0, 2, 1)[:, :, :N]
        dec_out = dec_out * (stdev[:, 0, :].unsqueeze(1).repeat(1, self.pred_len, 1))
        dec_out = dec_out + (means[:, 0, :].unsqueeze(1).repeat(1, self.pred_len, 1))
        return dec_out

    def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec, mask=None):
        if self.task_name == 'long_term_forecast' or self.task_name == 'short_term_forecast':
            dec_out = self.forecast(x_enc, x_mark_enc, x_dec, x_mark_dec)
            return dec_out[:, -self.pred_len:, :]
        return None
"""


def test_a_dropped_in_tslib_file_trains_the_same_adapters_on_1_and_2_processes(tmp_path):
    """The file alone added to a scratch copy of this working tree, run.py there (real interpreters, torchrun for
    2): LoRA on its AttentionLayer's projections, the same global batch, the same adapters (1e-6)."""
    import subprocess
    import sys

    from helpers import REPO, subprocess_env
    from lab.tslib_models import scratch_copy, scratch_env

    (tmp_path / "TSLibStyleLoRA.py").write_text(TSLIB_STYLE_FILE)
    scratch = scratch_copy(REPO, tmp_path / "repo", tmp_path / "TSLibStyleLoRA.py")
    lora = ("--lora_rank", 4, "--lora_dropout", 0.3, "--dropout", 0.1)
    argv = ["--model", "TSLibStyleLoRA", *map(str, (*TINY, *TRAIN, *lora)), "--no_plots"]
    states = []
    for nproc in (None, 2):
        out = tmp_path / f"nproc{nproc or 1}"
        launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "run.py", "--ddp"] \
            if nproc else ["run.py"]
        proc = subprocess.run([sys.executable, *launcher, *argv, "--checkpoints", str(out / "checkpoints"),
                               "--results_dir", str(out / "results")], cwd=scratch, capture_output=True, text=True,
                              env=dict(scratch_env(scratch), **{k: v for k, v in subprocess_env().items()
                                                                if k.startswith("OMP")}), timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        record = records(out)[-1]
        states.append(torch.load(out / "checkpoints" / record["setting"] / "checkpoint.pth", weights_only=True))
    adapted = {key.split(".lora_")[0].rsplit(".", 1)[-1] for key in states[0] if ".lora_A." in key}
    assert adapted == {"query_projection", "key_projection", "value_projection", "out_projection"}, adapted
    _assert_same_adapters(states, record)



def _release_names():
    from test_foundation import RELEASES

    return list(RELEASES)


@pytest.mark.parametrize("name", _release_names())
def test_every_release_takes_a_lora_step_that_moves_only_its_adapters(name, tmp_path):
    """Every release folder (fixture at reduced shape) fine-tunes under --lora_rank with its family's default
    targets: adapters trained (some lora_B moved off zero), no base weight in the checkpoint."""
    from test_foundation import RELEASES, TUNE, needs, released_folder, run_args, write_etth1_shaped

    row = needs(RELEASES[name])
    folder = released_folder(row, tmp_path / "release")
    argv = [*run_args(row, write_etth1_shaped(tmp_path / "etth1"), folder), *TUNE, "--train_steps", 1,
            "--lora_rank", 4]
    out = tmp_path / "run"
    assert_ok(run_cli(out, *argv))
    (path,) = out.rglob("checkpoint.pth")
    state = torch.load(path, map_location="cpu", weights_only=True)
    moved = [k for k, v in state.items() if ".lora_B." in k and float(v.abs().max()) > 0]
    assert moved, f"{name}: no adapter trained ({len([k for k in state if '.lora_' in k])} adapter tensors)"
    assert not [k for k in state if k.endswith(".base_layer.weight")], "the base weights are not the checkpoint's"
