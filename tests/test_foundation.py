"""The released foundation models' contract: every release (models/foundation/<release>/) is a row of RELEASES,
and each check below is written once and holds every row to it, as tests/test_model_contract.py holds every
model. A release's own comparison with its reference code is models/foundation/<release>/tests/test_<release>.py.

- zero-shot scores the same on 1, 2 and 3 processes and at two --eval_batch_size (3 runs: 1 process at the
  default batch, 2 at 5, 3 at 7), and writes no checkpoint;
- fine-tuning gives the same weights on 1 and 2 processes for one global batch, and changes them;
- the fine-tuned checkpoint exports to the release's layout (its files, keys and shapes) and reads back as the
  weights it was exported from;
- bad inputs are one line: no folder, a partial one, another release's folder (named, with the --model that reads
  it), a context or horizon the release cannot take.

A row's `write` builds the release's folder with the damage a bad input needs, found from the folder: its
tests/writer.py's `write` (a reduced release its package writes), else a copy of its committed tests/fixture/ (the
folder its reference code wrote); tests/bad_inputs.py's probes build theirs with it; the checks of tests/ that need
a release with some property (native quantiles, a hub layout) pick its row here. Adding a release: its folder under
models/foundation/ (with its tests/: a writer.py or a fixture/) and a row here, naming the folder and its
properties.
"""
import functools
import importlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import ETTH1_ARGS, assert_ok, make_args, records, run_cli, write_etth1_shaped

FOUNDATION = Path(__file__).resolve().parent.parent / "models" / "foundation"
LEVELS_9 = [round(0.1 * k, 1) for k in range(1, 10)]


def adapter(folder):
    """A release's checkpoint adapter module (models/foundation/<folder>/adapter.py)."""
    return importlib.import_module(f"models.foundation.{folder}.adapter")


def own_tests(row):
    """A release's own test module (models/foundation/<folder>/tests/test_<folder>.py): what checks of tests/ borrow
    from it (a packaged release's zero_shot_quantiles, the package's forecast) is written there."""
    return importlib.import_module(f"models.foundation.{row.folder}.tests.test_{row.folder}")


def checkpoints():
    """The module exporting and loading checkpoints with every release's adapter."""
    return importlib.import_module("exp.export")


# ------------------------------------------------------------------ each release's folder, as the hub lays it out
def damage(release, lacking=None, config=None, drop=None):
    """A written safetensors release without the file `lacking`, with `config` over config.json, without the tensor
    `drop`."""
    if lacking:
        (release / lacking).unlink()
    if config is not None:
        (release / "config.json").write_text(json.dumps(config))
    if drop:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(release / "model.safetensors"))
        del tensors[drop]
        save_file(tensors, str(release / "model.safetensors"), metadata={"format": "pt"})
    return release


def fixture(folder):
    """The committed tiny release its reference code wrote: models/foundation/<folder>/tests/fixture."""
    return FOUNDATION / folder / "tests" / "fixture"


def copy_fixture(folder, release, lacking=None, config=None, drop=None, edit_config=None):
    """A release's committed tiny fixture, written by its reference code, copied to `release` and damaged: how a
    release without a writer.py of its own is written."""
    release.mkdir(parents=True)
    for file in ("config.json", "model.safetensors"):
        shutil.copy(fixture(folder) / file, release / file)
    if edit_config:
        fields = json.loads((release / "config.json").read_text())
        (release / "config.json").write_text(json.dumps({**fields, **edit_config}))
    return damage(release, lacking, config, drop)


def writer(folder):
    """How a release's folder is written: models/foundation/<folder>/tests/writer.py's `write(release, **damage)`
    (a reduced release its package writes), else a copy of its committed fixture."""
    if (FOUNDATION / folder / "tests" / "writer.py").is_file():
        return importlib.import_module(f"models.foundation.{folder}.tests.writer").write
    return functools.partial(copy_fixture, folder)


