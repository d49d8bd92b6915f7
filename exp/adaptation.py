"""Fine-tuning from a pre-trained checkpoint: OpenLTM's `--adaptation --pretrain_model_path PATH`,
optionally few-shot on a random fraction of the training windows (`--subset_rand_ratio`)."""
import logging
import os

from data_provider.few_shot import check_subset_ratio
from utils import distributed
from utils.checkpoint import load_weights
from utils.errors import UserError, require

logger = logging.getLogger("tsl")


def check_adaptation_args(args):
    """Reject contradictory fine-tuning arguments before any data is read."""
    check_subset_ratio(args.subset_rand_ratio)
    require(not args.adaptation or args.pretrain_model_path,
            "--adaptation needs --pretrain_model_path PATH (the checkpoint.pth of a pre-training run)")
    require(args.adaptation or not args.pretrain_model_path,
            "--pretrain_model_path is only read with --adaptation; add --adaptation to fine-tune from it")


def load_pretrained(model, path, device):
    """Strictly load `path` into `model` on every rank (to this rank's device). If any rank
    cannot, every rank raises the same error, so the job ends with exit 2 everywhere."""
    problem = None
    try:
        require(os.path.isfile(path), f"--pretrain_model_path {path} not found; pass the checkpoint.pth that a "
                                      "pre-training run wrote under its --checkpoints folder")
        load_weights(model, path, map_location=device)
    except UserError as exc:
        problem = str(exc) if str(exc).startswith("--pretrain") else f"cannot fine-tune from --pretrain_model_path: {exc}"
    problems = [p for p in distributed.gather_objects(problem) if p]  # each rank reads its own file system
    require(not problems, problems[0] if problems else "")
    logger.info(f"fine-tuning from {path}")
