"""Lazy packages: a package's public names imported from their modules when first read (PEP 562), and the
registrations with transformers made when transformers' registries are imported.

`import hf_defer` (or `hf_defer.modeling`...) runs no torch, transformers or datasets import: each package's
`__init__` holds a table name -> module, and [`lazy_exports`] gives it the `__getattr__` and `__dir__` that import a
module the first time one of its names is read (as transformers' `_LazyModule` does). The `if TYPE_CHECKING:` block
of each `__init__` repeats the imports for type checkers and editors; `tests/test_lazy_import.py` holds the two equal.

[`register_on_import`] keeps `import hf_defer` followed by `AutoConfig.from_pretrained(folder)`,
`AutoModel.from_pretrained(folder)` or `pipeline("deferral", ...)` working: the modules that define the classes
register them when they are imported, and these imports run right after transformers' registry module is imported
(or at once, when it already is).

The ground floor of the package: standard library only, and imported by every layer.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports", "register_on_import"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of `package`, whose public names `exports` maps to the module that
    defines each, relative to `package` (`"configuration_deferral"`, `"modeling.configuration_deferral"`).

    A name is imported once, then stored in the package's namespace (the next read is a plain attribute); a name that
    is neither exported nor a submodule raises `AttributeError`, as for any module.

    Example:

    ```python
    >>> import hf_defer.modeling as modeling
    >>> modeling.DeferralConfig.model_type  # hf_defer.modeling.configuration_deferral, imported now
    'deferral'
    >>> "DeferralConfig" in dir(modeling)
    True

    ```
    """
    namespace = sys.modules[package].__dict__  # the package being initialised

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


_WATCHED = ("transformers", "hf_defer.")


class _RegisterOnImport:  # a `sys.meta_path` finder (`importlib.abc` itself costs 10 ms to import)
    """A finder that finds nothing itself: it lets the other finders find the modules of transformers and hf_defer and
    wraps their execution, so that the registering modules a trigger calls for are imported once no module of
    either is running any more (imported while one is half-run, they could find it without the names they import)."""

    def __init__(self, triggers: Mapping[str, Sequence[str]]) -> None:
        self.triggers = {name: tuple(modules) for name, modules in triggers.items()}
        self.pending: list[str] = []
        self.running = 0  # watched modules being executed now

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(_WATCHED):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        execute = getattr(spec.loader, "exec_module", None)
        if execute is not None:

            def exec_module(module: Any) -> None:
                self.running += 1
                try:
                    execute(module)
                finally:
                    self.running -= 1
                self.finished(fullname)

            spec.loader.exec_module = exec_module  # this module's loader only: each spec has its own
        return spec

    def finished(self, name: str) -> None:
        """`name` has run: queue the modules it calls for, and import the queue when no watched module is running."""
        for module in self.triggers.pop(name, ()):
            if module not in self.pending:
                self.pending.append(module)
        if self.running or not self.pending:
            return
        todo, self.pending = self.pending, []
        for module in todo:
            importlib.import_module(module)  # registers itself with transformers
        if not self.triggers and not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)


def register_on_import(triggers: Mapping[str, Sequence[str]]) -> None:
    """For each module of `triggers` (a registry of transformers, e.g. `"transformers.pipelines"`), imports the
    modules it lists (modules of hf_defer that register their classes there when imported) right after it is
    imported; at once for one that is imported already.

    Example:

    ```python
    >>> import hf_defer
    >>> from transformers import AutoConfig  # imports hf_defer.modeling.configuration_deferral, which registers
    >>> AutoConfig.for_model("deferral", feature_size=4).model_type
    'deferral'

    ```
    """
    watcher = _RegisterOnImport(triggers)
    sys.meta_path.insert(0, watcher)
    for name in triggers:
        if name in sys.modules:
            watcher.finished(name)
