"""utils.checkpoint's export and load_weights with the released foundation models' formats and their folders'
opener (models.foundation.release.open_release) handed in, and `python -m exp.export export --to NAME SRC DST`,
the command line writing a checkpoint in another codebase's layout or ours. Here, above both, because those
formats are declared in the release folders (models.foundation.export_formats) and utils/, the floor, imports no
model."""
import sys

from models.foundation import export_formats
from models.foundation.release import open_release
from utils import checkpoint
from utils.errors import UserError


def export(src, dst, to="openltm"):
    """utils.checkpoint.export, every release's format known."""
    return checkpoint.export(src, dst, to, export_formats(), open_release)


def load_weights(model, path, map_location="cpu"):
    """utils.checkpoint.load_weights, a file of any release named as such when it is not `model`'s, a release
    folder's weights read where it is opened (models.foundation.release.open_release)."""
    return checkpoint.load_weights(model, path, map_location, export_formats(), open_release)


def main(argv=None):
    return checkpoint.main(argv, export_formats(), open_release)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as error:  # one line and exit code 2, as run.py's bad input
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
