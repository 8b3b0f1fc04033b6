"""The Hub: saving and uploading a deferral folder with its card (`save_for_hub`, `push_to_hub`), the model card and
`AutoModelForDeferral`.

Imports modeling, evaluation, data and the inspection of models and adapters (`hf_defer.inspection`); never training,
commands or review.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "AutoModelForDeferral": "auto",
    "DeferralModelCardData": "model_card",
    "check_model_source": "model_source",
    "push_to_hub": "sharing",
    "render_model_card": "model_card",
    "resolve_model_name": "model_source",
    "save_for_hub": "sharing",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .auto import AutoModelForDeferral
    from .model_card import DeferralModelCardData, render_model_card
    from .model_source import check_model_source, resolve_model_name
    from .sharing import push_to_hub, save_for_hub
