"""TSLib's time-variant Mamba block (Gu and Dao, "Mamba: Linear-Time Sequence Modeling with Selective
State Spaces", 2023), whose selective scan is the CUDA kernel of the `mamba_ssm` package.

mamba_ssm is not installed with this codebase (it builds CUDA extensions): importing this module raises
ModuleNotFoundError for `mamba_ssm`, which models.get_model_class turns into one line naming
`pip install mamba-ssm`. The models registry reads model files without importing them, so the other
models are unaffected. With mamba_ssm installed the module still refuses, in one line: the block is not
written here yet.
"""
from mamba_ssm.ops.selective_scan_interface import selective_scan_fn  # noqa: F401

raise ImportError("layers/tslib/MambaBlock.py: TSLib's Mamba_TimeVariant is not part of this codebase yet; run "
                  "that model in TSLib")
