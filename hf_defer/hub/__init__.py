"""The Hub: saving and uploading a deferral folder with its card (`save_for_hub`, `push_to_hub`), the model card and
`AutoModelForDeferral`.

Imports modeling, evaluation, data and training's adapter helpers; never commands or review.
"""

from .model_source import check_model_source
from .sharing import push_to_hub, save_for_hub

__all__ = ["check_model_source", "push_to_hub", "save_for_hub"]
