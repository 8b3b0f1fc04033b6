"""What the ``"deferral"`` pipeline checks of its options and inputs before running: loader options, the device,
the tokenizer / image-processor keyword arguments it passes on, and how feature vectors are batched.

A remote-code module like ``pipeline_deferral.py``, which imports it: only numpy, torch and the standard library.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _is_sequence_like(value: Any) -> bool:
    """A sized, indexable batch that is not one of the input types themselves (a `datasets` Column, a deque...)."""
    if isinstance(value, (str, bytes, dict, list, tuple, np.ndarray, torch.Tensor)) or hasattr(value, "column_names"):
        return False
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and hasattr(value, "__iter__")


def _stack_features(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {"features": torch.cat([item["features"] for item in items], dim=0)}


# Tokenizer arguments the pipeline sets itself (the input, return_tensors) or that would change what the model receives
# (several rows per input, extra outputs the model does not take).
_RESERVED_TOKENIZER_ARGS = {"self", "text", "text_pair", "text_target", "text_pair_target", "return_tensors",
                            "is_split_into_words", "return_overflowing_tokens", "return_special_tokens_mask",
                            "return_offsets_mapping", "return_length", "tokenizer_kwargs"}


def _processor_options(processor: Any) -> set[str]:
    """The keyword arguments of a tokenizer's ``__call__`` (or an image processor's ``preprocess`` and its
    ``valid_kwargs``) that the pipeline passes on."""
    if hasattr(processor, "pad"):  # a tokenizer
        parameters = inspect.signature(processor.__call__).parameters
        reserved = _RESERVED_TOKENIZER_ARGS
    else:
        parameters = inspect.signature(processor.preprocess).parameters
        reserved = {"self", "images", "return_tensors", "image_like_kwargs"}
    named = {name for name, parameter in parameters.items()
             if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    typed = getattr(getattr(processor, "valid_kwargs", None), "__annotations__", {})  # v5 image processors
    return (named | set(typed)) - reserved


def _check_loader_options(options: dict[str, Any]) -> None:
    """``batch_size`` and ``num_workers``, which the base class hands to a `DataLoader` unchecked."""
    for name, least in (("batch_size", 1), ("num_workers", 0)):
        value = options.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least):
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}.")


def _check_device(device: Any) -> None:
    """Refuses a ``device`` this machine does not have (transformers would fall back to the CPU without a word)."""
    integer = isinstance(device, (int, np.integer)) and not isinstance(device, bool)
    if device is None or (integer and device < 0):
        return
    if not integer and not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be an int, a str or a torch.device, got {type(device).__name__}.")
    if integer:
        available = torch.accelerator.is_available()
        count = torch.accelerator.device_count() if available else 0
        if device >= count:
            raise ValueError(
                f"device={device} asks for accelerator {device}, but this machine has {count or 'none'}"
                f"{' (' + str(torch.accelerator.current_accelerator()) + ')' if count else ''}; pass device='cpu' (or -1)."
            )
        return
    try:
        parsed = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must name a device such as 'cpu' or 'cuda:0', got {device!r} ({err}).") from None
    if parsed.type in ("cpu", "meta"):
        return
    backend = getattr(torch, parsed.type, None)
    count = backend.device_count() if backend is not None and backend.is_available() else 0
    if (parsed.index or 0) >= count:
        raise ValueError(
            f"device={str(device)!r} is not available on this machine ({count} {parsed.type} device(s)); "
            "pass device='cpu' (or -1)."
        )
