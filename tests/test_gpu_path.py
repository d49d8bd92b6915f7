"""The CUDA path's costs that a CPU can show (issue 43, items 3-9): host syncs and blocking host-to-device copies
counted with a device stand-in (the "meta" device, which takes every copy and computes nothing), what auto
placement estimates and logs, evaluation indices in O(1) memory, TimesNet's index copies, and the GPU tier's
refusal to pass without CUDA. What only a GPU shows is checked by scripts/gpu_check.sh (docs/gpu.md)."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from data_provider.global_batches import GlobalBatches


class HostTraffic(TorchDispatchMode):
    """Counts, for every op run under it: blocking copies to a non-CPU device (.to(device) without
    non_blocking: the host waits for the device's stream), reads of a value back (.item(), .tolist()) and
    tensors made from host data (torch.tensor(list), indexing with a Python list): each a host-to-device copy
    on a GPU."""

    def __init__(self):
        super().__init__()
        self.blocking_copies = self.reads = self.from_host = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default:
            device = kwargs.get("device")
            if device is not None and torch.device(device).type != "cpu" and not kwargs.get("non_blocking"):
                self.blocking_copies += 1
        elif func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        elif func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            self.from_host += 1
        return func(*args, **kwargs)


def test_training_order_reaches_the_device_without_a_blocking_copy_per_step():
    """Item 3: the O(1)-memory Feistel order (univariate and corpus data) is computed on the host each step; its
    copy to the device must be queued (pinned, non_blocking), not a .to(device) that waits for the GPU. The
    randperm order of table data likewise, once an epoch."""
    for constant_memory in (True, False):
        batches = GlobalBatches(1000, 7, 16, accumulation_steps=2, constant_memory=constant_memory)
        batches.set_epoch(3)
        with HostTraffic() as traffic:
            steps = list(batches.steps(device="meta"))
        assert len(steps) == 32 and all(m.device.type == "meta" for step in steps for m in step)
        assert (traffic.blocking_copies, traffic.reads) == (0, 0), constant_memory


def test_evaluation_indices_are_ranges_not_a_list_of_every_window():
    """Item 7: a validation or test share is contiguous, so each batch's indices are a range made on the data's
    device; no Python list (or tensor) of every window is built, however large the split (a corpus's)."""
    import tracemalloc
    from types import SimpleNamespace

    from data_provider.windows import ShardSampler, WindowLoader

    n, size = 3_000_000, 1000
    loader = WindowLoader(SimpleNamespace(device=torch.device("meta")), ShardSampler(n), size, num_workers=0)
    torch.arange(0, 10, device="meta")  # what the first meta op imports is not the loader's
    tracemalloc.start()
    try:
        batches = loader.batch_indices(start=2000)
        first = next(iter(batches))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first.shape == (size,) and first.device.type == "meta"
    assert peak < 1 << 20, f"{peak / 2**20:.0f} MiB held to start the evaluation of {n} windows"
    on_cpu = WindowLoader(SimpleNamespace(device=torch.device("cpu")), ShardSampler(2500), 1000, num_workers=0)
    assert [b.tolist() for b in on_cpu.batch_indices(start=1200)] == [list(range(1200, 2200)), list(range(2200, 2500))]


def _corpus_args(tmp_path, *argv):
    import numpy as np

    from data_provider.corpus import build
    from helpers import SMALL_TIMERXL, make_args

    (tmp_path / "src").mkdir()
    np.save(tmp_path / "src" / "a.npy", np.cumsum(np.random.default_rng(0).normal(size=(1500, 2)), axis=0))
    build(str(tmp_path / "out"), [str(tmp_path / "src" / "*")], shard_mb=0.005, progress=False)
    return make_args("--data", "corpus", "--root_path", tmp_path / "out", *SMALL_TIMERXL, "--input_token_len", 24,
                     "--output_token_len", 24, "--seq_len", 96, "--batch_size", 8, "--num_threads", 1, *argv)


def test_a_corpus_on_a_gpu_is_said_to_stay_in_its_memory_map_and_its_batches_are_pinned(tmp_path, monkeypatch,
                                                                                          caplog):
    """Item 5: --data corpus with --data_on_device auto (or always) said "data on the GPU", but a corpus never
    leaves its memory map; and since the loader then thought the data on the device, its host batches were
    not pinned, so each step's copy held the host. The log says what happens, and every batch is pinned."""
    import data_provider.data_factory as factory
    from helpers import make_experiment

    monkeypatch.setattr(factory, "_placement_cache", {})
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * 2**30, 80 * 2**30))
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a: pinned.append(self.shape) or self)
    args = _corpus_args(tmp_path)
    make_experiment(args)
    with caplog.at_level("INFO", logger="tsl"):
        _, train = factory.data_provider(args, "train", torch.device("cuda", 0))
        _, val = factory.data_provider(args, "val", torch.device("cuda", 0))
    said = [r.getMessage() for r in caplog.records if "--data_on_device" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("data off the GPU (--data_on_device auto): a corpus stays in its "
                                                 "memory map"), said
    train.set_epoch(0)
    step = next(iter(train.steps()))
    batch = next(iter(val.batches()))
    parts = sum(t is not None for micro in step for t in micro) + sum(t is not None for t in batch)
    assert batch[0].device.type == "cpu" and len(pinned) == parts > 0
    from data_provider.m4 import M4Data

    assert "on the host" in M4Data.stays_on_host  # M4's windows are cut on the host too: the same rule


def test_the_auto_estimate_counts_univariate_datas_window_indices(tmp_path):
    """Item 6: univariate data goes to a GPU as each split's values AND the int64 start of every window
    (WindowSelection.indices, 8 bytes a window against 4 a value); an estimate of the values alone was a third
    of it, so "a quarter of the free memory" could take three quarters."""
    import numpy as np

    from data_provider import data_factory
    from helpers import make_args, make_experiment

    rng = np.random.default_rng(0)
    for name, rows in (("a", 2000), ("b", 900)):
        np.save(tmp_path / f"{name}.npy", rng.normal(size=(rows, 2)))
    data_factory._prepared_cache.clear()
    args = make_args("--data", "univariate", "--root_path", tmp_path, "--data_path", "*.npy", "--features", "S",
                     "--seq_len", 48, "--label_len", 24, "--pred_len", 24, "--num_threads", 1)
    make_experiment(args)
    data = data_factory.prepared_data(args)
    on_gpu = 0
    for flag in ("train", "val", "test"):
        split = data.window_dataset(flag, data_factory.window_for(args, flag))
        on_gpu += split.base.data.nbytes + split.base.marks.nbytes + split.indices.nbytes
    assert on_gpu <= data.nbytes() <= 1.2 * on_gpu, (on_gpu, data.nbytes())


def test_timesnet_evaluation_copies_its_period_rows_once_a_block():
    """Item 4: TimesNet's evaluation with each window's own periods (the default) indexed the batch with a
    Python list and made two tensors from host lists for every period of every block: three host-to-device
    copies a period on a GPU. Now one a block, whatever the number of periods; the forecast is the same."""
    from types import SimpleNamespace

    from models.TimesNet import Model

    torch.manual_seed(0)
    config = SimpleNamespace(seq_len=96, pred_len=24, enc_in=3, c_out=3, d_model=8, d_ff=8, top_k=3, num_kernels=2,
                             e_layers=2, dropout=0.0, mark_dim=0)
    model = Model(config).eval()
    steps = torch.arange(96.0)[None, :, None]
    x = torch.cat([torch.sin(2 * torch.pi * steps / p).expand(1, 96, 3) for p in (4, 6, 8, 12, 16, 24, 32, 48)])
    batch_mode = Model(SimpleNamespace(**vars(config), times_eval_periods="batch")).eval()
    batch_mode.load_state_dict(model.state_dict())
    with torch.no_grad(), HostTraffic() as traffic:
        out = model(x)
    with torch.no_grad():
        alone = torch.cat([model(x[i:i + 1]) for i in range(len(x))])
        assert not torch.allclose(out, batch_mode(x), atol=1e-3)  # the windows' periods do differ
    assert torch.allclose(out, alone, atol=1e-5)
    assert traffic.from_host <= config.e_layers, traffic.from_host


def _scaled_adam_step(optimizer, model, scaler, x, clip=False):
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(model(x).square().mean()).backward()
    if clip:  # --clip_grad: unscaled first
        scaler.unscale_(optimizer)
    with HostTraffic() as traffic:
        scaler.step(optimizer)
    scaler.update()
    return traffic.reads


def test_zero_with_a_loss_scaler_reads_nothing_back_and_skips_an_overflow(tmp_path):
    """Item 8: under --zero the local Adam was unfused, so GradScaler.step read found_inf back to the host
    (.item()) every step; now the fused local Adam takes found_inf on the device. The steps equal a plain fused
    Adam's, an overflowing step changes nothing, and a state loaded back keeps stepping alike."""
    import torch.distributed as dist

    from utils import ddp

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x = torch.randn(16, 5, generator=torch.Generator().manual_seed(0))
        models = [torch.nn.Linear(5, 3) for _ in range(2)]
        models[1].load_state_dict(models[0].state_dict())
        options = dict(lr=0.01, weight_decay=0.0, fused=True)
        zero = ddp.make_optimizer(models[0].parameters(), torch.optim.Adam, shard=True, **options)
        plain = torch.optim.Adam(models[1].parameters(), **options)
        scalers = [torch.amp.GradScaler("cpu", init_scale=2.0 ** 10) for _ in range(2)]
        for clip in (False, True, False):
            assert _scaled_adam_step(zero, models[0], scalers[0], x, clip) == 0
            _scaled_adam_step(plain, models[1], scalers[1], x, clip)
        assert all(torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters()))
        before = [p.detach().clone() for p in models[0].parameters()]
        _scaled_adam_step(zero, models[0], scalers[0], x * float("inf"))
        assert all(torch.equal(a, b) for a, b in zip(before, models[0].parameters()))  # skipped, scale halved
        assert scalers[0].get_scale() == scalers[1].get_scale() / 2
        state = ddp.optimizer_state_dict(zero)
        ddp.load_optimizer_state(zero, state)
        assert _scaled_adam_step(zero, models[0], scalers[0], x) == 0
    finally:
        dist.destroy_process_group()


