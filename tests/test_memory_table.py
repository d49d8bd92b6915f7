"""benchmarks/memory_table.py: the per-rank memory arithmetic against hand-computed cases, the activation formula
against autograd's saved tensors, LoRA's trainable count against the adapted Linears, and the committed table
against what the script prints."""
import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks import memory_table as mt
from models.foundation import adapter_modules

GiB = 2 ** 30
SHAPE_1B = mt.SIZES["1B"][1]


def test_ddp_one_rank_fp32_is_16_bytes_a_parameter():
    """1e9 parameters, fp32 Adam, DDP on 1 rank: 4 (weights) + 4 (gradients) + 8 (two moments) bytes each."""
    part = mt.per_rank("DDP", 1e9, 1, SHAPE_1B)
    assert (part["weights"], part["gradients"], part["optimizer"]) == (4e9, 4e9, 8e9)
    assert math.isclose((part["weights"] + part["gradients"] + part["optimizer"]) / GiB, 16e9 / GiB)
    assert math.isclose(part["total"], 16e9 + part["activations"])


def test_bf16_keeps_fp32_master_weights_beside_adam():
    part = mt.per_rank("DDP", 1e9, 1, SHAPE_1B, precision="bf16")
    assert (part["weights"], part["gradients"], part["optimizer"]) == (2e9, 2e9, 12e9)
    assert part["activations"] == mt.activation_bytes(SHAPE_1B, mt.Setting(), 2)


@pytest.mark.parametrize("ranks", [8, 64])
def test_the_sharded_parts_divide_by_the_ranks(ranks):
    one, many = (mt.per_rank("FSDP2", 1e9, n, SHAPE_1B) for n in (1, ranks))
    gathered = mt.Setting().prefetch * 4 * SHAPE_1B.block_params
    assert math.isclose(many["weights"] - gathered, (one["weights"] - gathered) / ranks)
    assert math.isclose(many["gradients"] - 4 * SHAPE_1B.block_params,
                        (one["gradients"] - 4 * SHAPE_1B.block_params) / ranks)
    assert math.isclose(many["optimizer"], one["optimizer"] / ranks)
    assert many["activations"] == one["activations"]
    zero_one, zero = (mt.per_rank("ZeRO", 1e9, n, SHAPE_1B) for n in (1, ranks))
    assert math.isclose(zero["optimizer"], zero_one["optimizer"] / ranks)
    assert (zero["weights"], zero["gradients"]) == (zero_one["weights"], zero_one["gradients"])
    ddp = mt.per_rank("DDP", 1e9, ranks, SHAPE_1B)
    assert ddp == mt.per_rank("DDP", 1e9, 1, SHAPE_1B)


def test_lora_trains_only_its_adapters():
    r = mt.Setting().lora_rank
    d, layers = SHAPE_1B.d_model, SHAPE_1B.layers
    # by hand: q, k, v, o are r (d + d) each, the MLP's two r (d + 4d) each
    trainable = layers * (4 * r * 2 * d + 2 * r * 5 * d)
    assert SHAPE_1B.lora_params(r) == trainable
    part = mt.per_rank("LoRA", 1e9, 8, SHAPE_1B)
    assert part["weights"] == 4e9 + 4 * trainable
    assert (part["gradients"], part["optimizer"]) == (4 * trainable, 8 * trainable)


def test_lora_count_is_two_r_din_plus_dout_over_the_adapted_linears():
    """The shape's LoRA formula equals the count over a model's matching Linear modules (built on meta)."""
    shape, r = mt.Shape(64, 3, 4), 8
    with torch.device("meta"):
        model = nn.Sequential(*(mt.Block(shape.d_model, shape.heads) for _ in range(shape.layers)))
    patterns = (r"\.(q|k|v|o|up|down)$",)
    adapted = mt.adapted_linears(model, patterns)
    assert len(adapted) == 6 * shape.layers
    assert mt.lora_trainable(model, r, patterns) == shape.lora_params(r)
    assert sum(p.numel() for name, p in model.named_parameters()
               if name.endswith("weight") and p.dim() == 2) == shape.params


def test_lora_counts_each_matching_linear_by_its_own_sides():
    """A lone Linear of 3 -> 5 under an attention module: r (3 + 5); a router and a head left alone."""
    model = nn.ModuleDict({"attention": nn.ModuleDict({"q": nn.Linear(3, 5), "router": nn.Linear(7, 2)}),
                           "head": nn.Linear(11, 13)})
    assert [name for name, _ in mt.adapted_linears(model)] == ["attention.q"]
    assert mt.lora_trainable(model, 4) == 4 * (3 + 5)


