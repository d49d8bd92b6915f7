"""--data corpus: a corpus built on disk gives --data univariate's windows, per-window errors and metrics
from memory-mapped shards; a build that stops continues; bad corpora are refused in one line."""
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid

import numpy as np
import pandas as pd
import pytest
import torch

import data_provider.corpus as corpus_module
from data_provider import data_factory
from data_provider.corpus import INDEX, STATE, CorpusData, build, main as corpus_main
from data_provider.synthetic import make_synthetic
from data_provider.windows import Window
from helpers import SMALL_TIMERXL, assert_ok, assert_one_error_line, make_args, records, run_cli, warm_context
from utils.errors import UserError

TIMERXL = [*SMALL_TIMERXL, "--input_token_len", 24, "--output_token_len", 24, "--seq_len", 96, "--num_threads", 1]


def _sources(folder):
    """Three files of three formats: 3 + 2 + 1 series, one too short for a training window of 120 rows."""
    folder.mkdir(parents=True)
    make_synthetic(rows=1500, channels=3, seed=7).to_csv(folder / "a.csv", index=False)
    np.save(folder / "b.npy", np.cumsum(np.random.default_rng(0).normal(size=(1200, 2)), axis=0))
    np.save(folder / "c.npy", np.arange(150.0))
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(sources folder, corpus folder): the corpus built in shards of about 1300 points."""
    tmp = tmp_path_factory.mktemp("corpus")
    src = _sources(tmp / "src")
    build(str(tmp / "out"), [str(src / "*")], shard_mb=0.005, progress=False)
    return src, tmp / "out"


def _univariate(src, *argv):
    data_factory._prepared_cache.clear()
    return data_factory.prepared_data(make_args("--data", "univariate", "--root_path", src, "--data_path", "*", *argv))


def _corpus(out, *argv):
    data_factory._prepared_cache.clear()
    return data_factory.prepared_data(make_args("--data", "corpus", "--root_path", out, *argv))


@pytest.mark.parametrize("window", [Window(96, 48, 72), Window(96, 24, 96)], ids=["direct", "tokens"])
def test_the_corpus_gives_univariates_windows_with_the_same_ids(corpus, window):
    src, out = corpus
    index = json.loads((out / INDEX).read_text())
    assert len(index["shards"]) > 1 and len(index["series"]) == 6  # several shards, every series
    limit = int(0.005 * 2**20) // 4  # --shard_mb 0.005, in float32 points
    for number, shard in enumerate(index["shards"]):  # full shards, each at most the limit unless one series is longer
        inside = [s["length"] for s in index["series"] if s["shard"] == number]
        assert sum(inside) == shard["points"] and (shard["points"] <= limit or len(inside) == 1), (number, inside)
        if number + 1 < len(index["shards"]):  # a new shard starts only when the next series would not fit
            following = next(s["length"] for s in index["series"] if s["shard"] == number + 1)
            assert shard["points"] + following > limit, (number, shard["points"], following)
    memory, mapped = _univariate(src), _corpus(out)
    for flag in ("train", "val", "test"):
        expected, got = memory.window_dataset(flag, window), mapped.window_dataset(flag, window)
        assert len(got) == len(expected) > 0, flag
        ids = torch.randperm(len(got), generator=torch.Generator().manual_seed(0))  # any order, any mix
        for a, b in zip(expected.__getitems__(ids), got.__getitems__(ids)):
            assert torch.equal(a, b), flag
    train = mapped.window_dataset("train", window)
    with pytest.raises(IndexError, match="window ids out of range"):
        train.__getitems__([len(train)])


def test_a_training_run_on_the_corpus_is_the_univariate_run(tmp_path, corpus):
    """Same windows in the same order, so the same training, per-window errors and metrics (2 processes)."""
    src, out = corpus
    common = [*TIMERXL, "--train_epochs", 1, "--features", "S"]
    assert_ok(run_cli(tmp_path / "memory", *common, "--data", "univariate", "--root_path", src, "--data_path", "*",
                      nproc=2))
    assert_ok(run_cli(tmp_path / "mapped", *common, "--data", "corpus", "--root_path", out, nproc=2))
    memory, mapped = records(tmp_path / "memory")[-1], records(tmp_path / "mapped")[-1]
    for key in ("mse", "mae", "rmse", "vali_loss", "test_windows", "train_windows"):
        assert mapped[key] == memory[key], key
    errors = [(folder / "results" / record["setting"] / "window_errors.csv").read_text()
              for folder, record in ((tmp_path / "memory", memory), (tmp_path / "mapped", mapped))]
    assert errors[0] == errors[1]


def test_a_stopped_build_continues_to_the_same_corpus(tmp_path, monkeypatch):
    src = _sources(tmp_path / "src")
    straight = build(str(tmp_path / "straight"), [str(src)], shard_mb=0.005, progress=False)
    import data_provider.corpus as corpus_module

    read = corpus_module.series_of
    calls = []

    def dies_on_the_third_file(path, *options):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the build is stopped while reading c.npy
        return read(path, *options)

    monkeypatch.setattr(corpus_module, "series_of", dies_on_the_third_file)
    with pytest.raises(KeyboardInterrupt):
        build(str(tmp_path / "stopped"), [str(src)], shard_mb=0.005, progress=False)
    assert (tmp_path / "stopped" / STATE).exists() and not (tmp_path / "stopped" / INDEX).exists()
    with pytest.raises(UserError, match="its build did not finish: run the same"):
        CorpusData(str(tmp_path / "stopped"))
    monkeypatch.setattr(corpus_module, "series_of", read)
    # a kill while writing c.npy's series may leave a shard begun after the last recorded file: redone
    build_id = json.loads((tmp_path / "stopped" / STATE).read_text())["build_id"]
    (tmp_path / "stopped" / corpus_module._shard_name(build_id, 99)).write_bytes(b"half a shard")
    with open(tmp_path / "stopped" / corpus_module.JOURNAL, "a") as journal:  # and records of that file, cut off
        journal.write('{"name": "c.npy:0", "shard": 0, "off')
    resumed = build(str(tmp_path / "stopped"), [str(src)], shard_mb=0.005, progress=False)
    assert not (tmp_path / "stopped" / STATE).exists()
    assert sorted(p.name for p in (tmp_path / "stopped").iterdir()) == sorted(
        [INDEX] + [s["file"] for s in resumed["shards"]])  # nothing of the stopped attempt left over
    assert _content(tmp_path / "stopped") == _content(tmp_path / "straight")


def _content(folder):
    """A built corpus' values, series table (names without their folder) and shard sizes (the build's id aside)."""
    index = json.loads((folder / INDEX).read_text())
    shards = b"".join((folder / s["file"]).read_bytes() for s in index["shards"])
    series = [dict(s, name=os.path.basename(s["name"])) for s in index["series"]]
    return shards, series, [s["points"] for s in index["shards"]]


# ---------------------------------------------------------------- one build per folder
def _build_held_at_its_second_file(out, src, go):
    """In a forked process: build `src` into `out`, holding before the second source file until the file
    `go` exists (a minute at most); `go`.waiting says it holds."""
    read, calls = corpus_module.series_of, []

    def held(path, *options):
        calls.append(path)
        if len(calls) == 2:
            open(f"{go}.waiting", "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.02)
        return read(path, *options)

    corpus_module.series_of = held
    build(out, [src], shard_mb=0.005, progress=False)


def _a_held_build(tmp_path):
    """(the sources, the folder, the go file, the builder's process), once the builder holds the folder."""
    src = _sources(tmp_path / "src")
    out, go = tmp_path / "out", tmp_path / "go"
    builder = warm_context().Process(target=_build_held_at_its_second_file, args=(str(out), str(src), str(go)))
    builder.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(f"{go}.waiting") and builder.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert os.path.exists(f"{go}.waiting"), f"the first build never reached its second file ({builder.exitcode})"
    return src, out, go, builder


def test_a_second_build_into_the_folder_is_refused_naming_the_first(tmp_path, capsys):
    """Before: two builds into one folder at once left an index of some series and an orphaned shard, or
    crashed with a FileNotFoundError traceback and an index listing the series twice. Now the second stops
    in one line naming the first (pid, host, start), and the first finishes its corpus untouched."""
    build(str(tmp_path / "straight"), [str(_sources(tmp_path / "straight_src"))], shard_mb=0.005, progress=False)
    src, out, go, first = _a_held_build(tmp_path)
    try:
        assert _cli("build", out, src, "--shard_mb", 0.005) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and "Traceback" not in err, err
        assert (f"error: {out} is being built by another `python -m data_provider.corpus build` (pid {first.pid} on "
                f"{socket.gethostname()}, started ") in err and "wait for it to end, or build into another folder" in err
        open(go, "w").close()
        first.join(60)
    finally:
        if first.is_alive():
            first.kill()
            first.join()
    assert first.exitcode == 0
    assert _content(out) == _content(tmp_path / "straight")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [INDEX, *(s["file"] for s in json.loads((out / INDEX).read_text())["shards"])])  # no lock file left