def test_gpu_check_without_cuda_says_so_and_its_cpu_smoke_runs(tmp_path):
    """scripts/gpu_check.sh: where torch has no CUDA it says so in one line and exits 3 (a check that skipped
    everything and ended 0 would pass a broken machine); --cpu-smoke runs its steps on the CPU (here the light
    smoke: the tier's refusal, the probe's dry run, the FSDP2 and LoRA fine-tuning steps; the full smoke, with the
    main job, a benchmark and the fine-tuning table's dry run, took 316 s on 2 busy cores), every log in $OUT.
    Item 9: in the smoke, `python -m pytest -m gpu` without CUDA must be a usage error, one ERROR line and exit
    4 (it skipped every test and exited 0, so a GPU machine whose torch lost CUDA passed its check)."""
    import json
    import os
    import subprocess

    from helpers import REPO, subprocess_env

    env = {**subprocess_env(), "CUDA_VISIBLE_DEVICES": ""}
    refused = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO, capture_output=True, text=True, timeout=120,
                             env={**env, "OUT": str(tmp_path / "refused")})
    assert refused.returncode == 3 and refused.stdout == "" and len(refused.stderr.splitlines()) == 1, refused
    assert "no CUDA device here" in refused.stderr
    usage = subprocess.run(["bash", "scripts/gpu_check.sh", "--part", "everything"], cwd=REPO, capture_output=True,
                           text=True, timeout=60, env={**env, "OUT": str(tmp_path / "usage")})
    assert usage.returncode == 2 and len(usage.stderr.splitlines()) == 1 and "--part everything" in usage.stderr
    smoke = subprocess.run(["bash", "scripts/gpu_check.sh", "--cpu-smoke"], cwd=REPO, capture_output=True, text=True,
                           timeout=300, env={**env, "OUT": str(tmp_path / "smoke"), "GPU_CHECK_SMOKE_LIGHT": "1"})
    summary = (tmp_path / "smoke" / "summary.txt").read_text()
    assert smoke.returncode == 0, summary + smoke.stderr[-2000:]
    assert "refused (exit 4), as it must" in summary and "every step ended 0" in summary
    errors = [line for line in (tmp_path / "smoke" / "pytest.log").read_text().splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and "runs the GPU tier, but torch" in errors[0] and "sees no CUDA device" in errors[0]
    checks = [json.loads(line) for line in (tmp_path / "smoke" / "probe.log").read_text().splitlines()
              if line.startswith("{")]
    assert len(checks) > 10 and all(c["status"] in ("ok", "dry-run ok") for c in checks), checks
    # the releases first: one on the CPU in the light smoke, its summary line naming what a GPU measures
    released = [line for line in summary.splitlines() if line.startswith("release ")]
    assert len(released) == 1 and released[0].endswith("dry-run ok") and "set_sync_debug_mode" in released[0], summary
    assert summary.index("release ") < summary.index("pytest -m gpu without CUDA")
    assert "on a GPU this check measures, per release" in summary and "releases under NCCL: left out" in summary
    # the fine-tuning steps after the releases: FSDP2 in bf16 and LoRA, run.py --ddp, each a line marked as a dry run
    tuned = [line for line in summary.splitlines() if line.startswith("fine-tuning ")]
    assert [line.split()[2] for line in tuned] == ["FSDP2", "LoRA"], summary
    assert all("samples/s" in line and line.endswith("CPU dry run, not a figure") for line in tuned), tuned
    assert summary.index("release ") < summary.index(tuned[0]) < summary.index("pytest -m gpu")
    assert "== fine-tuning table: left out" in summary and not list((tmp_path / "smoke").glob("fine_tuning_table.*"))
    assert {"summary.txt", "releases.log", "fine_tuning.log", "pytest.log", "probe.log",
            "extras.tar.gz"} <= set(os.listdir(tmp_path / "smoke"))


def _probe(monkeypatch, *argv):
    """scripts/gpu_probe.py as a module, its command line `argv` (a dry run: --cpu)."""
    import importlib.util
    import sys

    from helpers import REPO

    spec = importlib.util.spec_from_file_location("gpu_probe", REPO / "scripts" / "gpu_probe.py")
    probe = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "argv", ["gpu_probe.py", "--cpu", *argv])
    spec.loader.exec_module(probe)
    return probe


