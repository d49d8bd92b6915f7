"""Optional packages a model builds on (a foundation model's official package): imported where the model
file needs them, or one line saying how to install them."""
import importlib

from utils.errors import UserError


def require_package(import_name, pip_name, extra, model):
    """The module `import_name`, or a UserError naming the model, the package and the install line."""
    try:
        return importlib.import_module(import_name)
    except ImportError as exc:
        raise UserError(f"model {model} needs the {pip_name} package ({exc}): pip install -e '.[{extra}]' "
                        f"(or pip install {pip_name})") from None
