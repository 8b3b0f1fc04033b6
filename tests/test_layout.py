"""The package layout: the folders are the layers, no module imports a higher layer or takes part in a circle, and no
folder imports one that imports it back (directly or through others).

The graph is read from the source (every `import` / `from ... import` of hf_defer, at module level or inside a
function), so a lazy import counts as much as a top-level one."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import hf_defer

PACKAGE = Path(hf_defer.__file__).resolve().parent
# Lower number = lower layer. A module may import its own layer or lower ones; modeling imports nothing else but the
# ground floor, hf_defer/_lazy.py (the lazy packages: standard library only).
GROUND = -1
LAYERS = {"_lazy": GROUND, "modeling": 0, "inspection": 1, "evaluation": 1, "data": 1, "experts": 1, "cascade": 2, "training": 2,
          "hub": 2, "monitoring": 2, "onnx": 2, "commands": 3, "review": 3, "serving": 3}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_from_target(node: ast.ImportFrom, package: str) -> str | None:
    """The hf_defer module a `from ... import` in `package` reads from (relative levels resolved), or None for another
    library's."""
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module if node.module and node.module.startswith("hf_defer") else None


def imported_modules(path: Path) -> set[str]:
    """The hf_defer modules `path` imports, resolved to dotted names (a package for `from pkg import name`, unless
    `name` is itself a module of it)."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("hf_defer")}
        elif isinstance(node, ast.ImportFrom) and (target := import_from_target(node, package)):
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                as_path = PACKAGE.parent / candidate.replace(".", "/")
                found.add(candidate if as_path.with_suffix(".py").is_file() or as_path.is_dir() else target)
    return found - {own}


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py") if "metric_scripts" not in path.parts}


def layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_the_subpackages_are_the_layers_and_each_says_what_it_may_import():
    folders = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    assert folders <= set(LAYERS), folders - set(LAYERS)
    assert {"modeling", "evaluation", "data", "experts", "cascade", "training", "hub", "commands"} <= folders
    for folder in folders:
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""
        assert "import" in doc.lower(), f"hf_defer/{folder}/__init__.py must say what it may import"
    assert sorted(path.name for path in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py", "_lazy.py"]


def test_no_module_imports_a_higher_layer_and_modeling_imports_only_itself():
    wrong = []
    for name, path in modules().items():
        own = layer(name)
        if own is None:  # hf_defer/__init__.py and __main__.py sit above everything
            continue
        for target in imported_modules(path):
            if target == "hf_defer" and own == max(LAYERS.values()):  # entry points import the package to register it
                continue
            other = layer(target)
            if other is None or other > own or (own == 0 and other not in (0, GROUND)):
                wrong.append(f"{name} -> {target}")
    assert not wrong, wrong


def test_the_ground_floor_imports_only_the_standard_library():
    imports = [node for node in ast.walk(ast.parse((PACKAGE / "_lazy.py").read_text()))
               if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = {alias.name for node in imports if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in imports if isinstance(node, ast.ImportFrom)}
    assert {name.split(".")[0] for name in names} <= sys.stdlib_module_names | {"__future__"}, names


def test_modeling_reaches_above_itself_only_through_library_function_and_only_in_library_mode():
    """The three calls up, by name at call time (a saved folder's copy has no library above it): the pipeline's model
    experts, `push_to_hub`'s deferral card and the loaders' name resolution. Each target exists and is public."""
    import importlib

    calls = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "library_function":
                assert layer(name) == 0, name
                calls.add(tuple(arg.value for arg in node.args))
    assert calls == {("experts.model_experts", "answer_with_model_experts"), ("hub.sharing", "push_to_hub"),
                     ("hub.model_source", "resolve_model_name")}
    for module, function in calls:
        assert callable(getattr(importlib.import_module(f"hf_defer.{module}"), function))


def test_no_import_circles():
    graph = {name: {t for t in imported_modules(path) if t in modules()} for name, path in modules().items()}
    graph = {name: targets - {"hf_defer"} for name, targets in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            # a module importing its own package's __init__ (or the reverse, for re-exports) is not a circle of modules
            if node.startswith(target + ".") or target.startswith(node + "."):
                continue
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target):] + [target] if target in stack else [node, target])
            elif target not in state:
                visit(target, stack + [target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def folder_imports() -> dict[tuple[str, str], list[str]]:
    """Per pair of subpackages (importer, imported), the module imports behind it."""
    found: dict[tuple[str, str], list[str]] = {}
    for name, path in modules().items():
        source = name.split(".")
        for target in imported_modules(path):
            parts = target.split(".")
            if len(source) > 1 and len(parts) > 1 and parts[1] != source[1]:
                found.setdefault((source[1], parts[1]), []).append(f"{name} -> {target}")
    return found


def folder_loops(edges: dict[tuple[str, str], list[str]]) -> dict[str, list[str]]:
    """The imports between folders that are part of a loop: from folder a to folder b where b reaches a again."""
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(graph.get(node, ()))
        return False

    return {f"{a} -> {b}": edges[a, b] for a, b in sorted(edges) if reaches(b, a)}


def test_no_import_loops_between_folders():
    loops = folder_loops(folder_imports())
    assert not loops, loops


def test_the_folder_loop_check_finds_every_import_of_a_loop_and_only_those():
    edges = {("a", "b"): ["a.x -> b.y"], ("b", "c"): ["b.y -> c.z"], ("c", "a"): ["c.z -> a.x"],
             ("c", "d"): ["c.z -> d.w"], ("a", "d"): ["a.x -> d.w"]}  # a -> b -> c -> a is a loop; d is below all
    assert sorted(folder_loops(edges)) == ["a -> b", "b -> c", "c -> a"]
    del edges["c", "a"]
    assert folder_loops(edges) == {}
    assert folder_loops({("a", "b"): ["a.x -> b.y"], ("b", "a"): ["b.y -> a.x"]}) == {"a -> b": ["a.x -> b.y"],
                                                                                     "b -> a": ["b.y -> a.x"]}

def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_module(dotted: str) -> bool:
    as_path = PACKAGE.parent / dotted.replace(".", "/")
    return as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file()


def private_imports(source: str, own: str, is_package: bool = False) -> list[str]:
    """Where the module `own` (its `source`) takes another hf_defer module's private name: `from module import
    _name` (a private module too), or `module._name` on a module it imported. A public name bound to a private local
    name (`import check_array as _array`) is not one; private methods of objects are not imports."""
    package = own if is_package else own.rpartition(".")[0]
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the hf_defer module it is
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if not (target := import_from_target(node, package)):
                continue
            for alias in node.names:
                if _is_module(f"{target}.{alias.name}"):
                    bound[alias.asname or alias.name] = f"{target}.{alias.name}"
                if _private(alias.name) and target != own:
                    found.append(f"{own}:{node.lineno} from {target} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("hf_defer"):
                    bound[alias.asname or "hf_defer"] = alias.name if alias.asname else "hf_defer"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, base = [], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                target = ".".join([bound[base.id], *reversed(chain)])
                if _is_module(target) and target != own:
                    found.append(f"{own}:{node.lineno} {target}.{node.attr}")
    return found


def test_private_imports_finds_each_form_and_only_those():
    source = ("from .costs import _a, check_array as _b, mean_cost\n"  # _a counts; a public name bound privately not
              "from ..modeling import validators as v, _nothing\n"  # _nothing counts (a private name, whatever it is)
              "import hf_defer.evaluation.metrics as m\n"
              "x = v._c + m._d + v.is_int + m.obj._method\n"  # _c and _d count; a method of an object does not
              "from . import _own_helper\n")  # importing one's own package's private name counts too
    found = private_imports(source, "hf_defer.evaluation.fake")
    assert [hit.split(" ", 1)[1] for hit in found] == [
        "from hf_defer.evaluation.costs import _a", "from hf_defer.modeling import _nothing",
        "from hf_defer.evaluation import _own_helper", "hf_defer.modeling.validators._c",
        "hf_defer.evaluation.metrics._d"]


def test_at_most_three_imports_of_another_modules_private_names():
    """A name that another module needs is public (no underscore, documented); modules split only for size were merged
    back. Counted per imported name, from the source."""
    found = [hit for name, path in sorted(modules().items())
             for hit in private_imports(path.read_text(), name, path.name == "__init__.py")]
    assert len(found) <= 3, "imports of another module's private names:\n" + "\n".join(found)


def test_each_subpackage_lists_its_public_names_and_the_top_level_only_reexports_them():
    """`hf_defer.__all__` keeps what users call; every name there is also in the `__all__` of the subpackage where
    it lives (the same object), and every subpackage `__init__` has an `__all__` whose names all resolve."""
    import importlib

    listed = {}
    for folder in sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()):
        name = f"hf_defer.{folder}"
        package = importlib.import_module(name)
        assert isinstance(getattr(package, "__all__", None), list), f"{name} has no __all__"
        assert len(set(package.__all__)) == len(package.__all__), f"{name}.__all__ repeats a name"
        for public in package.__all__:
            assert not _private(public) and hasattr(package, public), f"{name}.__all__: {public}"
            listed.setdefault(public, []).append(getattr(package, public))
    for public in hf_defer.__all__:
        assert any(obj is getattr(hf_defer, public) for obj in listed.get(public, [])), \
            f"hf_defer.{public} is in no subpackage's __all__"


ROOT = Path(__file__).resolve().parents[1]


def test_the_package_holds_no_experiment_code():
    """The experiments live in research/ beside scripts/ (not installed); the package neither holds nor imports them."""
    import fnmatch
    import tomllib

    assert not (PACKAGE / "experiments").exists() and (ROOT / "research" / "__init__.py").is_file()
    assert sorted(path.name for path in (PACKAGE / "templates").iterdir()) == ["deferral_model_card_template.md"]
    assert not list(PACKAGE.rglob("*twitteraae*")) and not list(PACKAGE.rglob("report_*.md"))
    importing_research = [name for name, path in modules().items() for node in ast.walk(ast.parse(path.read_text()))
                          if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
                          and any((alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
                                  == "research" for alias in node.names)]
    assert not importing_research, importing_research
    # What the wheel takes: the packages found (only hf_defer's) and their data (nothing of research/).
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = setuptools["packages"]["find"]["include"]
    assert not [pattern for pattern in include if fnmatch.fnmatch("research", pattern)
                or fnmatch.fnmatch("research.templates", pattern)], include
    assert all(package == "hf_defer" or package.startswith("hf_defer.") for package in setuptools["package-data"])
    # One file name, one place: no module of research/ repeats a file name of the package.
    package_names = {path.name for path in PACKAGE.rglob("*.py")} - {"__init__.py"}
    assert not package_names & {path.name for path in (ROOT / "research").rglob("*.py")}
