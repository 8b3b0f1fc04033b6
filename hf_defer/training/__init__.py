"""Training: `DeferralTrainer` (a `transformers.Trainer`), PEFT/LoRA adapters, padding tokens for decoder
tokenizers, and the list of private upstream names hf_defer relies on (`upstream_hooks`).

Imports modeling, evaluation, data, inspection (model, adapter and checkpoint checks) and the hub's model card
(written at the end of training); never commands or review.
"""

from typing import Any

from .tokenization import ensure_pad_token

__all__ = ["DeferralTrainer", "ensure_pad_token"]


def __getattr__(name: str) -> Any:
    """`DeferralTrainer`, imported when asked for: the trainer writes the hub's model card, and the hub reads this
    folder's adapter checks (`adapters`), so importing it here would run the two folders' imports in a circle."""
    if name == "DeferralTrainer":
        from .trainer import DeferralTrainer

        return DeferralTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
