"""GPU probe (scripts/gpu_check.sh's steps): the checks of the CUDA path that the CPU suite cannot make. Run from
the project root.

  python scripts/gpu_probe.py            # on a CUDA machine
  python scripts/gpu_probe.py --cpu      # dry run of the same code paths on the CPU (syncs counted on meta)
  options: --only releases|others (one part), --releases A,B or none (default: every release)

0. every release (tests/test_foundation.py's RELEASES) zero-shot and fine-tuned, fp32 and bf16 (autocast) on one
   device: ms per eval batch and per optimizer step, peak memory, host syncs (torch.cuda.set_sync_debug_mode;
   on the CPU, the meta recorder of tests/test_host_syncs.py), the fp32 forecast against the CPU's; a release
   whose package is missing is skipped in one line. One summary line per release;
1. host syncs inside training steps (torch.cuda.set_sync_debug_mode), the loader's next() included, for
   table data (randperm order) and for the O(1)-memory Feistel order (univariate / corpus kinds);
2. keyed (hashed) dropout masks on the GPU against the CPU hash, and their cost against F.dropout; a release's
   training step with keyed attention dropout (fused, and one SDPA per sample) against its unkeyed step: SLOW past
   1.2x on a GPU;
3. TimesNet evaluation with per-window periods (the default) against batch periods;
4. --num_workers: worker-gathered global steps through the DataLoader's pin-memory thread, then a training step.
Every check prints one JSON line; a failure in one check never stops the others. Expected on a GPU: no host sync
for a release, 0 a training step for every zoo model and order but TimesNet (its grid shapes need the periods on the host: .tolist() per block, the positive control); the
same masks as the CPU hash; TimesNet's window periods within a small factor of batch periods (one host copy a
block); pinned worker batches. Exit status 1 when any check reports SYNCS, MISMATCH, ERROR, FAILED or SLOW.
"""
import json
import math
import os
import sys
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import torch  # noqa: E402

CPU = "--cpu" in sys.argv
CUDA = torch.cuda.is_available() and not CPU
RESULTS = []


def report(name, **fields):
    line = {"check": name, **fields}
    RESULTS.append(line)
    print(json.dumps(line, default=str), flush=True)


def guarded(fn):
    def run(*args, **kwargs):
        name = f"{fn.__name__}{list(args) if args else ''}"
        started = time.perf_counter()
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # one failing check must not hide the others
            report(name, status="ERROR", error=f"{type(exc).__name__}: {str(exc)[:400]}",
                   where=traceback.format_exc(limit=-4)[-1500:])
        finally:
            print(f"# {name}: {time.perf_counter() - started:.1f}s", flush=True)
    return run


SMALL = ["--d_model", "32", "--d_ff", "64", "--n_heads", "2", "--e_layers", "1", "--d_layers", "1",
         "--seq_len", "96", "--label_len", "48", "--pred_len", "24", "--input_token_len", "24",
         "--output_token_len", "24", "--top_k", "2", "--num_kernels", "2", "--down_sampling_layers", "1",
         "--down_sampling_window", "2", "--down_sampling_method", "avg",
         "--data", "synthetic", "--synthetic_rows", "3000", "--dropout", "0.1"]


def experiment(*argv):
    from helpers import make_args, make_experiment

    return make_experiment(make_args(*SMALL, *argv, "--use_gpu", "false" if CPU else "true"))


def train_loader(exp, feistel=False):
    from data_provider.data_factory import data_provider, prepared_data

    # the univariate / corpus kinds' O(1)-memory order, on the built-in table: the same sampler code path
    prepared_data(exp.args).constant_memory_shuffle = feistel
    try:
        _, loader = data_provider(exp.args, "train", exp.device)
    finally:
        prepared_data(exp.args).constant_memory_shuffle = False
    loader.set_epoch(1)
    return loader


