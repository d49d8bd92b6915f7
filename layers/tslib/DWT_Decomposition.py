"""TSLib's discrete-wavelet decomposition (WPMixer: Murad et al., "WPMixer: Efficient Multi-Resolution
Mixing for Long-Term Time Series Forecasting", AAAI 2025), which computes its filters with PyWavelets.

PyWavelets is not installed with this codebase: importing this module raises ModuleNotFoundError for
`pywt`, which models.get_model_class turns into one line naming `pip install PyWavelets`. With PyWavelets
installed the module still refuses, in one line: the decomposition is not written here yet.
"""
import pywt  # noqa: F401  (the package a model file importing this layer needs)

raise ImportError("layers/tslib/DWT_Decomposition.py: TSLib's wavelet Decomposition (WPMixer) is not part of this "
                  "codebase yet; run that model in TSLib")
