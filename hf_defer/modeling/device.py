"""The one check of a pipeline's ``device`` option, for the deferral pipeline and the cascade's: a device this machine
does not have is refused (transformers would fall back to the CPU without a word).

Like ``pipeline_deferral.py``, this module imports only ``torch`` and its siblings: it is copied next to the weights
for remote-code loading (``trust_remote_code=True``).
"""

from __future__ import annotations

from typing import Any

import torch

from .validators import is_int

__all__ = ["check_device"]


def check_device(device: Any) -> None:
    """Refuses a ``device`` this machine does not have (transformers would fall back to the CPU without a word): the
    one check of the ``device`` option, for the deferral pipeline and the cascade's.

    Args:
        device (`int`, `str` or `torch.device`, *optional*): as for `transformers.pipeline`; `None` or a negative
            int (the CPU) always passes.

    Raises:
        TypeError: not an int, a str or a `torch.device`.
        ValueError: a device this machine does not have, or a string torch cannot read.

    Example:

    ```python
    >>> check_device("cpu")
    >>> check_device("warp:0")
    Traceback (most recent call last):
    ...
    ValueError: device must name a device such as 'cpu' or 'cuda:0', got 'warp:0' (...).
    ```
    """
    integer = is_int(device)
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
