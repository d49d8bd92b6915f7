"""Host syncs counted on the meta device (utils.host_syncs): the recorder logs what CUDA would block on."""
import torch

from utils.host_syncs import record_host_syncs, summary, to_meta


def kinds(rec):
    return [(kind, op.split(".")[1] if op.startswith("aten.") else op.split()[0]) for kind, op, _ in rec.syncs]


def test_the_recorder_logs_each_blocking_read_and_copy_and_keeps_the_step_running():
    x = to_meta(torch.ones(3, 4))
    with record_host_syncs() as rec:
        x.sum().item()
        bool(x.max() > 0)
        assert x.tolist() == [[0.0] * 4] * 3  # stand-in values, so the code goes on
        x.cpu()
        x.new_tensor([0.1, 0.5])
        torch.ones(2).to("meta")
        assert x[x > 0].shape == (12,)  # a boolean mask taken as all true
        assert torch.nonzero(x).shape == (12, 2)
        counts = torch.bincount(x.flatten().long(), minlength=4)
        assert counts.tolist() == [3, 3, 3, 3]  # spread evenly, read back as built
        torch.unique(x)
        x[x > 0] = 0.0  # a Python number: masked_fill_ on CUDA, no sync
        y = x * 2 + 1  # device work only
    assert kinds(rec) == [("d2h", "_local_scalar_dense"), ("d2h", "_local_scalar_dense"), ("d2h", "_to_copy"),
                          ("d2h", "_to_copy"), ("h2d", "new_tensor"), ("h2d", "_to_copy"), ("d2h", "index"),
                          ("d2h", "nonzero"), ("d2h", "bincount"), ("d2h", "_to_copy"), ("d2h", "_unique2")]
    assert all(site.startswith("tests/test_host_syncs.py:") for _, _, site in rec.syncs), rec.syncs
    assert rec.op_counts["mul"] == 1 and rec.op_counts["add"] == 1 and y.device.type == "meta"
    assert rec.count("h2d") == 2 and len(summary(rec)) == len(rec.syncs)


def test_a_module_step_without_reads_records_none():
    model = to_meta(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1)))
    optimizer = torch.optim.Adam(model.parameters(), foreach=True)
    x = to_meta(torch.randn(5, 4))
    with record_host_syncs() as rec:
        model(x).square().mean().backward()
        optimizer.step()
    assert rec.syncs == [] and rec.op_counts["addmm"] == 2 and rec.op_counts["mm"] >= 2
