"""Exp_Basic: device, process group, data-derived shapes, model registry, DDP wrapping."""
import contextlib
import logging
import os

import torch
from torch.nn.parallel import DistributedDataParallel

from data_provider.data_factory import prepared_data
from models import get_model_class
from utils import distributed
from utils.errors import require
from utils.metrics import LOSSES
from utils.tools import learning_rate_for_epoch, seed_everything

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
        self.raw_model = self.model_class(args).to(self.device)
        model = self.raw_model
        # DDP broadcasts rank 0's parameters at construction, so every rank starts equal.
        if distributed.is_dist():
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=device_ids)
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
        """Adam with PyTorch's fused kernel (one kernel for all parameters, CPU and GPU)."""
        args = self.args
        return torch.optim.Adam(self.model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay,
                                fused=True)

    def backward_and_step(self, loss, optimizer):
        self.grad_scaler.scale(loss).backward()
        self.grad_scaler.step(optimizer)
        self.grad_scaler.update()

    def _complete_args(self):
        """Fill what the data and the model family decide, and reject impossible settings."""
        args = self.args
        args.autoregressive = bool(getattr(self.model_class, "autoregressive", False))
        data = prepared_data(args)
        n_channels = len(data.columns)
        args.mark_dim = data.marks.shape[1]  # time features per step (0 for undated data)
        args.enc_in = args.enc_in or n_channels
        args.dec_in = args.dec_in or n_channels
        args.c_out = args.c_out or (1 if args.features == "MS" else n_channels)
        args.test_seq_len = args.test_seq_len or args.seq_len
        args.test_pred_len = args.test_pred_len or args.pred_len
        for name in ("seq_len", "pred_len", "batch_size", "train_epochs", "patience"):
            require(getattr(args, name) > 0, f"--{name} must be positive, got {getattr(args, name)}")
        require(0 <= args.label_len <= args.seq_len, f"--label_len must be between 0 and --seq_len ({args.seq_len}), got {args.label_len}")
        require(args.loss in LOSSES, f"unknown --loss '{args.loss}'; choose one of {', '.join(LOSSES)}")
        learning_rate_for_epoch(args, 1)  # rejects an unknown --lradj before any training
        if args.autoregressive:
            token = args.input_token_len
            require(token > 0 and args.output_token_len > 0, "--input_token_len and --output_token_len must be positive")
            for name in ("seq_len", "test_seq_len"):
                require(getattr(args, name) % token == 0,
                        f"--{name} ({getattr(args, name)}) must be a multiple of --input_token_len ({token}) for token model {args.model}")
            require(not args.nonautoregressive or args.output_token_len >= args.test_pred_len,
                    f"--nonautoregressive forecasts in one step, so --output_token_len ({args.output_token_len}) "
                    f"must cover --test_pred_len ({args.test_pred_len})")
