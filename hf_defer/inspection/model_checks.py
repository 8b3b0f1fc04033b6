"""Checks of a model and of its training checkpoints, shared by [`DeferralTrainer`] and the Hub helpers: that a model
is a deferral model, and which `checkpoint-N` folder the Trainer finished writing (the one to resume from).

Imports no other part of hf_defer.
"""

from __future__ import annotations

import json
import os
import re
import struct
from typing import Any

from transformers.utils import logging

logger = logging.get_logger(__name__)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")


def check_deferral_model(model: Any) -> None:
    """Refuses anything but a deferral model (`config.model_type == "deferral"`): for the Trainer and the Hub helpers.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> from hf_defer.inspection import check_deferral_model
    >>> check_deferral_model(EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2)))
    >>> check_deferral_model(torch.nn.Linear(4, 2))
    Traceback (most recent call last):
        ...
    ValueError: model must be a deferral model (config.model_type == 'deferral'), got Linear.

    ```
    """
    if getattr(getattr(model, "config", None), "model_type", None) != "deferral":
        raise ValueError(
            f"model must be a deferral model (config.model_type == 'deferral'), got {type(model).__name__}."
        )


def _is_complete(folder: str) -> bool:
    """Whether the Trainer finished writing the checkpoint ``folder``: ``trainer_state.json``, which it writes last,
    parses, and a weights file is there whole (a safetensors file as long as its header says; an FSDP checkpoint's
    weights as torch.distributed.checkpoint or FULL_STATE_DICT write them)."""
    try:
        with open(os.path.join(folder, "trainer_state.json")) as file:
            json.load(file)
    except (OSError, ValueError):
        return False
    for weights in _WEIGHTS:
        path = os.path.join(folder, weights)
        if not os.path.isfile(path):
            continue
        if not weights.endswith(".safetensors"):
            return True
        try:
            with open(path, "rb") as file:
                (size,) = struct.unpack("<Q", file.read(8))
                header = json.loads(file.read(size))
            end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
            return os.path.getsize(path) == 8 + size + end
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return False
    # An FSDP checkpoint (accelerate's save_fsdp_model) under SHARDED_STATE_DICT has no file above: its weights are a
    # torch.distributed.checkpoint folder whose .metadata is written last, once every process wrote its shard.
    return (os.path.isfile(os.path.join(folder, "pytorch_model_fsdp.bin"))
            or os.path.isfile(os.path.join(folder, "pytorch_model_fsdp_0", ".metadata")))


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest ``checkpoint-N`` folder of ``output_dir`` that the Trainer finished writing.

    Newer folders left incomplete (the process was killed while saving) are skipped with a warning naming them.

    Returns:
        `str` or `None`: the folder, or `None` when ``output_dir`` holds no checkpoint at all.

    Raises:
        `ValueError`: every checkpoint folder is incomplete.

    Example:

    ```python
    >>> import json, os, tempfile
    >>> from hf_defer.inspection import last_complete_checkpoint
    >>> output_dir = tempfile.mkdtemp()
    >>> for step in (10, 20):
    ...     os.makedirs(os.path.join(output_dir, f"checkpoint-{step}"))
    >>> with open(os.path.join(output_dir, "checkpoint-10", "trainer_state.json"), "w") as file:
    ...     json.dump({"global_step": 10}, file)
    >>> open(os.path.join(output_dir, "checkpoint-10", "pytorch_model.bin"), "wb").close()
    >>> os.path.basename(last_complete_checkpoint(output_dir))  # checkpoint-20 was never finished: skipped
    'checkpoint-10'
    >>> print(last_complete_checkpoint(tempfile.mkdtemp()))  # no checkpoint at all
    None

    ```
    """
    if not os.path.isdir(output_dir):
        return None
    found = [(int(match.group(1)), entry) for entry in os.listdir(output_dir)
             if (match := _CHECKPOINT.match(entry)) and os.path.isdir(os.path.join(output_dir, entry))]
    skipped: list[str] = []
    for _, entry in sorted(found, reverse=True):
        folder = os.path.join(output_dir, entry)
        if _is_complete(folder):
            if skipped:
                logger.warning(f"Resuming from {folder}: the newer checkpoint(s) {skipped} are incomplete (no readable "
                               "trainer_state.json or weights: the run was stopped while saving) and are skipped.")
            return folder
        skipped.append(folder)
    if skipped:
        raise ValueError(f"resume_from_checkpoint=True found no complete checkpoint in {str(output_dir)!r}: {skipped} "
                         "are incomplete (no readable trainer_state.json or weights). Start without resuming.")
    return None


__all__ = ["check_deferral_model", "last_complete_checkpoint"]
