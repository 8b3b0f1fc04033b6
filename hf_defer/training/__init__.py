"""Training: `DeferralTrainer` (a `transformers.Trainer`), PEFT/LoRA adapters and padding tokens for decoder
tokenizers.

Imports modeling, evaluation, data, inspection (model, adapter and checkpoint checks) and the hub's model card
(written at the end of training); never commands or review.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "DeferralTrainer": "trainer",
    "ensure_pad_token": "tokenization",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .tokenization import ensure_pad_token
    from .trainer import DeferralTrainer
