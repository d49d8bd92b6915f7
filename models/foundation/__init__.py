"""The released foundation models: one folder per release, models/foundation/<release>/, holding

    <Name>.py      the model, `--model <Name>` (found by the registry, models/__init__.py)
    adapter.py     its checkpoint adapter: the release's files read into the model and written back;
                   it declares ADAPTERS (each with its export_format) and SIGNATURES (what a downloaded
                   folder of this release, or of a relative we lack, looks like)
    crosscheck.py  the agreement with the release's own package, run in its side environment
                   (benchmarks/foundation_crosscheck.py); the product never imports it
    README.md

Nothing here names a release: the export formats and the layouts known for refusals are what the folders
declare, collected below and handed to utils.checkpoint (the floor, which imports no model) by exp/."""
import importlib
import pkgutil
from pathlib import Path

_HERE = Path(__file__).parent


def release_folders():
    """The release folders' names, sorted."""
    return sorted(info.name for info in pkgutil.iter_modules([str(_HERE)]) if info.ispkg)


def adapter_modules():
    """Each release folder's adapter module, in release_folders' order (a folder without one is skipped)."""
    return [importlib.import_module(f"{__name__}.{folder}.adapter") for folder in release_folders()
            if (_HERE / folder / "adapter.py").is_file()]


def export_formats():
    """{export format: the adapters writing it}: `export --to NAME` for every release's declared adapters."""
    formats = {}
    for module in adapter_modules():
        for adapter in module.ADAPTERS:
            formats.setdefault(adapter.export_format, []).append(adapter)
    return {name: tuple(adapters) for name, adapters in formats.items()}


def release_signatures():
    """Every release folder's SIGNATURES, (what it is, the --model reading it or None, test on (files, config)),
    for utils.adapters' release_of."""
    return tuple(signature for module in adapter_modules() for signature in getattr(module, "SIGNATURES", ()))


def lora_time_first():
    """Every release folder's LORA_TIME_FIRST: patterns (fnmatch) of the qualified names of the nn.Linear modules
    that see a batch with the samples in its second dimension (exp.lora leaves them out of the default targets)."""
    return tuple(pattern for module in adapter_modules() for pattern in getattr(module, "LORA_TIME_FIRST", ()))