# ------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Release:
    name: str  # --model
    folder: str  # models/foundation/<folder>
    dirname: str  # the folder's name as downloaded (the package of some reads it from the path)
    package: str = ""  # the reference package a test needs installed ("": native, its fixture committed)
    owner: str = ""  # the hub organisation's folder above it, for a package that reads the path
    export_to: str = ""  # python -m exp.export export --to NAME
    files: tuple = ("config.json", "model.safetensors")
    signature: dict = field(default_factory=dict)  # a config.json that tells the release apart ({}: its files do)
    run: tuple = ()  # run.py arguments of the zero-shot and fine-tuning runs (beside ETTh1-shaped data)
    levels: tuple = tuple(LEVELS_9)  # the quantile levels a record scores its wql at (() for a point forecast)
    rel: float = 1e-9  # how close the zero-shot scores of the runs are
    tune: tuple = ()  # fine-tuning arguments beside TUNE
    tune_folder: dict = field(default_factory=dict)  # config.json fields of the folder fine-tuned (dropout on)
    one_process: tuple = ()  # arguments of the 1-process fine-tuning run (e.g. the 2 processes' micro-batches)
    keyed: tuple = ()  # (name ending, count): dropout modules a fine-tuning run must key by window
    too_long: tuple = ()  # (seq_len, pred_len, message) the release's folder refuses
    # further exactness checks of its fine-tuning: "lora" (tests/test_lora.py: the same adapters on 1, 2 and 3
    # processes, exported merged), "fsdp" (tests/test_fsdp.py: --fsdp on 2 and 3 processes, one process's weights)
    checks: tuple = ()

    def write(self, release, **damage):
        """The release's folder at path `release`, damaged as a bad input needs (see writer)."""
        return writer(self.folder)(release, **damage)


RUN = ("--label_len", 0, "--val_windows", 12, "--test_windows", 20, "--num_threads", 1)  # 20: 7 + 7 + 6 on 3
RELEASES = {row.name: row for row in [
    Release("ChronosBolt", "chronos_bolt", "chronos-bolt-small", package="chronos", export_to="chronos-bolt",
            checks=("lora",),
            signature={"architectures": ["ChronosBoltModelForForecasting"], "model_type": "t5"},
            run=("--seq_len", 64, "--pred_len", 24, *RUN), rel=1e-12, keyed=("Attention.weights_dropout", 3),
            too_long=(2049, 24, "longer than the 2048 steps of context Chronos-Bolt reads")),
    Release("Chronos2", "chronos2", "chronos-2", package="chronos.chronos2", export_to="chronos2", checks=("lora",),
            signature={"architectures": ["Chronos2Model"], "model_type": "t5"},
            run=("--seq_len", 32, "--pred_len", 24, *RUN), levels=LEVELS_9, rel=1e-6, tune=("--dropout", 0.1),
            keyed=("self_attention.weights_dropout", 4),
            too_long=(8193, 24, "longer than Chronos-2's context of 8192 steps")),
    Release("TimesFM25", "timesfm25", "timesfm-2.5-200m-pytorch", package="timesfm.timesfm_2p5.timesfm_2p5_torch",
            export_to="timesfm", signature={"torch_compile": False},
            run=("--seq_len", 64, "--pred_len", 24, *RUN), tune=("--learning_rate", 1e-4),
            too_long=(48, 1100, "quantile head forecasts at most 1024 steps")),
    Release("TiRex", "tirex", "TiRex", package="tirex", export_to="tirex", files=("model.ckpt",),
            owner="NX-AI", run=("--seq_len", 96, "--pred_len", 48, *RUN),
            too_long=(513, 24, "at most 512 steps of context")),
    Release("TiRex2", "tirex2", "TiRex-2", package="tirex2", owner="NX-AI", export_to="tirex2",
            checks=("lora", "fsdp"),
            signature={"stack_config": {"templates": {}, "recipe": []}, "context_len": 2048, "future_len": 320,
                       "tokenizer_cfg": {}},
            run=("--seq_len", 96, "--pred_len", 48, *RUN), too_long=(97, 24, "at most 96 steps of context")),
    Release("TimerBase", "timer_base", "timer-base-84m", export_to="timer-base",
            signature={"architectures": ["TimerForPrediction"], "model_type": "timer"},
            run=("--seq_len", 44, "--pred_len", 20, *RUN), levels=(), tune_folder={"attention_dropout": 0.1},
            too_long=(7, 8, "--seq_len 7 is shorter than one")),
    Release("Sundial", "sundial", "sundial-base-128m", export_to="sundial",
            signature={"architectures": ["SundialForPrediction"], "model_type": "sundial"},
            run=("--seq_len", 96, "--pred_len", 30, *RUN, "--num_samples", 4, "--sampling_steps", 2), rel=1e-7,
            too_long=(3, 30, "--seq_len 3 is shorter than one")),
    Release("TimeMoE", "time_moe", "TimeMoE-50M", export_to="time-moe", checks=("fsdp",),
            signature={"architectures": ["TimeMoeForPrediction"], "model_type": "time_moe"},
            run=("--seq_len", 96, "--pred_len", 20, *RUN), levels=(), one_process=("--accumulation_steps", 2),
            too_long=(4090, 24, "at most 4096 positions")),
    Release("Moirai2", "moirai2", "moirai-2.0-R-small", export_to="moirai2",
            signature={"d_model": 384, "d_ff": 1024, "num_layers": 6, "patch_size": 16, "max_seq_len": 512,
                       "num_predict_token": 4, "quantile_levels": LEVELS_9},
            run=("--seq_len", 96, "--pred_len", 24, *RUN), tune_folder={"attn_dropout_p": 0.1, "dropout_p": 0.1},
            too_long=(200, 60, r"at most 64 tokens of 4 steps")),
    Release("Toto2", "toto2", "Toto-2.0-2.5B", export_to="toto2", checks=("lora", "fsdp"),
            signature={"d_model": 2048, "num_heads": 32, "num_layers": 48, "layer_group_size": 48, "patch_size": 32,
                       "num_variate_layers_per_group": 1, "variate_layer_first": False,
                       "residual_attn_ratio": 5.136215466577748},
            run=("--seq_len", 96, "--pred_len", 24, *RUN),
            too_long=(65536, 8, r"at most 8192 patches of 8 steps")),
]}
NAMES = list(RELEASES)


