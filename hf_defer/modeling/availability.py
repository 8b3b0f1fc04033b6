"""Which experts can answer an input: the one reading of ``available_experts`` ([`parse_available_experts`]), for
the deferral pipeline and [`calibrate_deferral`], and the per-input form that rides with an input through the
pipeline ([`InputWithAvailability`]).

Like ``pipeline_deferral.py``, this module imports only ``numpy``, ``torch`` and the standard library: it is copied next
to the weights for remote-code loading (``trust_remote_code=True``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["InputWithAvailability", "parse_available_experts", "with_availability"]


class InputWithAvailability:
    """One pipeline input with the experts who can answer it (a per-input ``available_experts``): `preprocess` unwraps
    it and the mask rides with the model inputs, through batching, to `postprocess`. [`calibrate_deferral`] wraps its
    inputs so too.

    Example:

    ```python
    >>> item = InputWithAvailability("some text", np.array([True, False]))
    >>> item.inputs, item.available.tolist()
    ('some text', [True, False])
    ```
    """

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


def parse_available_experts(value: Any, names: list[str]) -> tuple[bool, np.ndarray]:
    """``available_experts`` as ``(per_input, mask)``: the same experts for every input (bool ``[M]``, from names or
    a mask) or one row per input (bool ``[N, M]``, from a 2-D mask or a list of per-input names / masks). The one
    reading of the argument, for the pipeline and [`calibrate_deferral`].

    Args:
        value: expert names, a bool mask of length M, or one of those per input.
        names (`list[str]`): `config.expert_names`, in order.

    Raises:
        TypeError / ValueError: naming ``available_experts`` and what it holds.

    Example:

    ```python
    >>> parse_available_experts(["bob"], ["alice", "bob"])
    (False, array([False,  True]))
    >>> parse_available_experts([["alice"], ["alice", "bob"]], ["alice", "bob"])[1].tolist()
    [[True, False], [True, True]]
    ```
    """
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


def with_availability(inputs: Any, mask: np.ndarray, single: bool) -> Any:
    """The input(s) wrapped with their row of a per-input availability ``mask [N, M]``."""
    items = [inputs] if single else inputs
    if not isinstance(items, list) or len(items) != mask.shape[0]:
        count = f"{len(items)} inputs" if isinstance(items, list) else f"a {type(inputs).__name__}"
        raise ValueError(f"available_experts has {mask.shape[0]} rows (one per input), but the call has {count}: give "
                         "a list of inputs with one availability entry each.")
    wrapped = [InputWithAvailability(item, row) for item, row in zip(items, mask)]
    return wrapped[0] if single else wrapped
