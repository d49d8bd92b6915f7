"""Model registry: every `models/<Name>.py` that defines `Model(configs)` is `--model <Name>`, and so is every
`models/foundation/<release>/<Name>.py` (a released foundation model's folder: models/foundation/__init__.py).

Nothing to edit when a model is added; files are imported only when asked for. Other spellings of
a name are aliases, derived from the registry rather than listed: any case, with or without `_`
and `-` (OpenLTM's `timer_xl` and `timer` are TimerXL and Timer, `dlinear` is DLinear).
"""
import importlib
import pkgutil
import traceback
from pathlib import Path

from utils.errors import UserError

_HERE = Path(__file__).parent
FORWARD_INPUTS = ("x_enc", "x_mark_enc", "x_dec", "x_mark_dec")
# The models this project ships. Each has golden outputs (tests/test_model_outputs.py) and a script per data
# set (tests/test_scripts.py), which the suite requires of them; any other models/<Name>.py runs all the same,
# is held to the model contract, and is told what joining the zoo takes (models/README.md#joining-the-zoo).
ZOO = ("DLinear", "NLinear", "PatchTST", "TSMixer", "TiDE", "TimeMixer", "TimeXer", "Timer", "TimerXL", "TimesNet",
       "Transformer", "iTransformer")
# Import name -> the pip package that provides it, where the two differ: the packages TSLib's model files
# and layers import that this project does not install. A name not listed is taken to be its own package.
PIP_NAMES = {"mamba_ssm": "mamba-ssm", "reformer_pytorch": "reformer-pytorch", "pywt": "PyWavelets",
             "sklearn": "scikit-learn", "chronos": "chronos-forecasting", "tirex": "tirex-ts",
             "causal_conv1d": "causal-conv1d", "local_attention": "local-attention", "yaml": "PyYAML",
             "PIL": "Pillow", "cv2": "opencv-python", "patoolib": "patool", "sktime": "sktime"}


def model_files():
    """{--model name: its file}: models/<Name>.py and models/foundation/<release>/<Name>.py that define a Model
    class; found by reading the files, so nothing is imported until a model is asked for."""
    files = {}
    for folder in (_HERE, *sorted(path for path in (_HERE / "foundation").glob("*") if path.is_dir())):
        for info in pkgutil.iter_modules([str(folder)]):
            if info.name.startswith("_") or info.ispkg:
                continue
            path = folder / f"{info.name}.py"
            if "class Model(" in path.read_text():
                files[info.name] = path
    return files


def available_models():
    return sorted(model_files())


def _module_of(name):
    """The dotted module of model `name` (`models.DLinear`, `models.foundation.<release>.<Name>`)."""
    path = model_files()[name].relative_to(_HERE.parent).with_suffix("")
    return ".".join(path.parts)


def model_path(name):
    """Model `name`'s file relative to the repository, for messages: models/DLinear.py."""
    path = model_files().get(name, _HERE / f"{name}.py")
    return path.relative_to(_HERE.parent).as_posix()


def outside_zoo():
    """The models found in models/ that the project does not ship: a user's own files."""
    return [name for name in available_models() if name not in ZOO]


def _spelling_key(name):
    return name.lower().replace("_", "").replace("-", "")


def canonical_name(name):
    """The registry's spelling of model `name` (`timer_xl` -> `TimerXL`), or `name` itself when no
    model goes by it (get_model_class then says which exist). A name two models share once their
    case and separators are dropped stays as given: only its exact spelling finds a model."""
    models = available_models()
    if name in models:
        return name
    matches = [model for model in models if _spelling_key(model) == _spelling_key(name)]
    return matches[0] if len(matches) == 1 else name


def get_model_class(name):
    name = canonical_name(name)
    if name not in available_models():
        raise UserError(f"unknown --model '{name}'; available: {', '.join(available_models())}")
    try:
        module = importlib.import_module(_module_of(name))
    except ModuleNotFoundError as missing:  # a file written for another codebase (TSLib's layers) or package
        if missing.name is None or missing.name == _module_of(name):
            raise
        raise UserError(missing_module_line(name, missing)) from None
    return module.Model


def missing_module_line(name, missing):
    """The one line refusing model `name`, whose file (or a layer it imports or builds) imports the module that
    ModuleNotFoundError `missing` names: a package with its pip command, or a layers/ module we lack."""
    top = missing.name.split(".")[0]
    if top == "layers":
        module_path = missing.name.split(".", 1)[-1].replace(".", "/")
        fix = f"a module this codebase does not have; add layers/{module_path}.py or change the import"
    else:
        fix = f"which is not installed: {pip_command(missing.name)}"
    return f"{model_path(name)} imports {missing.name}{_through(missing, name)}, {fix}"


def pip_command(module_name):
    """`pip install <package>` for the package that provides import `module_name` (PIP_NAMES, else its own name)."""
    top = module_name.split(".")[0]
    return f"pip install {PIP_NAMES.get(top, top)}"


def _through(missing, name):
    """' (through layers/X.py)' when the failed import is in a file the model file imports, not the model file
    itself (TSLib's WPMixer needs pywt through layers/DWT_Decomposition.py); else ''."""
    root = _HERE.parent
    files = [Path(frame.filename) for frame in traceback.extract_tb(missing.__traceback__)]
    files = [file for file in files if file.is_relative_to(root) and file != Path(__file__)]  # not importlib's
    if not files or files[-1] == model_files().get(name, _HERE / f"{name}.py"):
        return ""
    return f" (through {files[-1].relative_to(root).as_posix()})"


def inputs_used(model_class):
    """The forward arguments a model reads: its class attribute `inputs_used`, or all four when it
    declares none (TSLib's models take whatever they are given). The experiment passes None for
    the others, and the loader does not gather time features nobody reads. The names are those of
    forward's four positions in FORWARD_INPUTS, whatever the file calls them (forward is called by
    position): TSLib's TiDE reads its fourth, `batch_y_mark`, as "x_mark_dec"."""
    declared = tuple(getattr(model_class, "inputs_used", FORWARD_INPUTS))
    unknown = [name for name in declared if name not in FORWARD_INPUTS]
    if unknown or "x_enc" not in declared:
        raise UserError(f"{model_class.__module__}.Model.inputs_used = {declared!r}: list forward arguments it reads, "
                        f"x_enc first, from {', '.join(FORWARD_INPUTS)} (forward's four positions, whatever it names them)")
    return declared
