"""Data for learning to defer: the shipped datasets (``bundled/``, checksum-verified), ImageNet-16H read from a folder
the user downloads (not shipped), preparation of a user's own data, annotation tables (long to wide, targets without a
gold label), the batch collator and the checks run before training.

Imports `hf_defer.modeling` (the ignore index), `hf_defer.experts` (the HateSpeech annotator expert) and the libraries;
never training, hub or commands.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "CONVABUSE_ANNOTATORS": "convabuse",
    "CONVABUSE_BINARY_NAMES": "convabuse",
    "CONVABUSE_CITATION": "convabuse",
    "CONVABUSE_SEVERITY_NAMES": "convabuse",
    "DataCollatorForDeferral": "collator",
    "HATESPEECH_CITATION": "hatespeech",
    "HATESPEECH_HUB_ID": "hatespeech",
    "HATESPEECH_LABELS": "hatespeech",
    "IMAGENET16H_CITATION": "imagenet16h",
    "IMAGENET16H_LABELS": "imagenet16h",
    "IMAGENET16H_MODELS": "imagenet16h",
    "IMAGENET16H_NOISE_LEVELS": "imagenet16h",
    "MISSING_EXPERT_MODES": "preparation",
    "PreparedDeferralData": "preparation",
    "ROUTELLM_MMLU_CITATION": "routellm_mmlu",
    "ROUTELLM_MMLU_STRONG": "routellm_mmlu",
    "ROUTELLM_MMLU_WEAK": "routellm_mmlu",
    "aggregate_labels": "annotations",
    "annotations_to_columns": "annotations",
    "default_hatespeech_source": "hatespeech",
    "load_convabuse": "convabuse",
    "load_hatespeech": "hatespeech",
    "load_imagenet16h": "imagenet16h",
    "load_routellm_mmlu": "routellm_mmlu",
    "prepare_deferral_dataset": "preparation",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
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
