"""Entry points: `scripts/run_deferral.py` (`run`), the `hf-defer` console command (`cli`) and their arguments.

May import every other subpackage (modeling, inspection, evaluation, data, experts, cascade, training, hub, review,
serving); nothing imports from here but `hf_defer.__main__`.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "main": "cli",
    "run_deferral": "run",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .cli import main
    from .run import run_deferral
