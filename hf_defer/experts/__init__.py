"""Experts: simulated ones (a real annotator drawn from vote counts, class-subset and dialect-biased experts), experts
that are models (`model_expert`), cached sentence embeddings, and the learned cascade
(`deferral_cascade`, its `"deferral-cascade"` pipeline in `cascade_pipeline`).

Imports `hf_defer.modeling` (the cascade's stages and the
pipeline's option checks), `hf_defer.evaluation.guarantees` (the cascade's escalation budget) and the libraries; never
training, hub or commands.
"""

from .model_experts import model_expert
from .simulated import annotator_accuracy, annotator_expert, class_subset_expert, dialect_biased_expert, stack_experts

__all__ = ["annotator_accuracy", "annotator_expert", "class_subset_expert", "dialect_biased_expert", "model_expert",
           "stack_experts"]
