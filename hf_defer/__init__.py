"""hf_defer: learning to defer (A-SM and baselines) for the Hugging Face stack."""

from .metrics import deferral_metrics, expected_calibration_error, reliability_bins
from .surrogates import SURROGATES, DeferralSurrogate, get_surrogate

__version__ = "0.1.0"

__all__ = [
    "SURROGATES",
    "DeferralSurrogate",
    "deferral_metrics",
    "expected_calibration_error",
    "get_surrogate",
    "reliability_bins",
]
