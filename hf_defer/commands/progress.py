"""Progress bars where a person watches, none in a log file: what `hf-defer` does with them before a command runs.

When stderr is a terminal, the bars of transformers ("Loading weights", "Writing model shards"), datasets ("Running
tokenizer on dataset", "Flattening the indices"), huggingface_hub (downloads), the Trainer and hf_defer ("Deciding")
show as usual. When it is not (a file, a pipe, a CI log), a bar would be one ever longer line of carriage returns, so
they are switched off with the libraries' own switches: `HF_HUB_DISABLE_PROGRESS_BARS` (huggingface_hub, and
transformers, which follows it) and `HF_DATASETS_DISABLE_PROGRESS_BARS` for libraries not imported yet, their
`disable_progress_bar(s)` functions for those already imported. Setting either variable yourself wins
(`HF_HUB_DISABLE_PROGRESS_BARS=0` keeps every bar in a log). hf_defer's own bars and `hf-defer train`'s Trainer follow
the same switch ([`progress_bars_disabled`]).

Standard library only: the command line loads it before torch.
"""

from __future__ import annotations

import os
import sys
from typing import IO

__all__ = ["progress_bars_disabled", "quiet_progress_bars_unless_terminal"]

def _is_terminal(stream: IO[str] | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # a closed or unusual stream: no person watches it
        return False


def quiet_progress_bars_unless_terminal(stream: IO[str] | None = None) -> bool:
    """Switches the progress bars off when `stream` (default: stderr) is not a terminal; returns whether it did.

    Example:

    ```python
    >>> import io
    >>> from hf_defer.commands.progress import quiet_progress_bars_unless_terminal
    >>> quiet_progress_bars_unless_terminal(io.StringIO())  # a log file: no bars  # doctest: +SKIP
    True

    ```
    """
    if _is_terminal(sys.stderr if stream is None else stream):
        return False
    # read by the libraries when they are imported; a user's own value wins, and datasets follows the Hub's
    hub = os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    hub_off = hub.strip().lower() in ("1", "true", "yes", "on")
    datasets_off = os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", hub).strip().lower() in (
        "1", "true", "yes", "on")
    if hub_off and "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if hub_off and "transformers" in sys.modules:
        from transformers.utils import logging

        logging.disable_progress_bar()
    if datasets_off and "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()
    return hub_off


def progress_bars_disabled() -> bool:
    """Whether the progress bars are off (huggingface_hub's switch, which [`quiet_progress_bars_unless_terminal`]
    sets): hf_defer's own bars, and the Trainer's in `hf-defer train`, follow it."""
    from huggingface_hub.utils import are_progress_bars_disabled

    return are_progress_bars_disabled()
