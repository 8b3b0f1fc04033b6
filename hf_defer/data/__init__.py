"""Data for learning to defer: the shipped datasets (``bundled/``, checksum-verified), preparation of a user's own
data, the batch collator and the checks run before training.

Imports `hf_defer.modeling` (the ignore index), `hf_defer.experts` (the HateSpeech annotator expert) and the libraries;
never training, hub, commands or experiments.
"""

from .collator import DataCollatorForDeferral
from .hatespeech import (
    HATESPEECH_CITATION,
    HATESPEECH_HUB_ID,
    HATESPEECH_LABELS,
    default_hatespeech_source,
    load_hatespeech,
)

__all__ = [
    "HATESPEECH_CITATION",
    "HATESPEECH_HUB_ID",
    "HATESPEECH_LABELS",
    "DataCollatorForDeferral",
    "default_hatespeech_source",
    "load_hatespeech",
]
