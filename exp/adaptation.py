"""Fine-tuning from a pre-trained checkpoint: OpenLTM's `--adaptation --pretrain_model_path PATH`,
optionally few-shot on a random fraction of the training windows (`--subset_rand_ratio`). PATH is a
checkpoint of ours or of OpenLTM's Timer-XL / Timer (.pth, .safetensors or a model.safetensors folder):
docs/openltm.md."""
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
    """Strictly load `path` into `model` as best checkpoints are loaded (the model's own keys, or a
    foreign layout its checkpoint_adapters read, converted in memory: utils/checkpoint.weights_for): rank 0 reads the file and
    every rank gets its weights, so the nodes need no shared disk; if it cannot, every rank
    raises the same error and the job ends with exit 2 everywhere."""
    def load(module):
        require(os.path.exists(path), f"--pretrain_model_path {path} not found; pass the checkpoint.pth that a "
                                      "pre-training run wrote under its --checkpoints folder")
        try:
            load_weights(module, path, map_location=device)
        except UserError as exc:
            raise UserError(f"cannot fine-tune from --pretrain_model_path: {exc}") from None

    distributed.load_on_main(model, load)
    logger.info(f"fine-tuning from {path}")
