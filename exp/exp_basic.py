"""Exp_Basic: device, process group, data-derived shapes, model registry, DDP wrapping."""
import contextlib
import logging
import os

import torch

from data_provider.data_factory import prepared_data
from exp.adaptation import check_adaptation_args
from models import get_model_class, inputs_used
from utils import distributed
from utils.errors import require
from utils.metrics import LOSSES
from utils.tools import global_batch_size, learning_rate_for_epoch, scaled_learning_rate, seed_everything

logger = logging.getLogger("tsl")


class Exp_Basic:
    def __init__(self, args):
        self.args = args
        if args.ddp:
            self.device = distributed.setup(args.use_gpu, args.dist_timeout)
        else:
            cuda = args.use_gpu and torch.cuda.is_available()
            self.device = torch.device("cuda", args.gpu) if cuda else torch.device("cpu")
        self._set_threads()
        self.model_class = get_model_class(args.model)
        self._complete_args()
        seed_everything(args.seed)
        # raw_model: the plain module that is evaluated, saved and loaded; never a DDP or
        # torch.compile wrapper, so checkpoints carry no `module.` / `_orig_mod.` prefixes.
        # SyncBatchNorm runs only on GPUs (PyTorch refuses it on CPU inside DDP).
        require(not (args.sync_bn and distributed.is_dist() and self.device.type != "cuda"),
                "--sync_bn needs GPUs (PyTorch's SyncBatchNorm does not run on CPU); "
                "drop --sync_bn or use --use_gpu true on CUDA")
        self.raw_model, model = distributed.wrap_ddp(self.model_class(args).to(self.device), self.device, args.sync_bn)
        self.model = torch.compile(model) if args.compile else model  # what training steps run
        self._amp_dtype = None
        if args.use_amp:
            fp16 = args.amp_dtype == "fp16"
            require(not fp16 or self.device.type == "cuda", "--amp_dtype fp16 needs a GPU; on CPU use bf16 (the default)")
            self._amp_dtype = torch.float16 if fp16 else torch.bfloat16
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
        self.grad_scaler = torch.amp.GradScaler(self.device.type, enabled=self._amp_dtype == torch.float16)

    def _set_threads(self):
        """One process per core group: under torchrun, split the cores between local ranks."""
        threads = self.args.num_threads
        if not threads and distributed.launched_by_torchrun():
            threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
        if threads:
            torch.set_num_threads(threads)

    def autocast(self):
        """Mixed-precision context for forward passes (a no-op without --use_amp)."""
        if self._amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._amp_dtype)

    def make_optimizer(self):
        """Adam with PyTorch's fused kernel (one kernel for all parameters, CPU and GPU); with
        --zero under DDP each rank keeps the state of its share of the parameters only."""
        args = self.args
        sharded = args.zero and distributed.is_dist()
        # ZeRO's load_state_dict puts Adam's step counters on the CPU: the foreach/for-loop
        # kernels' layout (fused keeps them on the parameters' device), so no fused there.
        return distributed.make_optimizer(self.model.parameters(), torch.optim.Adam, shard=sharded,
                                          lr=args.scaled_learning_rate, weight_decay=args.weight_decay,
                                          fused=not sharded)

    def backward(self, loss):
        """Backward of a (possibly fp16-scaled) loss; gradients add up until optimizer_step."""
        self.grad_scaler.scale(loss).backward()

    def optimizer_step(self, optimizer):
        self.grad_scaler.step(optimizer)
        self.grad_scaler.update()

    def backward_and_step(self, loss, optimizer):
        self.backward(loss)
        self.optimizer_step(optimizer)

    def _complete_args(self):
        """Fill what the data and the model family decide, and reject impossible settings."""
        args = self.args
        args.autoregressive = bool(getattr(self.model_class, "autoregressive", False))
        args.model_inputs = inputs_used(self.model_class)  # the loader gathers only what the model reads
        data = prepared_data(args)
        n_channels = len(data.columns)
        args.mark_dim = data.mark_dim  # time features per step (0 for undated data)
        args.enc_in = args.enc_in or n_channels
        args.dec_in = args.dec_in or n_channels
        args.c_out = args.c_out or (1 if args.features == "MS" else n_channels)
        args.test_seq_len = args.test_seq_len or args.seq_len
        args.test_pred_len = args.test_pred_len or args.pred_len
        for name in ("seq_len", "pred_len", "batch_size", "train_epochs", "patience", "accumulation_steps",
                     "base_batch_size"):
            require(getattr(args, name) > 0, f"--{name} must be positive, got {getattr(args, name)}")
        require(0 <= args.label_len <= args.seq_len, f"--label_len must be between 0 and --seq_len ({args.seq_len}), got {args.label_len}")
        require(args.loss in LOSSES, f"unknown --loss '{args.loss}'; choose one of {', '.join(LOSSES)}")
        args.global_batch_size = global_batch_size(args, distributed.world_size())
        args.scaled_learning_rate = scaled_learning_rate(args, args.global_batch_size)  # the schedule's start
        learning_rate_for_epoch(args, 1)  # rejects an unknown --lradj before any training
        check_adaptation_args(args)
        if args.autoregressive:
            token = args.input_token_len
            require(token > 0 and args.output_token_len > 0, "--input_token_len and --output_token_len must be positive")
            for name in ("seq_len", "test_seq_len"):
                require(getattr(args, name) % token == 0,
                        f"--{name} ({getattr(args, name)}) must be a multiple of --input_token_len ({token}) for token model {args.model}")
            require(not args.nonautoregressive or args.output_token_len >= args.test_pred_len,
                    f"--nonautoregressive forecasts in one step, so --output_token_len ({args.output_token_len}) "
                    f"must cover --test_pred_len ({args.test_pred_len})")