def first_sync_site(steps_iter, exp, optimizer):
    """Where the first synchronising CUDA call of a step happens (sync debug mode 'error')."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        exp.train_step(next(steps_iter), optimizer)
    except RuntimeError as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if ROOT in f.filename]
        return [f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} {f.line}" for f in frames[-3:]]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return None


@guarded
def host_syncs(model, *extra, feistel=False, steps=4, expected=False):
    """Synchronising CUDA calls in `steps` training steps (loader's next() included), after 2 warm-up steps;
    `expected`: a positive control, which must show some (else the count itself is broken: MISMATCH)."""
    exp = experiment("--model", model, "--batch_size", "16", *extra)
    loader = train_loader(exp, feistel)
    optimizer = exp.make_optimizer()
    exp.model.train()
    it = iter(loader.steps())
    for _ in range(2):
        exp.train_step(next(it), optimizer)
    if not CUDA:
        report(f"host_syncs {model} {' '.join(extra)}{' feistel' if feistel else ''}", status="dry-run ok")
        return
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                exp.train_step(next(it), optimizer)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    site = first_sync_site(it, exp, optimizer) if syncs else None
    report(f"host_syncs {model} {' '.join(extra)}{' feistel' if feistel else ''}",
           syncs_per_step=len(syncs) / steps, first_site=site,
           status=("ok" if bool(syncs) == expected else "MISMATCH" if expected else "SYNCS"))


@guarded
def hashed_masks_match_cpu():
    from layers.dropout import SampleKeys, _keyed_noise, mask_key

    device = "cuda" if CUDA else "cpu"
    bad = []
    for p in (0.05, 0.1, 0.3, 0.5):
        for shape, first, samples in (((16, 7, 33), 100, 16), ((128, 7, 42, 16), 2 ** 40 + 3, 128), ((3, 1), 0, 3)):
            key = mask_key(2021, 3)
            got = _keyed_noise(torch.empty(shape, device=device), p, SampleKeys(key, first, samples), hashed=True)
            want = _keyed_noise(torch.empty(shape), p, SampleKeys(key, first, samples), hashed=True)
            if not torch.equal(got.cpu(), want):
                bad.append((p, shape))
            kept = (want != 0).double().mean().item()
            if shape[0] == 128 and abs(kept - (1 - p)) > 0.01:
                bad.append(("keep-rate", p, kept))
    report("hashed_masks_match_cpu", mismatches=bad, status="ok" if not bad else "MISMATCH")


def step_ms(exp, loader, steps=20):
    optimizer = exp.make_optimizer()
    exp.model.train()
    batches = list(loader.steps())[:3]
    for _ in range(3):
        exp.train_step(batches[0], optimizer)
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for i in range(steps):
        exp.train_step(batches[i % len(batches)], optimizer)
    if CUDA:
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2 ** 20 if CUDA else None
    return 1e3 * (time.perf_counter() - started) / steps, peak


@guarded
def keyed_dropout_cost(model, *extra):
    """Training step with sample-keyed (hashed) masks against F.dropout's fused masks, same model and batches."""
    out = {}
    for keyed in (True, False):
        exp = experiment("--model", model, *extra)
        exp.masks_follow_samples = exp.masks_follow_samples and keyed
        out["keyed" if keyed else "fused"] = step_ms(exp, train_loader(exp), steps=3 if CPU else 20)
    (k_ms, k_mib), (f_ms, f_mib) = out["keyed"], out["fused"]
    report(f"keyed_dropout_cost {model} {' '.join(extra)}", keyed_ms=round(k_ms, 3), fused_ms=round(f_ms, 3),
           slowdown=round(k_ms / f_ms, 2), keyed_peak_mib=k_mib, fused_peak_mib=f_mib, status="ok")


KEYED_STEP_TARGET = 1.2  # a keyed training step of a release against its unkeyed step, on a GPU


@guarded
def keyed_attention_release_step():
    """The first release of tests/test_foundation.py's RELEASES (the encoder-decoder whose base layer counts
    lab/bench_attention_dropout.py's RELEASE_STEP builds: 12 + 12 layers, 12 heads, 32 windows, horizon 96), a
    training step with keyed attention dropout on the fused path (every sample in one call) and with one SDPA per
    sample, against the unkeyed step; SLOW when the fused step exceeds KEYED_STEP_TARGET x the unkeyed one on a GPU."""
    from lab import bench_attention_dropout as bench
    from test_foundation import RELEASES

    model = next(iter(RELEASES))

    device = torch.device("cuda") if CUDA else torch.device("cpu")
    argv = ["--model", model, *bench.RELEASE_STEP, "--seq_len", 512 if CUDA else 64,
            "--use_gpu", str(CUDA).lower()]
    if not CUDA:  # the code path only: one layer each side, two windows
        argv += ["--e_layers", 1, "--d_layers", 1, "--batch_size", 2, "--pred_len", 16]
    found = bench.attention_paths(argv, device, rounds=3 if CUDA else 1, steps=5 if CUDA else 1,
                                  paths=("per_sample", "fused"))
    ratio = found["fused"][2] / found["plain"][2]
    report(f"keyed_attention_release_step {model}", **{
        name: {"sdpa_calls": sdpa, "aten_ops": ops, "ms": round(seconds * 1e3, 2)}
        for name, (sdpa, ops, seconds) in found.items()},
        fused_over_plain=round(ratio, 2), target=KEYED_STEP_TARGET,
        status=("SLOW" if ratio > KEYED_STEP_TARGET else "ok") if CUDA else "dry-run ok")


@guarded
def timesnet_eval_periods():
    """A validation pass of TimesNet with each window's own periods (default) against the batch's."""
    from data_provider.data_factory import data_provider

    out = {}
    for mode in ("window", "batch"):
        exp = experiment("--model", "TimesNet", "--times_eval_periods", mode, "--eval_batch_size", "128")
        _, loader = data_provider(exp.args, "val", exp.device)
        exp.vali(loader)  # warm-up
        if CUDA:
            torch.cuda.synchronize()
        started = time.perf_counter()
        loss = exp.vali(loader)
        out[mode] = (1e3 * (time.perf_counter() - started), loss)
    report("timesnet_eval_periods", window_ms=round(out["window"][0], 1), batch_ms=round(out["batch"][0], 1),
           ratio=round(out["window"][0] / out["batch"][0], 2), vali=[out["window"][1], out["batch"][1]], status="ok")


@guarded
def loader_workers_pinned():
    """--num_workers 2 on a GPU: batches gathered by worker processes into pinned memory (the DataLoader's pin
    thread copies the GlobalStep list subclass), its attributes kept, then a training step on them."""
    exp = experiment("--model", "PatchTST", "--batch_size", "16", "--num_workers", "2",
                     "--accumulation_steps", "2")
    loader = train_loader(exp)
    step = next(iter(loader.steps()))
    pinned = [t.is_pinned() for t in step[0] if torch.is_tensor(t)] if CUDA else None
    fields = {name: getattr(step, name, "MISSING") for name in ("windows", "epoch", "firsts", "uneven")}
    exp.model.train()
    loss_sum, _ = exp.train_step(step, exp.make_optimizer())
    ok = "MISSING" not in fields.values() and (pinned is None or all(pinned)) and bool(torch.isfinite(loss_sum))
    report("loader_workers_pinned", type=type(step).__name__, micro_batches=len(step), fields=fields,
           pinned=pinned, status="ok" if ok else "FAILED")


# ------------------------------------------------------------------ the releases, as users run them
_ETTH1 = {}


def _measured(fn, repeats):
    """(ms per call, peak MiB (CUDA) or None, synchronising CUDA calls per call or None) of `fn` after one warm-up
    call: the syncs counted by torch.cuda.set_sync_debug_mode."""
    fn()
    if not CUDA:
        started = time.perf_counter()
        for _ in range(repeats):
            fn()
        return 1e3 * (time.perf_counter() - started) / repeats, None, None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        started = time.perf_counter()
        try:
            for _ in range(repeats):
                fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - started) / repeats
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return ms, torch.cuda.max_memory_allocated() / 2 ** 20, syncs / repeats