def test_a_killed_builds_lock_does_not_block_the_command_that_continues_it(tmp_path):
    """The kernel drops a dead builder's flock: its lock file (naming it) stays, and the same command takes
    the folder and continues the build to the straight build's corpus."""
    build(str(tmp_path / "straight"), [str(_sources(tmp_path / "straight_src"))], shard_mb=0.005, progress=False)
    src, out, _, first = _a_held_build(tmp_path)
    os.kill(first.pid, signal.SIGKILL)
    first.join()
    assert f"pid {first.pid} on " in (out / corpus_module.LOCK).read_text()
    build(str(out), [str(src)], shard_mb=0.005, progress=False)
    assert _content(out) == _content(tmp_path / "straight")
    assert not (out / corpus_module.LOCK).exists()


def _cli(*argv):
    return corpus_main([str(a) for a in argv])


@pytest.mark.parametrize("case, message", [
    ("empty", "empty.csv is empty"),
    ("text", "column 'v' is not numeric"),
    ("none", "matches no file"),
    ("other", "also name"),
])
def test_bad_sources_stop_the_build_in_one_line(tmp_path, capsys, case, message):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.csv").write_text("v\n" + "\n".join(map(str, range(300))) + "\n")
    source = str(src / "*")
    if case == "empty":
        (src / "empty.csv").write_text("")
    elif case == "text":
        (src / "text.csv").write_text("v\n1\nabc\n")
    elif case == "none":
        source = str(src / "*.parquet")
    else:
        (src / "notes.md").write_text("hello")
    assert _cli("build", tmp_path / "out", source) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / INDEX).exists()


def test_a_csv_whose_header_is_pandas_column_numbers_gives_series_of_its_rows(tmp_path):
    """pd.DataFrame(array).to_csv(path, index=False) writes the header 0,1,2, once read as a first row of data:
    3 001 points a series for 3 000. The series are the .npy's, point for point."""
    array = np.random.default_rng(0).normal(size=(3000, 3))
    (tmp_path / "csv").mkdir()
    (tmp_path / "npy").mkdir()
    pd.DataFrame(array).to_csv(tmp_path / "csv" / "a.csv", index=False)
    np.save(tmp_path / "npy" / "a.npy", array)
    assert _cli("build", tmp_path / "from_csv", tmp_path / "csv" / "*") == 0
    assert _cli("build", tmp_path / "from_npy", tmp_path / "npy" / "*") == 0
    built = {kind: json.loads((tmp_path / kind / INDEX).read_text()) for kind in ("from_csv", "from_npy")}
    assert [s["length"] for s in built["from_csv"]["series"]] == [3000, 3000, 3000]
    assert [(s["ends"], s["mean"], s["std"]) for s in built["from_csv"]["series"]] == \
        [(s["ends"], s["mean"], s["std"]) for s in built["from_npy"]["series"]]


