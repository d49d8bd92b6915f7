"""Model registry: every `models/<Name>.py` that defines `Model(configs)` is `--model <Name>`.

Nothing to edit when a model is added; files are imported only when asked for.
"""
import importlib
import pkgutil
from pathlib import Path

from utils.errors import UserError

_HERE = Path(__file__).parent


def available_models():
    names = []
    for info in pkgutil.iter_modules([str(_HERE)]):
        if info.name.startswith("_"):
            continue
        source = (_HERE / f"{info.name}.py").read_text()
        if "class Model(" in source:
            names.append(info.name)
    return sorted(names)


def get_model_class(name):
    if name not in available_models():
        raise UserError(f"unknown --model '{name}'; available: {', '.join(available_models())}")
    module = importlib.import_module(f"models.{name}")
    return module.Model
