"""utils.checkpoint's export and load_weights with the released foundation models' formats and their folders'
opener (models.foundation.release.open_release) handed in, and `python -m exp.export export --to NAME SRC DST`,
the command line writing a checkpoint in another codebase's layout or ours. Here, above both, because those
formats are declared in the release folders (models.foundation.export_formats) and utils/, the floor, imports no
model.

A LoRA checkpoint (exp.lora: adapters and the hash of their base, no base weights) exports with `--base PATH`, the
weights it was fine-tuned from (the run's --pretrain_model_path: a release folder, or a checkpoint of ours): the
adapters are merged into them (peft's merge) and the merged model is written as any checkpoint of ours would be."""
import argparse
import os
import sys

from exp import lora
from models.foundation import export_formats
from models.foundation.release import open_release
from utils import checkpoint
from utils.errors import UserError


class _Read:
    """A checkpoint already read (and, for LoRA, merged), handed to utils.checkpoint as its opener's result."""

    def __init__(self, file, state, config):
        self.file, self._state, self._config = file, state, config

    def state(self, map_location="cpu"):
        return self._state, self._config


def _ours(state, config):
    """`state` (read_weights') in our layout: as it is where an adapter holds it as ours or none knows it, else
    converted by the release adapter that recognises it."""
    candidates = [a for adapters in checkpoint.all_formats(export_formats()).values() for a in adapters]
    if any(a.holds_ours(state) for a in candidates):
        return state
    source = next((a for a in candidates if a.recognise(state, config)), None)
    return source.to_ours(state, config) if source is not None else state


def read_merged(src, base=None):
    """(the file `src` was read from, its state dict, its config): a LoRA checkpoint's adapters merged into `base`
    (required for one, refused for any other checkpoint)."""
    state, config = checkpoint.read_weights(src, opener=open_release)
    file = checkpoint._last_read.get("file", src)
    if lora.is_lora_checkpoint(state):
        if base is None:
            raise UserError(f"{src} is a LoRA checkpoint: its adapters without the base weights they were trained "
                            "on; pass those (the run's --pretrain_model_path) as --base PATH to merge them in")
        if not os.path.exists(base):
            raise UserError(f"--base {base} not found: pass the folder or file the run fine-tuned from (its "
                            "--pretrain_model_path)")
        base_state, base_config = checkpoint.read_weights(base, opener=open_release)
        state = lora.merged_state(state, _ours(base_state, base_config), src, base)
        config = base_config or config
    elif base is not None:
        raise UserError(f"--base {base}: {src} holds no LoRA adapters (its weights are whole); export it without "
                        "--base")
    return file, state, config


def _opener(base):
    """An opener (utils.checkpoint.read_weights') reading SRC through read_merged: a LoRA checkpoint merged."""
    return lambda path: _Read(*read_merged(path, base))


def export(src, dst, to="openltm", base=None):
    """utils.checkpoint.export, every release's format known; a LoRA checkpoint merged into `base` first."""
    return checkpoint.export(src, dst, to, export_formats(), _opener(base))


def load_weights(model, path, map_location="cpu"):
    """utils.checkpoint.load_weights, a file of any release named as such when it is not `model`'s, a release
    folder's weights read where it is opened (models.foundation.release.open_release)."""
    return checkpoint.load_weights(model, path, map_location, export_formats(), open_release)


BASE_HELP = ("--base PATH: a LoRA checkpoint's base weights (the run's --pretrain_model_path), which its adapters are "
             "merged into; a LoRA checkpoint needs it, any other refuses it")


def main(argv=None):
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--base")
    known, rest = options.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        return checkpoint.main(rest, export_formats(), _opener(known.base))
    except SystemExit:
        if {"-h", "--help"} & set(rest):
            print(BASE_HELP)
        raise


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as error:  # one line and exit code 2, as run.py's bad input
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