def _release_run(argv, amp, batches=4, steps=3):
    """One release at one precision: (zero-shot (ms, peak, syncs) per eval batch, its first batch's forecast on
    the host, fine-tuning (ms, peak, syncs) per optimizer step). The eval batch's syncs: an evaluation of
    `batches` batches less one of a single batch (the evaluation's end reads its sums once)."""
    from data_provider.data_factory import data_provider
    from exp.adaptation import load_pretrained
    from exp.forward import forward
    from test_host_syncs import FirstBatches

    exp = experiment_of(argv, amp)
    load_pretrained(exp.raw_model, exp.args.pretrain_model_path, exp.device)  # zero-shot: the release's weights
    test = data_provider(exp.args, "test", exp.device)[1]
    loaders = {n: FirstBatches(test, n, exp.device) for n in (1, batches)}
    with torch.no_grad(), exp.autocast():
        exp.raw_model.eval()
        first = forward(exp.raw_model, loaders[1].batches[0], exp.args, "test", exp.device)[0].float().cpu()
    one = _measured(lambda: exp.evaluate(loaders[1], "test"), 1)
    many = _measured(lambda: exp.evaluate(loaders[batches], "test"), 1)
    zero_shot = ((many[0] - one[0]) / (batches - 1), many[1],
                 None if many[2] is None else (many[2] - one[2]) / (batches - 1))
    train = data_provider(exp.args, "train", exp.device)[1]
    train.set_epoch(1)
    step_list = list(zip(range(steps + 1), train.steps()))
    optimizer = exp.make_optimizer()
    exp.model.train()
    order = iter(step for _, step in step_list * 2)
    tune = _measured(lambda: exp.train_step(next(order), optimizer), steps)
    return zero_shot, first, tune