def needs(row):
    """Skip where the release's package is not installed (its folder is written by the package)."""
    if row.package:
        pytest.importorskip(row.package, reason=f"{row.name}'s package is not installed")
    return row


def ours(row, folder, seq_len, pred_len):
    """`--model row.name` built from `folder` as run.py builds it (its sizes from the folder's files), its weights
    the folder's."""
    from models import get_model_class

    args = make_args("--model", row.name, "--seq_len", seq_len, "--pred_len", pred_len, "--pretrain_model_path",
                     folder)
    return checkpoints().load_weights(get_model_class(row.name)(args), str(folder)).eval()


def released_folder(row, root, **damage):
    return row.write(Path(root) / row.owner / row.dirname, **damage)


@pytest.fixture(scope="module")
def etth1(tmp_path_factory):
    return write_etth1_shaped(tmp_path_factory.mktemp("etth1"))


def run_args(row, etth1, folder):
    return [*ETTH1_ARGS, "--model", row.name, *row.run, "--root_path", etth1, "--pretrain_model_path", folder]


SCORES = ("mse", "mae", "wql", "mase", "smape", "coverage_80", "vali_loss", "test_objective_loss")


@pytest.mark.parametrize("name", NAMES)
def test_zero_shot_scores_the_same_on_1_2_3_processes_and_two_eval_batch_sizes(name, etth1, tmp_path):
    row = needs(RELEASES[name])
    argv = [*run_args(row, etth1, released_folder(row, tmp_path / "release")), "--is_training", 0]
    outcomes = []
    for nproc, extra in ((None, ()), (2, ("--ddp", "--eval_batch_size", 5)), (3, ("--ddp", "--eval_batch_size", 7))):
        assert_ok(run_cli(tmp_path / "runs", *argv, *extra, nproc=nproc))
        outcomes.append(records(tmp_path / "runs")[-1])
    first = outcomes[0]
    assert [o["world_size"] for o in outcomes] == [1, 2, 3]
    assert first["test_windows"] == 20 and first.get("wql_levels", []) == list(row.levels)
    for outcome in outcomes[1:]:
        for key in SCORES:
            if key in first:
                assert outcome[key] == pytest.approx(first[key], rel=row.rel, abs=0), (key, outcome["world_size"])
    assert not any((tmp_path / "runs" / "checkpoints").rglob("*.pth"))