def test_a_finished_corpus_is_not_built_over(tmp_path, corpus, capsys):
    src, out = corpus
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    assert _cli("build", copy, src / "*") == 2
    assert "already holds a finished corpus" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before


def test_scaling_must_match_the_build(tmp_path, corpus):
    src, out = corpus
    with pytest.raises(UserError, match="was built scaled, but --scale is false; rebuild it without"):
        _corpus(out, "--scale", "false")
    unscaled = build(str(tmp_path / "raw"), [str(src / "*")], scale=False, progress=False)
    assert unscaled["scaled"] is False
    data = _corpus(tmp_path / "raw", "--scale", "false")
    first = data.window_dataset("train", Window(10, 0, 10)).__getitems__([0])[0][0, :, 0]
    np.testing.assert_allclose(first.numpy(), make_synthetic(rows=1500, channels=3, seed=7).iloc[:10, 1], rtol=1e-6)


def test_parquet_sources_give_the_csvs_series(tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow reads .parquet/.arrow sources")
    frame = make_synthetic(rows=800, channels=2, seed=3)
    (tmp_path / "csv").mkdir()
    (tmp_path / "pq").mkdir()
    frame.to_csv(tmp_path / "csv" / "s.csv", index=False)
    frame.drop(columns="date").to_parquet(tmp_path / "pq" / "s.parquet")
    # LOTSA / Chronos layout: one series per row of a `target` list column
    pd.DataFrame({"target": [frame.iloc[:, 1].to_list(), frame.iloc[:600, 2].to_list()]}).to_parquet(
        tmp_path / "pq" / "t.parquet")
    build(str(tmp_path / "a"), [str(tmp_path / "csv")], progress=False)
    from_parquet = build(str(tmp_path / "b"), [str(tmp_path / "pq")], progress=False)
    assert [s["length"] for s in from_parquet["series"]] == [800, 800, 800, 600]
    a = np.fromfile(next((tmp_path / "a").glob("*.bin")), dtype="<f4")
    b = np.fromfile(next((tmp_path / "b").glob("*.bin")), dtype="<f4")
    np.testing.assert_array_equal(b[:1600], a)  # the numeric columns: the CSV's series, scaled alike
    np.testing.assert_array_equal(b[1600:2400], a[:800])  # a row's target is its series
    assert from_parquet["series"][3]["name"].endswith("t.parquet:1:0") and not os.path.exists(tmp_path / "b" / STATE)


def test_a_list_column_beside_an_id_column_gives_one_series_per_row(tmp_path):
    """GIFT-Eval's and Chronos' layout under another name: an integer id and a list column of series. The id
    is not a series; every row of the list column is one, with its own length and values (as before the fix:
    "1 series, 5 points", the id column)."""
    pytest.importorskip("pyarrow", reason="pyarrow reads .parquet/.arrow sources")
    rng = np.random.default_rng(5)
    rows = [rng.normal(size=n).cumsum() for n in (200, 200, 150, 200, 180)]
    pd.DataFrame({"id": range(5), "values": [r.tolist() for r in rows]}).to_parquet(tmp_path / "s.parquet")
    index = build(str(tmp_path / "out"), [str(tmp_path / "s.parquet")], scale=False, progress=False)
    assert [s["length"] for s in index["series"]] == [200, 200, 150, 200, 180]
    assert [s["name"].rsplit(":", 2)[1] for s in index["series"]] == ["0", "1", "2", "3", "4"]
    stored = np.fromfile(next((tmp_path / "out").glob("*.bin")), dtype="<f4")
    np.testing.assert_array_equal(stored, np.concatenate(rows).astype(np.float32))
    # scaled, each row is split and scaled as a series of its own, as the same values in .npy files are
    for i, r in enumerate(rows):
        np.save(tmp_path / f"row{i}.npy", r)
    scaled = build(str(tmp_path / "scaled"), [str(tmp_path / "s.parquet")], progress=False)
    npy = build(str(tmp_path / "npy"), [str(tmp_path / "row*.npy")], progress=False)
    assert [(s["ends"], s["mean"], s["std"]) for s in scaled["series"]] == [
        (s["ends"], s["mean"], s["std"]) for s in npy["series"]]
    assert (next((tmp_path / "scaled").glob("*.bin")).read_bytes()
            == next((tmp_path / "npy").glob("*.bin")).read_bytes())


def _parquet(folder, columns):
    folder.mkdir()
    pd.DataFrame(columns).to_parquet(folder / "s.parquet")
    return folder / "s.parquet"


def test_list_columns_are_taken_by_rule_or_by_name(tmp_path, capsys):
    """'target' wins; several list columns without a 'target' are refused in one line naming them, and
    --column picks one; a list of lists is one series per inner list (channels first, as LOTSA)."""
    pytest.importorskip("pyarrow", reason="pyarrow reads .parquet/.arrow sources")
    a, b = np.arange(300.0), 1000 + np.arange(300.0)
    both = _parquet(tmp_path / "two", {"id": [7], "a": [a.tolist()], "b": [b.tolist()]})
    assert _cli("build", tmp_path / "refused", both) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert "has several list columns (a, b) and none named 'target'; name the one that holds the series with " \
           "--column NAME" in err, err
    assert not (tmp_path / "refused" / INDEX).exists()
    for column, values in (("a", a), ("b", b)):
        assert _cli("build", tmp_path / column, both, "--column", column, "--no_scale") == 0
        np.testing.assert_array_equal(np.fromfile(next((tmp_path / column).glob("*.bin")), "<f4"), values)
    targeted = _parquet(tmp_path / "target", {"other": [a.tolist()], "target": [[a.tolist(), b.tolist()]]})
    index = build(str(tmp_path / "channels"), [str(targeted)], scale=False, progress=False)
    assert [s["name"].rsplit(":", 2)[1:] for s in index["series"]] == [["0", "0"], ["0", "1"]]
    np.testing.assert_array_equal(np.fromfile(next((tmp_path / "channels").glob("*.bin")), "<f4"),
                                  np.concatenate([a, b]))


@pytest.mark.parametrize("case, message", [
    ("no such column", "has no list column 'c' (--column); its list columns: a"),
    ("lists of text", "list column 'a' holds string values, not numbers or lists of numbers"),
    ("a null row", "row 1's 'a' is null; drop that row"),
    ("channels of two lengths", "row 0's 'a' holds channels of different lengths ([300, 2])"),
])
def test_list_columns_that_hold_no_series_are_refused_in_one_line(tmp_path, capsys, case, message):
    pytest.importorskip("pyarrow", reason="pyarrow reads .parquet/.arrow sources")
    rows = {"no such column": [list(range(300))], "lists of text": [["x", "y"]], "a null row": [list(range(300)), None],
            "channels of two lengths": [[list(range(300)), [1, 2]]]}[case]
    source = _parquet(tmp_path / "src", {"a": rows})
    assert _cli("build", tmp_path / "out", source, *(["--column", "c"] if case == "no such column" else [])) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / INDEX).exists()


