"""The Hub: saving and uploading a deferral folder with its card (`save_for_hub`, `push_to_hub`), the model card and
`AutoModelForDeferral`.

Imports modeling, evaluation, data and the inspection of models and adapters (`hf_defer.inspection`); never training,
commands or review.
"""

from .auto import AutoModelForDeferral
from .model_card import DeferralModelCardData, render_model_card
from .model_source import check_model_source, resolve_model_name
from .sharing import push_to_hub, save_for_hub

__all__ = ["AutoModelForDeferral", "DeferralModelCardData", "check_model_source", "push_to_hub", "render_model_card",
           "resolve_model_name", "save_for_hub"]
