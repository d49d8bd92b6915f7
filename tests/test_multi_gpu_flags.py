"""TSLib's --use_multi_gpu and OpenLTM's --dp (issue 23, item 2): DataParallel there, DDP here. run.py starts
one worker per --devices entry through PyTorch's own launcher (torch.distributed.run), each shown only its
devices (CUDA_VISIBLE_DEVICES; on the CPU, gloo workers), and --batch_size stays DataParallel's whole batch,
split between them: the run ends where a 1-process run of that batch does."""
import pytest

from helpers import assert_ok, records, run_cli
from utils.errors import UserError

# DLinear has no dropout: 1 and 2 processes see the very same function. 636 training windows, an even
# number, so DistributedSampler pads nothing and each step's two halves are equal (a mean of means is the mean).
DLINEAR = ["--model", "DLinear", "--synthetic_rows", 1010, "--seq_len", 48, "--label_len", 24, "--pred_len", 24,
           "--train_epochs", 2, "--learning_rate", 0.005, "--num_threads", 1]


def test_use_multi_gpu_runs_ddp_over_the_devices_with_the_same_global_batch(tmp_path):
    single = tmp_path / "single"
    assert_ok(run_cli(single, *DLINEAR, "--batch_size", 32))
    proc = run_cli(tmp_path, *DLINEAR, "--batch_size", 32, "--use_multi_gpu", "--devices", "0,1", timeout=180)
    assert_ok(proc)
    assert ("--use_multi_gpu --devices 0,1: DDP with 2 processes, one per device (gloo on the CPU), --batch_size 32 "
            "split between them") in proc.stdout
    assert "ignoring arguments" not in proc.stdout + proc.stderr  # TSLib's flags are read, not warned about
    one, two = records(single)[-1], records(tmp_path)[-1]
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert (two["args"]["batch_size"], two["args"]["global_batch_size"]) == (16, 32)
    assert one["args"]["global_batch_size"] == 32
    assert one["train_windows"] == two["train_windows"] == 636
    # the same steps on the same windows: float32 sums in another order only
    for key in ("vali_loss", "mse", "mae"):
        assert two[key] == pytest.approx(one[key], rel=1e-5), key
    assert [h["train_loss"] for h in two["history"]] == pytest.approx([h["train_loss"] for h in one["history"]],
                                                                      rel=1e-5)


def test_devices_are_numbered_among_the_visible_gpus():
    from utils.launch import device_workers

    assert device_workers((0, 1), None, gpus=0) == (2, None)  # the CPU: the list counts gloo workers
    assert device_workers((2, 0), None, gpus=4) == (2, "2,0")
    # CUDA_VISIBLE_DEVICES=3,5,7 already: --devices 0,2 are its first and third, as PyTorch numbers them
    assert device_workers((0, 2), 2, gpus=3, visible="3,5,7") == (2, "3,7")
    with pytest.raises(UserError, match="names GPU 3, but this machine shows 3 GPU"):
        device_workers((0, 3), None, gpus=3, visible="3,5,7")
    with pytest.raises(UserError, match="--nproc_per_node 4 and --devices 0,1 .2 device.s.. disagree"):
        device_workers((0, 1), 4, gpus=0)


def test_data_parallel_batch_is_split_once_and_gpu_is_the_first_device():
    from exp.settings import _split_data_parallel_batch
    from helpers import make_args

    args = make_args("--dp", "--devices", "0,1,2,3", "--batch_size", 64, "--gpu", 0)
    _split_data_parallel_batch(args, 4)
    _split_data_parallel_batch(args, 4)  # resolve_args may run twice on one Namespace
    assert (args.batch_size, args.gpu) == (16, None)
    args = make_args("--use_multi_gpu", "--devices", "3", "--batch_size", 64)
    _split_data_parallel_batch(args, 1)
    assert (args.batch_size, args.gpu) == (64, 3)  # one device: one process on it, the whole batch
    plain = make_args("--batch_size", 64)
    _split_data_parallel_batch(plain, 4)
    assert plain.batch_size == 64  # --ddp's --batch_size stays per process


def test_devices_alone_are_named_as_unused_and_mps_is_refused():
    from exp.settings import _check_devices
    from helpers import make_args
    from utils.arguments import parse_args

    assert parse_args(["--devices", "0,1"]).ignored_args == ["--devices", "0,1"]  # as TSLib and OpenLTM ignore it
    assert parse_args(["--dp", "--devices", "0,1"]).ignored_args == []
    with pytest.raises(UserError, match="--gpu_type mps: this codebase runs on CUDA GPUs or the CPU"):
        _check_devices(make_args("--gpu_type", "mps"))