# ---------------------------------------------------------------- the series table of index.json
@pytest.fixture(scope="module")
def one_shard(tmp_path_factory):
    """The corpus fixture's sources in one shard: series 0-2 of 1500 points, 3-4 of 1200, 5 of 150."""
    tmp = tmp_path_factory.mktemp("one_shard")
    build(str(tmp / "out"), [str(_sources(tmp / "src"))], shard_mb=1, progress=False)
    return tmp / "out"


def _grow(series, by, length=True):
    series["ends"][2] += by
    series["length"] += by if length else 0


# (which corpus, the edit of index.json, the error): in the `corpus` fixture every series has a shard of its own
TABLE_DAMAGES = {
    "ends past a shard": ("shards", lambda t: _grow(t["series"][0], 100), "runs to point 1600 of shard "),
    "ends into the next series": ("one shard", lambda t: _grow(t["series"][0], 50, length=False),
                                  "has split ends [1050, 1200, 1550], which do not rise to its length 1500"),
    "ends past the last shard": ("shards", lambda t: _grow(t["series"][5], 1000), "runs to point 1150 of shard "),
    "series moved onto the one before": ("one shard", lambda t: t["series"][1].update(offset=1490),
                                         "starts at point 1490 of shard "),  # where series 0 ends at point 1500
    "series after the last shard": ("shards", lambda t: t["series"][5].update(shard=99),
                                    "names shard 99, but the index lists 6 shards"),
    "split border moved": ("one shard", lambda t: t["series"][0]["ends"].__setitem__(0, 1000),
                           "is not the one its build wrote"),
    "scaler edited": ("one shard", lambda t: t["series"][2].update(mean=0.5), "is not the one its build wrote"),
    "a field gone": ("shards", lambda t: t["series"][3].pop("ends"), "(KeyError: an entry without a number for"),
}


def _edited_copy(source, folder, edit):
    shutil.copytree(source, folder)
    index = json.loads((folder / INDEX).read_text())
    edit(index)
    (folder / INDEX).write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("damage", TABLE_DAMAGES)
def test_an_edited_series_table_is_refused_when_the_corpus_opens(tmp_path, corpus, one_shard, damage):
    """Before: the windows of an edited series read the next series' or shard's values (exit 0), or an
    IndexError came mid-epoch past the last shard. Now opening refuses it in one line naming the series."""
    layout, edit, message = TABLE_DAMAGES[damage]
    folder = _edited_copy(corpus[1] if layout == "shards" else one_shard, tmp_path / "edited", edit)
    with pytest.raises(UserError, match="index.json's series table is") as refused:
        CorpusData(str(folder))
    assert message in str(refused.value) and "copy the whole folder again from its build, or rebuild" in str(
        refused.value), refused.value


def test_an_index_from_before_the_checksum_is_checked_without_it(tmp_path, one_shard):
    """index.json from a build before series_sha256: opened, its table checked for consistency only (a moved
    split border is not seen; an inconsistent edit still is)."""
    def without_digest(index):
        del index["series_sha256"]

    old = _edited_copy(one_shard, tmp_path / "old", without_digest)
    assert CorpusData(str(old)).ends.tolist() == CorpusData(str(one_shard)).ends.tolist()
    moved = _edited_copy(old, tmp_path / "moved", TABLE_DAMAGES["split border moved"][1])
    assert CorpusData(str(moved)).ends[0, 0] == 1000
    grown = _edited_copy(old, tmp_path / "grown", TABLE_DAMAGES["ends into the next series"][1])
    with pytest.raises(UserError, match="which do not rise to its length 1500"):
        CorpusData(str(grown))


