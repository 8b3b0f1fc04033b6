"""Inspecting a model and its saved folders without changing them, for both training and the Hub helpers: whether a
model is a deferral model, what its PEFT adapters say (`adapters`: base model, trainable head, a loadable adapter
folder) and which training checkpoint is complete (`model_checks`).

Imports nothing else of hf_defer (only the libraries), so training and hub can both import it without a loop.
"""

from .adapters import (active_adapter, adapter_base_model, check_adapter_loadable, check_head_trainable, has_adapters,
                       is_peft_model)
from .model_checks import check_deferral_model, last_complete_checkpoint

__all__ = ["active_adapter", "adapter_base_model", "check_adapter_loadable", "check_deferral_model",
           "check_head_trainable", "has_adapters", "is_peft_model", "last_complete_checkpoint"]
