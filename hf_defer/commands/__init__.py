"""Entry points: `scripts/run_deferral.py` (`run`), the `hf-defer` console command (`cli`) and their arguments.

May import every other subpackage (modeling, inspection, evaluation, data, experts, cascade, training, hub, review,
serving); nothing imports from here but `hf_defer.__main__`.
"""

from typing import Any

__all__ = ["main", "run_deferral"]


def __getattr__(name: str) -> Any:
    """`main` (the `hf-defer` command) and `run_deferral` (a training run from its argument dataclasses), imported
    when asked for: `hf-defer --help` must not import torch."""
    if name == "main":
        from .cli import main

        return main
    if name == "run_deferral":
        from .run import run_deferral

        return run_deferral
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