# ---------------------------------------------------------------- Time-MoE's layout (Time-300B), read as it is
def _write_time_moe(folder, series, chunks, normalised=(), dtype="float32"):
    """A folder in Time-MoE's binary layout, written as its conversion script lays it out (test-only writer):
    the sequences end to end, cut into `chunks` files data-<i>-of-<n>.bin of equal length (the last shorter)
    wherever the sequence boundaries fall; meta.json maps each file to its number of values (listed in name
    order, so data-10 before data-2) and gives each sequence's offset and length, with mean and std for the
    sequences in `normalised`, which are stored as (x - mean) / std. Little-endian values of `dtype`."""
    folder.mkdir(parents=True)
    scales, stored, offset = [], [], 0
    for i, values in enumerate(series):
        entry = {"offset": offset, "length": len(values)}
        if i in normalised:
            mean, std = float(values.mean()), float(values.std())
            values = (values - mean) / std
            entry.update(mean=mean, std=std)
        scales.append(entry)
        stored.append(values)
        offset += len(values)
    flat = np.concatenate(stored).astype(np.dtype(dtype).newbyteorder("<"))
    step = -(-len(flat) // chunks)
    files = {}
    for i in range(chunks):
        name = f"data-{i + 1}-of-{chunks}.bin"
        (folder / name).write_bytes(flat[i * step:(i + 1) * step].tobytes())
        files[name] = len(flat[i * step:(i + 1) * step])
    meta = {"num_sequences": len(series), "dtype": dtype, "files": dict(sorted(files.items())), "scales": scales}
    (folder / "meta.json").write_text(json.dumps(meta))
    # each sequence as Time-MoE's BinaryDataset returns it: x * std + mean in the files' dtype
    return [s.astype(dtype) * np.dtype(dtype).type(e["std"]) + np.dtype(dtype).type(e["mean"]) if "mean" in e
            else s.astype(dtype) for s, e in zip(stored, scales)]


def _time_moe_series():
    """Six sequences (float32 values): random walks and cycles, one on a large offset, one too short for a
    validation window."""
    rng = np.random.default_rng(11)
    lengths = (900, 1300, 150, 700, 1000, 800)
    series = [np.cumsum(rng.normal(size=n)) + 10 * np.sin(np.arange(n) / 7) for n in lengths]
    series[3] = series[3] + 1e4
    return [s.astype(np.float32) for s in series]


@pytest.fixture(scope="module")
def time_moe(tmp_path_factory):
    """{layout: folder} of the same sequences in Time-MoE's layout (one folder of 11 files, and Time-300B's
    tree of two data sets of 5 and 4 files), beside the corpora `build` makes of them (scaled and not), one
    single-column .npy per sequence in the same order."""
    tmp = tmp_path_factory.mktemp("time_moe")
    series = _time_moe_series()
    one = _write_time_moe(tmp / "one", series, chunks=11, normalised=(1,))
    tree = (_write_time_moe(tmp / "tree" / "energy" / "a", series[:4], chunks=5, normalised=(1,))
            + _write_time_moe(tmp / "tree" / "web" / "b", series[4:], chunks=4))
    src = tmp / "src"
    src.mkdir()
    for i, (a, b) in enumerate(zip(one, tree)):
        np.testing.assert_array_equal(a, b)
        np.save(src / f"s{i:02d}.npy", a)
    build(str(tmp / "built"), [str(src)], shard_mb=0.005, progress=False)
    build(str(tmp / "raw"), [str(src)], scale=False, progress=False)
    return {"one": tmp / "one", "tree": tmp / "tree", "built": tmp / "built", "raw": tmp / "raw"}


@pytest.mark.parametrize("layout", ["one", "tree"])
@pytest.mark.parametrize("scale", [True, False], ids=["scaled", "unscaled"])
@pytest.mark.parametrize("window", [Window(96, 48, 72), Window(96, 24, 96)], ids=["direct", "tokens"])
def test_time_moes_layout_gives_the_built_corpus_windows(time_moe, layout, scale, window):
    """Every window of every split, bit for bit the windows `build` makes of the same sequences: the same
    split borders, scalers from each sequence's training part, Time-MoE's stored normalisation undone; none
    runs from one sequence into the next, and those that run over a file boundary are read whole."""
    built = _corpus(time_moe["built" if scale else "raw"], "--scale", scale)
    mapped = _corpus(time_moe[layout], "--scale", scale)
    assert isinstance(mapped, corpus_module.TimeMoEData) and len(mapped.ends) == 6
    for flag in ("train", "val", "test"):
        expected, got = built.window_dataset(flag, window), mapped.window_dataset(flag, window)
        assert len(got) == len(expected) > 0, flag
        starts = np.concatenate([np.arange(f, f + n) for f, n in zip(got.first_row, np.diff(got.ends_before))])
        files = [np.searchsorted(mapped.file_start, at, side="right") for at in (starts, starts + window.span - 1)]
        assert (files[0] != files[1]).any(), f"no {flag} window crosses a file boundary"
        ids = torch.randperm(len(got), generator=torch.Generator().manual_seed(0))
        for a, b in zip(expected.__getitems__(ids), got.__getitems__(ids)):
            assert torch.equal(a, b), flag
    assert not np.isnan(mapped.mean).any() if scale else mapped.mean is None  # each computed once, when read


def test_a_training_run_on_time_moes_layout_is_the_built_corpus_run(tmp_path, time_moe):
    """The same windows in the same order: the same training, per-window errors and metrics (2 processes,
    each computing the scalers of the sequences it reads)."""
    common = [*TIMERXL, "--train_epochs", 1, "--features", "S", "--data", "corpus", "--batch_size", 64]
    assert_ok(run_cli(tmp_path / "built", *common, "--root_path", time_moe["built"], nproc=2))
    assert_ok(run_cli(tmp_path / "moe", *common, "--root_path", time_moe["tree"], nproc=2))
    built, moe = records(tmp_path / "built")[-1], records(tmp_path / "moe")[-1]
    for key in ("mse", "mae", "rmse", "vali_loss", "test_windows", "train_windows"):
        assert moe[key] == built[key], key
    errors = [(folder / "results" / record["setting"] / "window_errors.csv").read_text()
              for folder, record in ((tmp_path / "built", built), (tmp_path / "moe", moe))]
    assert errors[0] == errors[1]


def test_train_statistics_are_the_standard_scalers_bit_for_bit():
    """A Time-MoE sequence's scaler, computed as it is first read, is the one `build` fits with sklearn."""
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(5)
    cases = [rng.normal(size=n) for n in (1, 2, 3, 7, 100, 1001, 8195)]
    cases += [np.full(50, 5.0), np.zeros(9), 1e8 + rng.normal(size=300), rng.normal(size=500).astype(np.float32),
              np.cumsum(rng.normal(size=3000)) * 1e-6, np.array([-0.0, -0.0]),
              1e10 + 1e-6 * rng.normal(size=300),  # near constant: sklearn's bound makes its std 1
              1e6 + 1e-4 * rng.normal(size=777)]  # the mean's rounding error: the two-pass correction term
    for values in cases:
        values = values.astype(np.float64)
        scaler = StandardScaler().fit(values[:, None])
        assert corpus_module.train_statistics(values) == (scaler.mean_[0], scaler.scale_[0]), len(values)


@pytest.mark.parametrize("case, message", [
    ("missing bin", "meta.json names data-3-of-11.bin, which is missing from"),
    ("short bin", "data-11-of-11.bin holds 100 bytes, "),
    ("misnamed bin", "'files' entry 'part-3.bin': "),
    ("negative count", "'files' entry 'data-11-of-11.bin': -1 is not data-<i>-of-<n>.bin: <number of values>"),
    ("unknown dtype", "dtype 'bfloat16' is not one this reader knows (float16, float32, float64)"),
    ("no scales", "meta.json lacks 'scales': Time-MoE's meta.json has num_sequences, dtype, files, scales"),
    ("past the end", "sequence 5 (offset 4850, length 800) ends past the 4850 values its .bin files hold"),
    ("both layouts", "holds both a built corpus (index.json) and Time-MoE's meta.json; give a folder of one layout"),
    ("both layouts, nested", "holds both a built corpus (index.json) and Time-MoE's meta.json (under "),
    ("neither", "holds no corpus (index.json is missing; build one with `python -m data_provider.corpus build "
                "OUT_DIR SOURCES`, or give a folder in Time-MoE's layout, meta.json beside data-*-of-*.bin files)"),
])
def test_bad_time_moe_folders_fail_in_one_line(tmp_path, time_moe, case, message):
    folder = tmp_path / "moe"
    shutil.copytree(time_moe["one"], folder)
    meta = json.loads((folder / "meta.json").read_text())
    if case == "missing bin":
        (folder / "data-3-of-11.bin").unlink()
    elif case == "short bin":
        (folder / "data-11-of-11.bin").write_bytes((folder / "data-11-of-11.bin").read_bytes()[:100])
        count, dtype = meta["files"]["data-11-of-11.bin"], np.dtype(meta["dtype"])
        message += (f"{folder / 'meta.json'} says {count} {dtype.name} values ({count * dtype.itemsize} bytes); "
                    "download it again")
    elif case == "both layouts":
        shutil.copy(time_moe["built"] / INDEX, folder / INDEX)
    elif case == "both layouts, nested":  # Time-300B's tree: the meta.json a folder down
        shutil.move(folder, tmp_path / "part")
        folder.mkdir()
        shutil.move(tmp_path / "part", folder / "part")
        shutil.copy(time_moe["built"] / INDEX, folder / INDEX)
        message += f"{folder / 'part'}); give a folder of one layout"
    elif case == "neither":
        shutil.rmtree(folder)
        folder.mkdir()
        (folder / "data-1-of-1.bin").write_bytes(b"\0" * 8)
    else:
        if case == "misnamed bin":
            meta["files"] = {("part-3.bin" if name == "data-3-of-11.bin" else name): count
                             for name, count in meta["files"].items()}
            message += f"{meta['files']['part-3.bin']} is not data-<i>-of-<n>.bin: <number of values>"
        elif case == "negative count":
            meta["files"]["data-11-of-11.bin"] = -1
        elif case == "unknown dtype":
            meta["dtype"] = "bfloat16"
        elif case == "no scales":
            del meta["scales"]
        else:
            meta["scales"][-1]["offset"] = 4850
        (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError) as refused:
        _corpus(folder)
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_features_ms_on_a_corpus_is_refused_as_typed():
    from data_provider.corpus import prepare_corpus

    with pytest.raises(UserError) as refused:
        prepare_corpus(make_args("--data", "corpus", "--features", "MS", "--root_path", "/nowhere"))
    assert str(refused.value) == ("--data corpus holds univariate series, so there are no covariates for "
                                  "--features MS; use --features S")


def test_a_bad_time_moe_folder_ends_run_py_in_one_line(tmp_path, time_moe):
    folder = tmp_path / "moe"
    shutil.copytree(time_moe["one"], folder)
    (folder / "data-7-of-11.bin").write_bytes(b"\0" * 12)
    proc = run_cli(tmp_path, *TIMERXL, "--features", "S", "--data", "corpus", "--root_path", folder)
    assert_one_error_line(proc, "data-7-of-11.bin holds 12 bytes, ")


def _cut_as_training_starts(argv, env, stdout_path, stderr_path, value_file):
    """helpers._run_py_child (python run.py argv), with `value_file` cut to 100 bytes as training starts: after
    the check at opening (its size against the index), before the first read. Every rank cuts it, so every rank
    reads after the cut, as when a file is copied over a shard between two steps."""
    import multiprocessing

    from data_provider import windows
    from helpers import _run_py_child

    # loader workers forked, as python run.py starts them on Linux (a child of the fork server would start them
    # through a fork server of its own: workers that outlive the run, and a data set pickled, not inherited)
    multiprocessing.set_start_method("fork", force=True)
    steps = windows.TrainLoader.steps

    def cut_then_steps(self, start=0):
        os.truncate(value_file, 100)
        return steps(self, start)

    windows.TrainLoader.steps = cut_then_steps
    _run_py_child(argv, env, stdout_path, stderr_path)


def _run_with_a_value_file_cut(tmp_path, value_file, nproc, argv, env=None, per_rank=None):
    """run.py on `nproc` processes forked from the warm server (with torchrun's variables when nproc > 1), each
    cutting `value_file` as training starts; every process left to end by itself. `per_rank`: (argv, file to cut)
    for each rank instead. (stdout, stderr, exit codes)."""
    from helpers import free_port, output_args, subprocess_env

    per_rank = per_rank or [(argv, value_file)] * nproc
    env, port, run_id = env or subprocess_env(), free_port(), uuid.uuid4().hex
    envs = [env] if nproc == 1 else [
        dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0",
             ROLE_RANK=str(r), ROLE_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
             TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")
        for r in range(nproc)]
    streams = [(tmp_path / f"{r}.out", tmp_path / f"{r}.err") for r in range(nproc)]
    processes = [warm_context().Process(target=_cut_as_training_starts, args=(
        [*map(str, rank_argv), "--no_plots", *map(str, output_args(tmp_path))], e, *paths, str(cut)))
        for (rank_argv, cut), e, paths in zip(per_rank, envs, streams)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.kill()
    assert not alive, "a process still ran after 120 s"
    read = lambda path: path.read_text() if path.exists() else ""  # noqa: E731
    return "".join(read(o) for o, _ in streams), "".join(read(e) for _, e in streams), [p.exitcode for p in processes]


@pytest.mark.parametrize("layout, nproc, workers", [("built", 1, 0), ("built", 1, 2), ("built", 2, 0),
                                                     ("built", 2, 2), ("time-moe", 1, 0)])
def test_a_value_file_cut_short_during_the_run_ends_every_rank_with_one_line_naming_it(
        tmp_path, corpus, time_moe, layout, nproc, workers):
    """A shard cut short (or a file copied over it) while a run reads it: a read past the end of a memory map
    killed the process by SIGBUS, without a word and exit 135 (no loader workers), or with a 70-line traceback
    blaming shared memory (--num_workers 2). Each read first checks the size of the files it reads: one line
    naming the file, exit 2 on every rank, whether the reading process is a rank or its loader worker."""
    folder = tmp_path / "data"
    shutil.copytree(corpus[1] if layout == "built" else time_moe["one"], folder)
    value_file = sorted(folder.glob("*.bin"))[0]
    size = value_file.stat().st_size
    argv = ["--data", "corpus", "--root_path", folder, "--features", "S", "--model", "DLinear", "--seq_len", 96,
            "--label_len", 48, "--pred_len", 24, "--train_epochs", 1, "--num_threads", 1, "--num_workers", workers]
    out, err, codes = _run_with_a_value_file_cut(tmp_path, value_file, nproc, argv)
    proc = subprocess.CompletedProcess(argv, max(codes), out, err)
    assert_one_error_line(proc, f"error: {value_file} changed during the run: it holds 100 bytes, {size} when the "
                                "run opened it (a file copied over it, or cut short?); put the corpus' own file "
                                "back (copy the whole folder again, or rebuild it) and continue with --resume")
    assert codes == [2] * nproc, (codes, err[-3000:])


def test_a_file_cut_under_one_rank_alone_is_named_by_that_rank_and_the_others_add_no_traceback(tmp_path, corpus):
    """Each node reads its own copy of a corpus, and one node's copy is cut mid-run: that rank alone raises, while
    rank 0 waits for it in the gradient all-reduce. Under utils.launch (its line file given) the rank says it in
    one line itself (rank 0, which prints every agreed error, never meets this one), and rank 0, whose collective
    breaks as that rank leaves, exits without a traceback; the launcher then ends the job with code 2. Before:
    no line at all, and a gloo traceback."""
    from helpers import subprocess_env

    copies = [tmp_path / f"node{r}" for r in range(2)]
    for copy in copies:
        shutil.copytree(corpus[1], copy)
    value_file = sorted(copies[1].glob("*.bin"))[0]
    size = value_file.stat().st_size
    scratch = tmp_path / "scratch.bin"
    scratch.write_bytes(b"\0" * 200)  # what rank 0 cuts: nothing it reads
    printed = tmp_path / "line-printed"
    printed.touch()
    argv = ["--data", "corpus", "--features", "S", "--model", "DLinear", "--seq_len", 96, "--label_len", 48,
            "--pred_len", 24, "--train_epochs", 1, "--num_threads", 1, "--dist_timeout", 60]
    out, err, codes = _run_with_a_value_file_cut(
        tmp_path, None, 2, None, env=dict(subprocess_env(), TSL_LINE_PRINTED=str(printed)),
        per_rank=[([*argv, "--root_path", copy], cut) for copy, cut in zip(copies, (scratch, value_file))])
    assert codes == [1, 2], (codes, err[-3000:])  # rank 0: its collective broke; rank 1: the user error
    proc = subprocess.CompletedProcess([], 2, out, err)
    assert_one_error_line(proc, f"error: {value_file} changed during the run: it holds 100 bytes, {size} when the "
                                "run opened it")
    assert printed.read_text() == "rank 1\n"


def test_a_corpus_pickled_for_a_loader_worker_maps_its_files_again_and_names_one_that_changed(tmp_path, corpus):
    """A loader worker started by spawn or a fork server (Python 3.14's default) gets the data set pickled: each
    memory map pickled as a copy of its whole file (and, a file cut short, a SIGBUS in the pickling). The files go
    by path and are mapped again; one that changed is named at its first read, in one line."""
    import pickle

    folder = tmp_path / "data"
    shutil.copytree(corpus[1], folder)
    data = CorpusData(str(folder))
    windows = data.window_dataset("train", Window(96, 48, 72), with_marks=False)
    ids = torch.arange(0, len(windows), 7)
    pickled = pickle.dumps(windows)
    assert len(pickled) < data.nbytes() / 2, (len(pickled), data.nbytes())  # the maps' values stay behind
    assert torch.equal(pickle.loads(pickled).__getitems__(ids)[0], windows.__getitems__(ids)[0])
    shard = sorted(folder.glob("*.bin"))[0]
    size = shard.stat().st_size
    os.truncate(shard, 100)
    copy = pickle.loads(pickled)
    with pytest.raises(UserError) as refused:
        copy.__getitems__(ids)
    assert str(refused.value) == (f"{shard} changed during the run: it holds 100 bytes, {size} when the run opened it "
                                  "(a file copied over it, or cut short?); put the corpus' own file back (copy the "
                                  "whole folder again, or rebuild it) and continue with --resume")


def _rss_file_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_reading_batches_leaves_no_shard_pages_in_the_process(tmp_path):
    """A process's resident memory must not grow with the pages a run has read: each batch's pages are
    dropped from its mappings once gathered (they stay in the OS page cache). Reading every window of
    a 32 MB corpus in random batches leaves the process's mapped file pages where they were."""
    np.save(tmp_path / "walk.npy", np.cumsum(np.random.default_rng(0).normal(size=(1_000_000, 8)), axis=0))
    build(str(tmp_path / "out"), [str(tmp_path / "walk.npy")], shard_mb=4, progress=False)
    windows = CorpusData(str(tmp_path / "out")).window_dataset("train", Window(96, 48, 72), with_marks=False)
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(0))[:200_000]
    windows.__getitems__(order[:256])  # the code's own pages (numpy, torch) mapped first
    before = _rss_file_kib()
    for batch in order.split(256):
        windows.__getitems__(batch)
    grown = _rss_file_kib() - before
    assert grown < 8192, f"{grown} KiB of shard pages stayed mapped"  # without the release: ~27,000 KiB


def test_each_finished_file_is_forced_to_disk_before_the_build_state_records_it(tmp_path, monkeypatch):
    """The build state says which source files are done; a crash (power loss) after it is written must not
    find those files' points or records missing, so every open shard and the journal are fsync'ed first."""
    import data_provider.corpus as corpus_module

    events = []
    fsync = os.fsync

    def recording_fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        fsync(fd)

    write_state = corpus_module.atomic_write

    def recording_write(path, *args, **kwargs):
        events.append(("write", os.path.basename(str(path))))
        return write_state(path, *args, **kwargs)

    monkeypatch.setattr(corpus_module.os, "fsync", recording_fsync)
    monkeypatch.setattr(corpus_module, "atomic_write", recording_write)
    build(str(tmp_path / "out"), [str(_sources(tmp_path / "src"))], shard_mb=0.005, progress=False)
    states = [i for i, event in enumerate(events) if event == ("write", STATE)]
    assert len(states) >= 3, events  # one per source file at least
    for i in states:
        synced = {name for kind, name in events[:i] if kind == "fsync"}
        assert corpus_module.JOURNAL in synced and any(name.endswith(".bin") for name in synced), events[:i]


def test_a_corpus_reports_its_bytes_for_the_gpu_placement_decision(corpus):
    """--data_on_device auto puts the data on a GPU when its bytes fit: a corpus's bytes are its float32
    points, 4 each."""
    _, out = corpus
    index = json.loads((out / INDEX).read_text())
    points = sum(shard["points"] for shard in index["shards"])
    assert _corpus(out).nbytes() == 4 * points


def test_a_time_moe_scale_that_is_not_a_whole_number_is_named_by_its_first_bad_sequence(tmp_path, time_moe):
    folder = tmp_path / "moe"
    shutil.copytree(time_moe["one"], folder)
    meta = json.loads((folder / "meta.json").read_text())
    meta["scales"][2]["length"] = 2.5
    meta["scales"][4]["length"] = -3
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"sequence 2's length is 2\.5, not a whole number >= 0"):
        _corpus(folder)


@pytest.mark.parametrize("shard_mb", [0, -1])
def test_a_shard_size_that_is_not_positive_is_refused(tmp_path, shard_mb):
    with pytest.raises(UserError, match=f"--shard_mb must be positive, got {shard_mb}"):
        build(str(tmp_path / "out"), [str(_sources(tmp_path / "src"))], shard_mb=shard_mb, progress=False)
    assert not (tmp_path / "out").exists()


def test_a_window_across_a_shard_boundary_releases_both_shards(corpus, monkeypatch):
    """A window that runs into the next shard touched that shard's pages too: both are released."""
    _, out = corpus
    data = CorpusData(str(out))
    released = []
    monkeypatch.setattr(data, "release", lambda files: released.append(sorted(int(f) for f in files)))
    boundary = int(data.file_start[1])
    data.read(np.array([boundary - 10, 0]), 40)  # the first window crosses from shard 0 into shard 1
    assert released == [[0, 1]]
    released.clear()
    data.read(np.array([boundary + 5]), 40)  # inside shard 1 only
    assert released == [[1]]
