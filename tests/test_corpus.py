"""--data corpus: a corpus built on disk gives --data univariate's windows, per-window errors and metrics
from memory-mapped shards; a build that stops continues; bad corpora are refused in one line."""
import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from data_provider import data_factory
from data_provider.corpus import INDEX, STATE, CorpusData, build, main as corpus_main
from data_provider.synthetic import make_synthetic
from data_provider.windows import Window
from helpers import SMALL_TIMERXL, assert_ok, make_args, records, run_cli
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

    def dies_on_the_third_file(path, scale=True):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the build is stopped while reading c.npy
        return read(path, scale)

    monkeypatch.setattr(corpus_module, "series_of", dies_on_the_third_file)
    with pytest.raises(KeyboardInterrupt):
        build(str(tmp_path / "stopped"), [str(src)], shard_mb=0.005, progress=False)
    assert (tmp_path / "stopped" / STATE).exists() and not (tmp_path / "stopped" / INDEX).exists()
    with pytest.raises(UserError, match="its build did not finish: run the same"):
        CorpusData(str(tmp_path / "stopped"))
    monkeypatch.setattr(corpus_module, "series_of", read)
    resumed = build(str(tmp_path / "stopped"), [str(src)], shard_mb=0.005, progress=False)
    assert not (tmp_path / "stopped" / STATE).exists()

    def content(folder, index):
        shards = b"".join((folder / s["file"]).read_bytes() for s in index["shards"])
        return shards, [{k: v for k, v in s.items()} for s in index["series"]], [s["points"] for s in index["shards"]]

    assert content(tmp_path / "stopped", resumed) == content(tmp_path / "straight", straight)


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
