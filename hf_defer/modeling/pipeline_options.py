"""What the ``"deferral"`` pipeline checks of its options and inputs before running: loader options, the device,
the tokenizer / image-processor keyword arguments it passes on, and how feature vectors are batched.

A remote-code module like ``pipeline_deferral.py``, which imports it: only numpy, torch and the standard library.
"""

from __future__ import annotations

import inspect
import os
import warnings
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


def _split_side_features(config: Any, inputs: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """A model with side features (`config.side_features`) takes each input as a dict holding them beside its
    `text` (or `features`): the input without them, and the model's `side_categorical` / `side_numeric` for it."""
    specs = getattr(config, "side_features", None)
    if not specs or isinstance(inputs, _SideFeaturesTaken):
        return inputs, {}
    names = [spec["name"] for spec in specs]
    if not isinstance(inputs, dict):
        raise ValueError(f"this model takes the side features {names}: give each input as a dict, e.g. "
                         f"{{'text': ..., {names[0]!r}: ...}}, got {type(inputs).__name__}.")
    from .side_features import side_feature_tensors

    categorical, numeric = side_feature_tensors(specs, [inputs])
    rest = _SideFeaturesTaken({key: value for key, value in inputs.items() if key not in names})
    return rest, {"side_categorical": categorical, "side_numeric": numeric}


class _SideFeaturesTaken(dict):
    """An input dict whose side features were taken out (preprocessing it again does not look for them)."""


def _stack_features(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.cat([item[key] for item in items], dim=0) for key in items[0]}  # features (and availability)


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
        if value is not None:
            options[name] = int(value)  # a numpy integer reaches the DataLoader as a plain int (torch refuses it)


CASCADE_CONFIG_NAME = "cascade_config.json"
"""The file that makes a folder a deferral cascade (`hf_defer.cascade`): stage 1 at the folder's
root, stage 2 in ``stage2/``."""


def _refuse_cascade_folder(model: Any) -> None:
    """A cascade folder's root holds its stage 1: the deferral pipeline on it would run stage 1 alone, never paying
    stage 2's check of the escalation expert. Refuses the model loaded from such a folder (``model.name_or_path``)."""
    folder = getattr(model, "name_or_path", None)
    if isinstance(folder, (str, os.PathLike)) and str(folder) and \
            os.path.isfile(os.path.join(folder, CASCADE_CONFIG_NAME)):
        raise ValueError(
            f"{str(folder)!r} holds a deferral cascade ({CASCADE_CONFIG_NAME}): the 'deferral' pipeline would run its "
            "stage 1 alone. Run the whole cascade with pipeline('deferral-cascade', model=folder, experts={...}) "
            "(library mode: import hf_defer), or hf_defer.DeferralCascade.from_pretrained(folder)."
        )


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


class _WithAvailability:
    """One pipeline input with the experts who can answer it (a per-input ``available_experts``): `preprocess` unwraps
    it and the mask rides with the model inputs, through batching, to `postprocess`."""

    __slots__ = ("inputs", "available")

    def __init__(self, inputs: Any, available: np.ndarray) -> None:
        self.inputs, self.available = inputs, available


def _expert_mask(value: Any, names: list[str]) -> np.ndarray | None:
    """One input's (or a whole call's) availability as bool ``[M]``: a list of expert names or a bool mask of length
    M; `None` when ``value`` is neither (a per-input form, for the caller to try)."""
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(name, str) for name in value):
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"available_experts names {unknown}, which are not in config.expert_names {names}.")
        return np.array([name in value for name in names], dtype=bool)
    try:
        array = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value)
    except (TypeError, ValueError):  # ragged: per-input lists of names of different lengths
        return None
    if array.ndim != 1 or array.dtype == object:
        return None
    if array.dtype != bool and not (np.issubdtype(array.dtype, np.integer) and np.isin(array, (0, 1)).all()):
        raise ValueError(f"available_experts must be expert names or a bool mask, got {value!r:.80}.")
    if array.shape[0] != len(names):
        raise ValueError(f"available_experts must have one entry per expert ({len(names)}: {names}), got {value!r:.80}.")
    return array.astype(bool)