def experiment_of(argv, amp):
    from helpers import make_args, make_experiment

    amp_args = ("--use_amp", "--amp_dtype", "bf16") if amp else ()
    return make_experiment(make_args(*argv, *amp_args, "--use_gpu", "false" if CPU else "true"))


@guarded
def release(name):
    """A release zero-shot (eval batches) and fine-tuned (optimizer steps) in fp32 and bf16 on one device, from
    its tests' folder (tests/test_foundation.py's row): ms, peak memory and host syncs of each; on a GPU its fp32
    forecast against the CPU's (MISMATCH past 1e-4, a sampling release excepted: its draws are the device's).
    Without a GPU the same code runs on the CPU and the syncs are counted on the meta device
    (tests/test_host_syncs.py's recorder)."""
    import tempfile
    from pathlib import Path

    import pytest
    from helpers import write_etth1_shaped
    from test_foundation import RELEASES
    from test_host_syncs import argv_of, count_on_meta, syncs_of

    row = RELEASES[name]
    if "etth1" not in _ETTH1:
        _ETTH1["etth1"] = write_etth1_shaped(Path(tempfile.mkdtemp(prefix="gpu_probe_")) / "etth1")
    try:
        argv = [str(a) for a in argv_of(name, _ETTH1["etth1"], Path(tempfile.mkdtemp(prefix="gpu_probe_")) / "r")]
    except pytest.skip.Exception as exc:  # an optional package (chronos, timesfm, tirex ...) is missing
        report(f"release {name}", status="skipped", reason=str(exc))
        print(f"release {name}: skipped ({exc})", flush=True)
        return
    # bf16 autocast needs compute capability 8.0 (an older GPU runs fp32 alone, and its line says so)
    precisions = ("fp32", "bf16") if not CUDA or torch.cuda.is_bf16_supported() else ("fp32",)
    runs = {precision: _release_run(argv, amp=precision == "bf16") for precision in precisions}
    runs.setdefault("bf16", ((math.nan, None, None), runs["fp32"][1], (math.nan, None, None)))
    if CUDA:
        syncs = {f"{p} {part}": m[2] for p, run in runs.items() for part, m in (("batch", run[0]), ("step", run[2]))}
        cpu_first = _cpu_forecast(argv)
        diff = float((runs["fp32"][1] - cpu_first).abs().max())
        sampled = "--num_samples" in argv
        mismatch = not sampled and not diff <= 1e-4 * (1 + float(cpu_first.abs().max()))
    else:
        found = count_on_meta(argv)
        syncs = {"meta step + batch": syncs_of(found)}
        diff, mismatch = None, False
    too_many = any(count is not None and count > 0 for count in syncs.values())
    finite = all(bool(torch.isfinite(run[1]).all()) for run in runs.values())
    status = ("MISMATCH" if mismatch or not finite else "SYNCS" if too_many else "ok" if CUDA else "dry-run ok")
    fields = {f"{p}_{what}": value for p, run in runs.items()
              for what, value in (("zero_shot_ms", round(run[0][0], 2)), ("tune_ms", round(run[2][0], 2)),
                                  ("peak_mib", None if run[2][1] is None else round(max(run[0][1], run[2][1]))))}
    report(f"release {name}", **fields, syncs=syncs, fp32_vs_cpu=diff, finite=finite,
           status=status)
    where = "GPU" if CUDA else "this CPU (on a GPU: torch.cuda's ms, peak memory and set_sync_debug_mode's syncs)"
    print(f"release {name}: zero-shot {runs['fp32'][0][0]:.1f} / {runs['bf16'][0][0]:.1f} ms per eval batch, "
          f"fine-tuning {runs['fp32'][2][0]:.1f} / {runs['bf16'][2][0]:.1f} ms per step (fp32 / bf16) on {where}; "
          f"peak {fields['fp32_peak_mib']} / {fields['bf16_peak_mib']} MiB; syncs {syncs}; {status}",
          flush=True)


