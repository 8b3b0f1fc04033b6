"""What the benchmark JSON files of the GPU figures (issue 32, item 4) share: the device they ran on, named, the
versions, and writing the file as soon as a measurement is done (so that a run cut short by `timeout` leaves what
it had measured).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or `platform.processor()` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def resolve_device(name: str) -> str:
    """`"auto"` becomes `"cuda"` when a GPU is visible, else `"cpu"`; any other name is checked and returned.

    Example:

    ```python
    >>> resolve_device("cpu")
    'cpu'
    >>> resolve_device("tpu")
    Traceback (most recent call last):
    ValueError: --device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'tpu'.

    ```
    """
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise ValueError(f"--device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}.")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name!r} was asked for, but torch {torch.__version__} sees no CUDA device.")
    return name


def device_name(device: str) -> str:
    """The device named: `torch.cuda.get_device_name` for a GPU, the CPU model otherwise."""
    import torch

    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else cpu_model()


def environment(device: str) -> dict[str, Any]:
    """The device, named (`torch.cuda.get_device_name` for a GPU, the CPU model otherwise), the core count and the
    versions of Python, torch, CUDA, transformers and datasets, with the UTC time."""
    import datasets
    import torch
    import transformers

    facts: dict[str, Any] = {
        "device": device,
        "device_name": device_name(device),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    if device.startswith("cuda"):
        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        facts["device_memory_gib"] = round(total / 2**30, 1)
    return facts


def write_json(path: Path | str, payload: dict[str, Any]) -> None:
    """Writes `payload` to `path` (folders made) through a temporary file renamed over it, so that a reader (or a
    `timeout` that kills the run) never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(temporary, path)