def test_checkpointing_keeps_each_block_input_and_one_block():
    setting, (d, layers, heads) = mt.Setting(), (SHAPE_1B.d_model, SHAPE_1B.layers, SHAPE_1B.heads)
    tokens = setting.batch * setting.seq
    assert mt.activation_bytes(SHAPE_1B, setting) == 4 * tokens * (16 * d + 4 + heads) * layers
    assert mt.checkpointed_activation_bytes(SHAPE_1B, setting) == 4 * tokens * d * layers + 4 * tokens * (
        16 * d + 4 + heads)
    part = mt.per_rank("FSDP2", 1e9, 8, SHAPE_1B)
    assert part["total"] - part["total_checkpointed"] == (mt.activation_bytes(SHAPE_1B, setting)
                                                          - mt.checkpointed_activation_bytes(SHAPE_1B, setting))


def test_the_activation_formula_is_what_autograd_saves():
    shape, setting = mt.Shape(64, 2, 4), mt.Setting(batch=2, seq=24)
    assert mt.measured_reference(shape, setting) == mt.activation_bytes(shape, setting)


def test_the_releases_are_built_at_their_published_sizes():
    """Every release folder declares its largest shape; built on meta, each has the size its name publishes (the
    "M" or "B" figure, to 16 %: a name rounds, and TimesFM 2.5's "200m" counts 231M with its output heads) and
    Linear layers the default LoRA targets match."""
    declared = mt.releases()
    assert {model for model, *_ in declared} == {module.ADAPTERS[0].model for module in adapter_modules()}
    counts = mt.release_counts()
    for model, checkpoint, _, published, _ in declared:
        params, trainable, adapted = counts[checkpoint]
        number, unit = re.match(r"([\d.]+)([MB])", published).groups()
        expected = float(number) * (1e6 if unit == "M" else 1e9)
        assert abs(params / expected - 1) < 0.16, (model, checkpoint, params, published)
        assert adapted > 0 and 0 < trainable < params / 10, (model, checkpoint, trainable, adapted)


def test_the_committed_table_is_what_the_script_prints(monkeypatch):
    """Everything the script prints is the stored result; the releases' measured activations (a measurement, 6 s
    of meta forwards) are taken from the stored column, every other figure recomputed."""
    from benchmarks import results_page

    header, *rows = results_page.read_csv(mt.RESULTS / f"{mt.NAME}.csv")
    column = next(i for i, name in enumerate(header) if name.startswith("activations"))
    stored_saved = {row[1]: None if row[column] == "not on meta" else float(row[column]) * 2 ** 20 for row in rows}
    monkeypatch.setattr(mt, "release_activations", lambda window=mt.WINDOW: stored_saved)
    record = json.loads((mt.RESULTS / f"{mt.NAME}.json").read_text())
    tables = {block["table"]: (mt.RESULTS / block["table"]).read_text() for block in record["blocks"]
              if "table" in block}
    stored = results_page.render(record["blocks"], {name: results_page.read_csv(mt.RESULTS / name)
                                                   for name in tables})
    assert stored == mt.document()
    assert Path(results_page.PAGE).read_text() == results_page.page()


# ------------------------------------------------------------ FSDP2's peak host memory, measured (benchmarks.fsdp_rss)
def test_the_stored_fsdp_rss_result_meets_the_bound_at_a_100m_model():
    """The committed measurement: a model of at least 100M parameters, and at 4 processes the largest rank's peak at
    most 0.35 of the 1-process peak under an allocator that hands freed memory back (glibc's defaults are stored
    beside it, as measured)."""
    import csv

    from benchmarks import fsdp_rss

    with open(fsdp_rss.RESULTS / f"{fsdp_rss.NAME}.csv") as f:
        rows = list(csv.DictReader(f))
    lean = {int(r["processes"]): r for r in rows if r["malloc"] == "lean"}
    assert set(lean) == set(fsdp_rss.WORLD_SIZES)
    assert all(float(r["parameters"].rstrip("M")) >= 100 for r in rows)
    assert float(lean[4]["of 1 process"]) <= fsdp_rss.BOUND
    one = int(lean[1]["largest rank (MiB)"])
    for world, row in lean.items():  # the share is what the peaks say
        assert abs(float(row["of 1 process"]) - int(row["largest rank (MiB)"]) / one) < 1e-3


def test_the_fsdp_rss_worker_measures_each_rank():
    """The worker path itself (the experiment's --fsdp steps under torchrun), at a tiny shape on 2 processes: one
    peak per rank, gathered on rank 0."""
    from benchmarks import fsdp_rss

    records = fsdp_rss.measure(1, 64, 1, "lean", world_sizes=(2,))
    assert len(records[2]["peak_rss_mib"]) == 2 and records[2]["parameters"] > 0
    rows = fsdp_rss.table(records)
    assert rows[0]["share_of_1_process"] == 1.0 and rows[0]["largest_rank_mib"] > 100
