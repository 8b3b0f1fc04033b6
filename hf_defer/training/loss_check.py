"""Did a training run learn? The mean loss of a fixed sample of training rows, before and after training.

A run can end without error and learn nothing: a linear head at a fine-tuning learning rate (5e-5) barely moves, and
every prediction stays at chance. The Trainer's logged losses are means of different batches, noisy on a small run;
the same rows, in evaluation mode, before and after, say it without noise.
"""

from __future__ import annotations

import math
from typing import Any

import torch

PROBE_ROWS = 256
"""The training rows whose mean loss is compared (the first ones): two forward passes over at most this many."""

FLAT_LOSS_CHANGE = 0.01
"""A run whose mean loss on those rows changed by less than this fraction learned next to nothing."""


@torch.no_grad()
def probe_loss(trainer: Any, dataset: Any, max_rows: int = PROBE_ROWS) -> float | None:
    """The model's mean loss on the first ``max_rows`` rows of ``dataset``, in evaluation mode (no dropout) and
    through the trainer's own evaluation loader and step; `None` for an empty dataset or where no loss is finite.

    Args:
        trainer ([`DeferralTrainer`]): the trainer, with its model in its current state.
        dataset (`datasets.Dataset`): training rows, as the trainer reads them.
        max_rows (`int`, *optional*, defaults to 256): how many of the first rows.

    Returns:
        `float` or `None`: the row-weighted mean of the batch losses.
    """
    if dataset is None or not hasattr(dataset, "select") or len(dataset) == 0:
        return None
    rows = dataset.select(range(min(max_rows, len(dataset))))
    model = trainer.model
    training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for batch in trainer.get_eval_dataloader(rows):
            loss, _, _ = trainer.prediction_step(model, batch, prediction_loss_only=True)
            size = next((len(value) for value in batch.values() if isinstance(value, torch.Tensor)), 0)
            if loss is not None and math.isfinite(float(loss)) and size:
                total, count = total + float(loss) * size, count + size
    finally:
        model.train(training)
    return total / count if count else None


def flat_loss_warning(before: float | None, after: float | None, learning_rate: float,
                      rows: int = PROBE_ROWS) -> str | None:
    """A warning, with what to do, when the loss moved by less than [`FLAT_LOSS_CHANGE`] of itself; else `None`.

    Example:

    ```python
    >>> from hf_defer.training.loss_check import flat_loss_warning
    >>> flat_loss_warning(1.3862, 1.3855, 5e-5) is not None, flat_loss_warning(1.3862, 0.91, 1e-3)
    (True, None)

    ```
    """
    if before is None or after is None or abs(before - after) > FLAT_LOSS_CHANGE * max(abs(before), 1e-12):
        return None
    return (f"the training loss barely moved ({before:.4f} before training, {after:.4f} after, on the first {rows} "
            f"training rows at most): the model learned next to nothing, and its estimates stay near where they "
            f"started. Raise --learning_rate (it was {learning_rate:g}; a head on a frozen encoder usually needs about "
            "1e-3, fine-tuning 2e-5 to 1e-4), train longer (--num_train_epochs), or check that the labels and the "
            "experts' answers vary.")