TUNE = ("--adaptation", "--train_steps", 2, "--global_batch_size", 8, "--learning_rate", 1e-3,
        "--test_every_epoch", "false")


@pytest.fixture(scope="module", params=NAMES)
def fine_tuned(request, etth1, tmp_path_factory):
    """One release fine-tuned on 1 and on 2 processes (the same global batch): row, the folder it started from and
    each run's (record, checkpoint path, state dict)."""
    import torch

    row = needs(RELEASES[request.param])
    tmp_path = tmp_path_factory.mktemp(f"tune_{row.folder}")
    folder = released_folder(row, tmp_path / "release", **({"edit_config": row.tune_folder} if row.tune_folder
                                                             else {}))
    argv = [*run_args(row, etth1, folder), *TUNE, *row.tune]
    runs = []
    for nproc, extra in ((None, row.one_process), (2, ("--ddp",))):
        out = tmp_path / f"nproc{nproc or 1}"
        assert_ok(run_cli(out, *argv, *extra, nproc=nproc))
        record = records(out)[-1]
        path = out / "checkpoints" / record["setting"] / "checkpoint.pth"
        runs.append((record, path, torch.load(path, map_location="cpu", weights_only=True)))
    return row, folder, runs


def test_fine_tuning_gives_the_same_weights_on_1_and_2_processes(fine_tuned):
    import torch

    row, folder, ((record, _, one), (_, _, two)) = fine_tuned
    initial = ours(row, folder, row.run[1], row.run[3]).state_dict()
    assert set(one) == set(two) == set(initial)
    assert max(float((one[k].double() - initial[k].double()).abs().max()) for k in one) > 1e-6, \
        "fine-tuning changed nothing"
    for key in one:
        assert torch.allclose(one[key].double(), two[key].double(), rtol=0, atol=1e-6), key
    if row.keyed:  # the folder's dropout is keyed by window, the attention weights' too
        ending, count = row.keyed
        keyed = record["dropout_keyed"]
        assert len([n for n in keyed if n.endswith(ending)]) == count and all(keyed.values()), keyed


def test_the_fine_tuned_checkpoint_exports_to_the_release_layout_and_reads_back(fine_tuned, tmp_path):
    import torch

    row, folder, ((_, path, one), _) = fine_tuned
    exported = tmp_path / "exported" / row.dirname
    checkpoints().export(str(path), str(exported), row.export_to)
    assert sorted(os.listdir(exported)) == sorted(row.files)
    if "model.safetensors" in row.files:  # the release's tensors, by name and shape
        from safetensors.torch import load_file

        written, released = (load_file(str(f / "model.safetensors")) for f in (exported, folder))
        assert {k: v.shape for k, v in written.items()} == {k: v.shape for k, v in released.items()}
        config, theirs = (json.loads((f / "config.json").read_text()) for f in (exported, folder))
        assert config.get("architectures") == theirs.get("architectures")
    back = ours(row, exported, row.run[1], row.run[3]).state_dict()
    assert all(torch.equal(back[k].to(one[k].dtype), one[k]) for k in one), \
        [k for k in one if not torch.equal(back[k].to(one[k].dtype), one[k])][:5]