def _cpu_forecast(argv):
    """The first test batch's fp32 forecast on the CPU, the reference of the GPU's."""
    from data_provider.data_factory import data_provider
    from exp.adaptation import load_pretrained
    from exp.forward import forward
    from helpers import make_args, make_experiment

    exp = make_experiment(make_args(*argv, "--use_gpu", "false"))
    load_pretrained(exp.raw_model, exp.args.pretrain_model_path, exp.device)
    batch = next(iter(data_provider(exp.args, "test", exp.device)[1]))
    with torch.no_grad():
        return forward(exp.raw_model.eval(), batch, exp.args, "test", exp.device)[0].float()


def releases(names):
    for name in names:
        release(name)


FAILING = ("SYNCS", "MISMATCH", "ERROR", "FAILED", "SLOW")


def option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv[:-1] else default


def main():
    """Exit status 1 when a check reports SYNCS, MISMATCH, ERROR, FAILED or SLOW, else 0. --only releases|others runs
    one part (scripts/gpu_check.sh's steps); --releases A,B (or none) names the releases (default: every row of
    tests/test_foundation.py's RELEASES)."""
    from test_foundation import RELEASES

    only = option("--only", "all")
    chosen = option("--releases", ",".join(RELEASES))
    names = [] if chosen == "none" else chosen.split(",")
    unknown = sorted(set(names) - set(RELEASES))
    if unknown or only not in ("all", "releases", "others"):
        print(f"gpu_probe: --releases takes none or names of {', '.join(RELEASES)} ({', '.join(unknown)} unknown); "
              "--only takes releases or others", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    report("environment", torch=torch.__version__, cuda_build=torch.version.cuda, cuda_available=cuda,
           gpus=torch.cuda.device_count(), device=torch.cuda.get_device_name(0) if cuda else None, dry_run=CPU,
           status="ok")
    if not CUDA and not CPU:
        report("probe", status="SKIPPED", reason="no CUDA device (run with --cpu for a dry run of the code paths)")
        return 0
    if only in ("all", "releases"):  # first: what users run, before the zoo's own checks
        releases(names)
    if only in ("all", "others"):
        others()
    bad = [r for r in RESULTS if r.get("status") in FAILING]
    print(f"# probe: {len(RESULTS)} results, {len(bad)} failing ({', '.join(r['check'] for r in bad) or 'none'})",
          flush=True)
    return 1 if bad else 0


def others():
    hashed_masks_match_cpu()
    # host syncs per training step: expected 0 except TimesNet (.tolist() of its periods, a positive control)
    host_syncs("DLinear")
    host_syncs("PatchTST")
    host_syncs("TimerXL", "--clip_grad", "1.0")
    host_syncs("iTransformer", "--use_amp")
    host_syncs("TiDE")
    host_syncs("TimeMixer")
    if CUDA:  # fp16 autocast is GPU-only here (run.py refuses it on the CPU)
        host_syncs("DLinear", "--use_amp", "--amp_dtype", "fp16", "--clip_grad", "1.0")
    host_syncs("TimerXL", feistel=True)  # the O(1)-memory order: pinned, non_blocking (was a sync a step)
    # batches gathered in host memory (a corpus's case: the order on the host, each batch pinned, then copied)
    host_syncs("DLinear", "--data_on_device", "never")
    host_syncs("TimerXL", "--data_on_device", "never", feistel=True)
    host_syncs("TimesNet", expected=True)  # positive control: .tolist() per TimesBlock
    # what keying the masks costs on the device (launch-bound small models vs a wider one)
    keyed_dropout_cost("iTransformer")
    if CUDA:  # GPU-sized settings (a CPU dry run only checks the code path above)
        keyed_dropout_cost("PatchTST", "--batch_size", "128", "--d_model", "128", "--d_ff", "256", "--e_layers", "3",
                           "--n_heads", "16")
        keyed_dropout_cost("TimerXL", "--batch_size", "64", "--d_model", "256", "--d_ff", "512", "--e_layers", "4")
        # many tokens (64 variables x 20 patches = 1280): keyed training forms [B, H, S, S] scores, a float32 mask
        # and int64 hash temporaries, where F.scaled_dot_product_attention's fused kernel keeps O(S) per query
        keyed_dropout_cost("TimerXL", "--batch_size", "16", "--synthetic_channels", "64", "--seq_len", "480",
                           "--d_model", "64", "--n_heads", "8", "--e_layers", "1")
    keyed_attention_release_step()
    timesnet_eval_periods()
    loader_workers_pinned()


if __name__ == "__main__":
    sys.exit(main())
