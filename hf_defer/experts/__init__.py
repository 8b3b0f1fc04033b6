"""Experts: simulated ones (a real annotator drawn from vote counts, class-subset and dialect-biased experts), experts
that are models (`model_expert`) and cached sentence embeddings (the learned cascade has its own subpackage,
`hf_defer.cascade`; the paper's dialect model is in the repository's `research/twitteraae.py`).

Imports `hf_defer.modeling` (the pipeline's answer marker, and the model a head trained on sentence embeddings is put
on) and the libraries; never data, evaluation, training, hub or commands.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "add_embeddings": "embeddings",
    "annotator_accuracy": "simulated",
    "annotator_expert": "simulated",
    "class_subset_expert": "simulated",
    "dialect_biased_expert": "simulated",
    "embed_texts": "embeddings",
    "model_expert": "model_experts",
    "stack_experts": "simulated",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .embeddings import add_embeddings, embed_texts
    from .model_experts import model_expert
    from .simulated import annotator_accuracy, annotator_expert, class_subset_expert, dialect_biased_expert, stack_experts
