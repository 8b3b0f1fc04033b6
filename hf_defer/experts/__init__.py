"""Experts: simulated ones (a real annotator drawn from vote counts, class-subset and dialect-biased experts), experts
that are models (`model_expert`) and cached sentence embeddings (the learned cascade has its own subpackage,
`hf_defer.cascade`; the paper's dialect model is in the repository's `research/twitteraae.py`).

Imports `hf_defer.modeling` (the pipeline's answer marker, and the model a head trained on sentence embeddings is put
on) and the libraries; never data, evaluation, training, hub or commands.
"""

from .embeddings import add_embeddings, embed_texts
from .model_experts import model_expert
from .simulated import annotator_accuracy, annotator_expert, class_subset_expert, dialect_biased_expert, stack_experts

__all__ = ["add_embeddings", "annotator_accuracy", "annotator_expert", "class_subset_expert",
           "dialect_biased_expert", "embed_texts", "model_expert", "stack_experts"]