def _availability(value: Any, names: list[str]) -> tuple[bool, np.ndarray]:
    """``available_experts`` as ``(per_input, mask)``: the same experts for every input (bool ``[M]``, from names or
    a mask) or one row per input (bool ``[N, M]``, from a 2-D mask or a list of per-input names / masks)."""
    if isinstance(value, (str, bytes, dict)):
        raise TypeError(f"available_experts must be a list of expert names (or a bool mask), got {value!r:.80}.")
    mask = _expert_mask(value, names) if value is not None else None
    if mask is not None:
        return False, mask
    try:
        rows = [_expert_mask(row, names) for row in value]
    except TypeError:
        rows = [None]
    if not rows or any(row is None for row in rows):
        raise ValueError(f"available_experts must be expert names or a bool mask of length {len(names)} (for every "
                         f"input), or one of those per input; got {value!r:.80}.")
    return True, np.stack(rows)


def _with_availability(inputs: Any, mask: np.ndarray, single: bool) -> Any:
    """The input(s) wrapped with their row of a per-input availability ``mask [N, M]``."""
    items = [inputs] if single else inputs
    if not isinstance(items, list) or len(items) != mask.shape[0]:
        count = f"{len(items)} inputs" if isinstance(items, list) else f"a {type(inputs).__name__}"
        raise ValueError(f"available_experts has {mask.shape[0]} rows (one per input), but the call has {count}: give "
                         "a list of inputs with one availability entry each.")
    wrapped = [_WithAvailability(item, row) for item, row in zip(items, mask)]
    return wrapped[0] if single else wrapped


def warn_outside_guarantee(config: Any, expert_costs: Any, defer_threshold: Any, available: Any) -> None:
    """Warns when a call decides otherwise than ``config.deferral_guarantee`` was certified for (`calibrate_deferral`
    with a confidence): other costs, experts, threshold or whole-call availability. The promise then does not hold."""
    guarantee = getattr(config, "deferral_guarantee", None)
    if not isinstance(guarantee, dict):
        return
    names, zeros = list(config.expert_names), [0.0] * len(config.expert_names)
    threshold = float(config.defer_threshold if defer_threshold is None else defer_threshold)
    costs = getattr(config, "expert_costs", None) if expert_costs is None else expert_costs
    certified_costs = guarantee.get("expert_costs") or zeros
    reasons = []
    if abs(threshold - float(guarantee.get("threshold", threshold))) > 1e-12:
        reasons.append(f"defer_threshold {threshold!r} (certified: {guarantee.get('threshold')!r})")
    if [float(c) for c in (costs or zeros)] != [float(c) for c in certified_costs]:
        reasons.append(f"expert_costs {list(costs or zeros)} (certified: {certified_costs})")
    if names != guarantee.get("expert_names", names):
        reasons.append(f"experts {names} (certified: {guarantee.get('expert_names')})")
    certified_available = guarantee.get("available_experts")
    if available is not None and certified_available != "given per input":
        asked = [name for name, on in zip(names, np.asarray(available, dtype=bool)) if on]
        if sorted(asked) != sorted(certified_available or names):
            reasons.append(f"available_experts {asked} (certified: {certified_available or names})")
    if reasons:
        claims = ", ".join(f"{claim.get('kind')} <= {claim.get('target')}" for claim in guarantee.get("claims", []))
        warnings.warn(f"this call is not covered by the model's deferral guarantee ({claims} with confidence "
                      f"{guarantee.get('confidence')}): it decides with {'; '.join(reasons)}. Calibrate again "
                      "(hf_defer.calibrate_deferral) for these settings.", UserWarning, stacklevel=4)
