"""Data for learning to defer: the shipped datasets (``bundled/``, checksum-verified), ImageNet-16H read from a folder
the user downloads (not shipped), preparation of a user's own data, annotation tables (long to wide, targets without a
gold label), the batch collator and the checks run before training.

Imports `hf_defer.modeling` (the ignore index), `hf_defer.experts` (the HateSpeech annotator expert) and the libraries;
never training, hub or commands.
"""

from .annotations import aggregate_labels, annotations_to_columns
from .collator import DataCollatorForDeferral
from .preparation import MISSING_EXPERT_MODES, PreparedDeferralData, prepare_deferral_dataset
from .convabuse import (
    CONVABUSE_ANNOTATORS,
    CONVABUSE_BINARY_NAMES,
    CONVABUSE_CITATION,
    CONVABUSE_SEVERITY_NAMES,
    load_convabuse,
)
from .hatespeech import (
    HATESPEECH_CITATION,
    HATESPEECH_HUB_ID,
    HATESPEECH_LABELS,
    default_hatespeech_source,
    load_hatespeech,
)
from .imagenet16h import (
    IMAGENET16H_CITATION,
    IMAGENET16H_LABELS,
    IMAGENET16H_MODELS,
    IMAGENET16H_NOISE_LEVELS,
    load_imagenet16h,
)
from .routellm_mmlu import ROUTELLM_MMLU_CITATION, ROUTELLM_MMLU_STRONG, ROUTELLM_MMLU_WEAK, load_routellm_mmlu

__all__ = [
    "CONVABUSE_ANNOTATORS",
    "CONVABUSE_BINARY_NAMES",
    "CONVABUSE_CITATION",
    "CONVABUSE_SEVERITY_NAMES",
    "DataCollatorForDeferral",
    "HATESPEECH_CITATION",
    "HATESPEECH_HUB_ID",
    "HATESPEECH_LABELS",
    "IMAGENET16H_CITATION",
    "IMAGENET16H_LABELS",
    "IMAGENET16H_MODELS",
    "IMAGENET16H_NOISE_LEVELS",
    "MISSING_EXPERT_MODES",
    "PreparedDeferralData",
    "ROUTELLM_MMLU_CITATION",
    "ROUTELLM_MMLU_STRONG",
    "ROUTELLM_MMLU_WEAK",
    "aggregate_labels",
    "annotations_to_columns",
    "default_hatespeech_source",
    "load_convabuse",
    "load_hatespeech",
    "load_imagenet16h",
    "load_routellm_mmlu",
    "prepare_deferral_dataset",
]
