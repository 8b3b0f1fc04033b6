"""Library mode or remote code: whether this folder's modules run as part of the installed hf_defer, or as the copy
`save_pretrained` puts next to a model's weights (loaded with `trust_remote_code=True`, without hf_defer).

In library mode a model reaches three functions of the library above this folder, named here and imported when called
([`library_function`]): the pipeline's model experts (`experts=`), `push_to_hub`'s deferral card and the loaders'
name resolution (`resolve_model_name`: a missing folder named at once, offline the shipped MiniLM). A saved folder's
copy has none of them and says so or passes names to transformers as they are.

Standard library only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["LIBRARY_MODE", "library_function"]

LIBRARY_MODE = __name__.split(".")[0] == "hf_defer"
"""True for the installed hf_defer; False for a saved folder's copy (its module is `transformers_modules...`)."""


def library_function(module: str, name: str) -> Callable[..., Any] | None:
    """`hf_defer.<module>.<name>` in library mode, imported now; `None` in a saved folder's copy.

    Example:

    ```python
    >>> from hf_defer.modeling.library_mode import library_function
    >>> library_function("hub.sharing", "push_to_hub").__module__
    'hf_defer.hub.sharing'

    ```
    """
    if not LIBRARY_MODE:
        return None
    return getattr(importlib.import_module(f"hf_defer.{module}"), name)
