"""The root of hf_defer's caches (sentence embeddings, model experts' answers, the command line's flags), after the
Hugging Face cache conventions. Standard library only: the command line reads it before torch is imported."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["hf_defer_cache_dir"]


def hf_defer_cache_dir() -> Path:
    """`$HF_DEFER_CACHE` if that variable is set, else `hf_defer` under the Hugging Face home: `$HF_HOME`, else
    `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface` (where `datasets` and `evaluate` keep theirs).

    Returns:
        `pathlib.Path`: the (possibly not yet existing) folder.

    Example:

    ```python
    >>> import os
    >>> from hf_defer.experts.cache import hf_defer_cache_dir
    >>> hf_defer_cache_dir().name if "HF_DEFER_CACHE" not in os.environ else "hf_defer"
    'hf_defer'

    ```
    """
    root = os.environ.get("HF_DEFER_CACHE")
    if root:
        return Path(root).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hf_defer"