def test_the_probe_fails_on_syncs_a_mismatch_or_an_error_and_skips_a_missing_package_in_a_line(monkeypatch,
                                                                                                capsys):
    """scripts/gpu_probe.py ends 1 when a check reports SYNCS, MISMATCH, ERROR, FAILED or SLOW (it ended 0
    whatever it found), 0 otherwise; a release whose optional package is missing is one `skipped` line, never a failure; an
    unknown --releases name or --only part is a usage error (2)."""
    import pytest

    import test_host_syncs

    for status, code in (("ok", 0), ("skipped", 0), ("SYNCS", 1), ("MISMATCH", 1), ("ERROR", 1), ("FAILED", 1),
                         ("SLOW", 1)):
        probe = _probe(monkeypatch, "--only", "releases")
        monkeypatch.setattr(probe, "releases", lambda names, p=probe, status=status: p.report("x", status=status))
        assert probe.main() == code, status
    probe = _probe(monkeypatch, "--only", "releases")
    monkeypatch.setattr(probe, "report", lambda name, **fields: probe.RESULTS.append({"check": name, **fields}))

    def missing(case, etth1, root):
        raise pytest.skip.Exception(f"{case}'s package is not installed")

    monkeypatch.setattr(test_host_syncs, "argv_of", missing)
    probe._ETTH1["etth1"] = None  # no data is read before the package is found missing
    capsys.readouterr()
    probe.releases([next(iter(probe_rows()))])
    out = capsys.readouterr().out.splitlines()
    assert [r["status"] for r in probe.RESULTS] == ["skipped"] and len([l for l in out if "skipped" in l]) == 1, out
    for argv in (("--releases", "NoSuchRelease"), ("--only", "everything")):
        assert _probe(monkeypatch, *argv).main() == 2


def probe_rows():
    from test_foundation import RELEASES

    return RELEASES
