"""The private upstream names hf_defer relies on (tests/training/upstream_hooks.py): each still has the signature
and the callers hf_defer's code was written against, the check catches a change of each kind, and every private
upstream name hf_defer's source uses is listed."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import types
from pathlib import Path

import pytest

import hf_defer
from upstream_hooks import UPSTREAM_HOOKS, UpstreamHook, check_hook, check_upstream_hooks

PACKAGE = Path(hf_defer.__file__).resolve().parent
LISTED = {hook.name for hook in UPSTREAM_HOOKS}


def test_every_listed_hook_holds_with_the_installed_versions():
    problems = check_upstream_hooks()
    assert not problems, "upstream changed what hf_defer relies on:\n- " + "\n- ".join(problems)


def test_each_entry_names_a_use_and_a_reason():
    assert len({hook.target for hook in UPSTREAM_HOOKS}) == len(UPSTREAM_HOOKS)
    for hook in UPSTREAM_HOOKS:
        assert hook.used_in.startswith("hf_defer.") and len(hook.stands_in_for) > 20, hook
        if hook.usage in ("override", "patch"):  # skipped silently unless upstream still calls it
            assert hook.referenced_by or hook.target.endswith(".add_adapter"), hook  # a user calls add_adapter


@pytest.fixture
def fake_upstream(monkeypatch) -> types.ModuleType:
    """A module standing for a new upstream release: `Loop.step` calls `_norm(model, grad_norm, clip)` (a parameter
    more than hf_defer knows) and no longer calls `_log`."""
    module = types.ModuleType("fake_upstream")
    source = (
        "class Loop:\n"
        "    def _norm(self, model, grad_norm=None, clip=True):\n        return 0.0\n"
        "    def _log(self, value):\n        return value\n"
        "    def step(self, model):\n        return [self._norm(model) for _ in range(2)]\n"
    )
    exec(compile(source, "fake_upstream.py", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "fake_upstream", module)
    return module


def test_the_check_reports_a_changed_signature_a_dropped_caller_and_a_gone_name(fake_upstream):
    signature = UpstreamHook("fake_upstream.Loop._norm", "override", "hf_defer.x", "what the override is for",
                             ("self", "model", "grad_norm"), ("fake_upstream.Loop.step",))
    [problem] = check_hook(signature)
    assert "changed its signature" in problem and "('self', 'model', 'grad_norm', 'clip')" in problem
    assert "hf_defer.x" in problem and "upstream_hooks.py" in problem  # where to fix it
    dropped = UpstreamHook("fake_upstream.Loop._log", "override", "hf_defer.y", "what the override is for",
                           ("self", "value"), ("fake_upstream.Loop.step",))
    [problem] = check_hook(dropped)
    assert "fake_upstream.Loop.step no longer references _log" in problem and "skipped silently" in problem
    gone = UpstreamHook("fake_upstream.Loop._clip", "call", "hf_defer.z", "what the call is for", ("self",))
    [problem] = check_hook(gone)
    assert "fake_upstream.Loop._clip is gone" in problem
    attribute = UpstreamHook("fake_upstream.Loop._state", "read", "hf_defer.w", "what the attribute is for",
                             referenced_by=("fake_upstream.Loop.__init__",), instance_attribute=True)
    [problem] = check_hook(attribute)  # Loop has no __init__ of its own: object's, which has no code
    assert "no longer references _state" in problem
    assert check_hook(UpstreamHook("fake_upstream.Loop._norm", "override", "hf_defer.x", "what it is for",
                                   ("self", "model", "grad_norm", "clip"), ("fake_upstream.Loop.step",))) == []


def test_a_bad_usage_is_refused():
    with pytest.raises(ValueError, match="usage must be one of"):
        UpstreamHook("transformers.Trainer.train", "replace", "hf_defer.x", "why")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _source_files() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "metric_scripts" not in path.parts)


def _private_names_used_not_defined() -> dict[str, set[str]]:
    """Private attribute names hf_defer's source reads (`x._name`, `getattr(x, "_name")`) that hf_defer itself never
    defines (no `def _name`, class or `self._name = ...`): upstream's."""
    used: dict[str, set[str]] = {}
    defined: set[str] = set()
    for path in _source_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.Attribute):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                if isinstance(node.ctx, ast.Store) and owner in ("self", "cls"):
                    defined.add(node.attr)
                elif _private(node.attr):
                    used.setdefault(node.attr, set()).add(path.name)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                  and _private(node.args[1].value)):
                used.setdefault(node.args[1].value, set()).add(path.name)
    return {name: files for name, files in used.items() if name not in defined}


def _private_upstream_overrides() -> dict[str, str]:
    """Private methods of hf_defer's classes that override a method of an upstream base class."""
    found: dict[str, str] = {}
    for path in _source_files():
        tree = ast.parse(path.read_text())
        classes = [node for node in tree.body if isinstance(node, ast.ClassDef)
                   and any(isinstance(item, ast.FunctionDef) and _private(item.name) for item in node.body)]
        if not classes:
            continue
        module = importlib.import_module(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        for node in classes:
            cls = getattr(module, node.name)
            upstream = [base for base in cls.__mro__[1:] if not base.__module__.startswith("hf_defer")]
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and _private(item.name):
                    if any(item.name in vars(base) for base in upstream):
                        found[item.name] = f"{module.__name__}.{node.name}"
    return found


def _module_patches() -> dict[str, str]:
    """Attributes hf_defer assigns on an imported module (`accelerate.optimizer.is_lomo_available = ...`)."""
    found: dict[str, str] = {}
    for path in _source_files():
        tree = ast.parse(path.read_text())
        imported = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in imported:
                    found[node.attr] = path.name
    return found


def test_every_private_upstream_name_hf_defer_uses_is_listed():
    unlisted = {name: sorted(files) for name, files in _private_names_used_not_defined().items() if name not in LISTED}
    unlisted.update({name: [owner] for name, owner in _private_upstream_overrides().items() if name not in LISTED})
    unlisted.update({name: [file] for name, file in _module_patches().items() if name not in LISTED})
    assert not unlisted, (
        f"hf_defer uses private upstream names that tests/training/upstream_hooks.py does not list: {unlisted}. "
        "Add an UpstreamHook for each (what it stands in for, its parameters and its upstream callers)."
    )


def test_the_scans_find_the_known_uses():
    """The scans above are not blind: they find the uses the registry was written from."""
    assert {"_train_batch_size", "_get_dataloader", "_hf_peft_config_loaded", "_fingerprint"} <= set(
        _private_names_used_not_defined())
    assert {"_get_grad_norm", "_load_from_checkpoint", "_get_collator_with_removed_columns"} <= set(
        _private_upstream_overrides())
    assert "is_lomo_available" in _module_patches()


def test_listed_callers_are_functions_of_the_named_upstream_objects():
    for hook in UPSTREAM_HOOKS:
        for caller in hook.referenced_by:
            module, _, rest = caller.partition(".")
            assert module == hook.distribution, (hook.target, caller)
            obj = importlib.import_module(module)
            for part in rest.split("."):
                obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
            assert callable(getattr(obj, "__func__", obj)), caller
