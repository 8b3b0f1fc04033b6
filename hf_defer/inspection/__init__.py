"""Inspecting a model and its saved folders without changing them, for both training and the Hub helpers: whether a
model is a deferral model, what its PEFT adapters say (`adapters`: base model, trainable head, a loadable adapter
folder) and which training checkpoint is complete (`model_checks`).

Imports nothing else of hf_defer (only the libraries), so training and hub can both import it without a loop.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "active_adapter": "adapters",
    "adapter_base_model": "adapters",
    "check_adapter_loadable": "adapters",
    "check_deferral_model": "model_checks",
    "check_head_trainable": "adapters",
    "has_adapters": "adapters",
    "is_peft_model": "adapters",
    "last_complete_checkpoint": "model_checks",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .adapters import (active_adapter, adapter_base_model, check_adapter_loadable, check_head_trainable, has_adapters,
                           is_peft_model)
    from .model_checks import check_deferral_model, last_complete_checkpoint