# ------------------------------------------------------------------ bad inputs, one line each
def refusal(row, folder, seq_len=None, pred_len=None):
    """The one line building and loading `--model row.name` from `folder` is refused with."""
    from utils.errors import UserError

    with pytest.raises((UserError, ValueError)) as refused:
        ours(row, folder, seq_len or row.run[1], pred_len or row.run[3])
    message = str(refused.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


@pytest.mark.parametrize("name", NAMES)
def test_a_missing_or_partial_folder_is_one_line(name, tmp_path):
    row = needs(RELEASES[name])
    assert "not found" in refusal(row, tmp_path / row.dirname)
    weights = "model.ckpt" if "model.ckpt" in row.files else "model.safetensors"
    partial = released_folder(row, tmp_path, lacking=weights)
    message = refusal(row, partial).replace(str(tmp_path), "DIR")  # the test's own folder is named "...partial..."
    assert weights in message and ("partial" in message or "lacks" in message or "has no" in message), message


@pytest.mark.parametrize("name", NAMES)
def test_a_context_or_horizon_it_cannot_take_is_one_line(name, tmp_path):
    row = needs(RELEASES[name])
    seq_len, pred_len, message = row.too_long
    folder = released_folder(row, tmp_path)
    assert re.search(message, refusal(row, folder, seq_len, pred_len))
    ours(row, folder, row.run[1], row.run[3])  # what the runs take is taken


# one release per official package: the package stood in by a module that cannot be imported
PACKAGED = sorted({row.package.split(".")[0]: name for name, row in reversed(RELEASES.items()) if row.package}.values())


@pytest.mark.parametrize("name", PACKAGED)
def test_without_its_package_a_release_is_one_line_naming_the_install(name, tmp_path):
    """A release built on an official package that cannot be imported (a stand-in first on the path): one line naming
    the package and the extra to install, exit 2, no traceback, nothing written."""
    from helpers import REPO, run_command

    package = RELEASES[name].package.split(".")[0]
    fake = tmp_path / "site" / package
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise ImportError('No module named {package} (stand-in)')\n")
    proc = run_command(["python", str(REPO / "run.py"), "--model", name, "--data", "synthetic", "--synthetic_rows",
                        "400", "--seq_len", "48", "--pred_len", "24", "--label_len", "0",
                        "--checkpoints", str(tmp_path / "ck"), "--results_dir", str(tmp_path / "res")],
                       extra_env={"PYTHONPATH": f"{tmp_path / 'site'}:{REPO}"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert re.search(rf"model {name} needs the \S+ package .*pip install -e '\.\[\w+\]'", errors[0]), errors[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ck").exists() and not (tmp_path / "res").exists()


def signature_folder(root, release):
    """Release `release`'s folder reduced to what tells it apart: its model.ckpt alone (no signature), else config.json
    (with a model.safetensors beside it)."""
    import torch

    folder = root / release.name
    folder.mkdir()
    if not release.signature:
        torch.save({"state_dict": {}, "hyper_parameters": {}}, folder / "model.ckpt")
    else:
        from safetensors.torch import save_file

        (folder / "config.json").write_text(json.dumps(release.signature))
        save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("name", NAMES)
def test_each_release_folder_has_a_signature(tmp_path, name):
    from models.foundation.release import release_of

    what, model = release_of(signature_folder(tmp_path, RELEASES[name]))
    assert model == name, what


@pytest.mark.parametrize("name", NAMES)
def test_another_releases_folder_is_named_with_the_model_that_reads_it(tmp_path, name):
    """Every other release's folder given to `--model name`: one line naming the --model that reads it, never
    "partial" (8 x 7 pairs; the packaged models need their package to be built)."""
    row = needs(RELEASES[name])
    for other in RELEASES.values():
        if other is row:
            continue
        message = refusal(row, signature_folder(tmp_path, other))
        assert f"--model {other.name}" in message and "partial" not in message, (other.name, message)


def test_the_table_is_the_release_folders():
    """Each models/foundation/<folder> is a row, with its README.md, its comparison test file and what writes its
    folder (tests/ in it: writer.py, or the committed fixture/ copied)."""
    from models.foundation import release_folders

    assert sorted(row.folder for row in RELEASES.values()) == release_folders()
    for row in RELEASES.values():
        tests = FOUNDATION / row.folder / "tests"
        assert (FOUNDATION / row.folder / "README.md").is_file(), row.folder
        assert (tests / f"test_{row.folder}.py").is_file(), row.folder
        assert (tests / "writer.py").is_file() != (tests / "fixture" / "config.json").is_file(), row.folder
