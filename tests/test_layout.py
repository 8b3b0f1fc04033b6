"""The package layout: the folders are the layers, and no module imports a higher layer or takes part in a circle.

The graph is read from the source (every `import` / `from ... import` of hf_defer, at module level or inside a
function), so a lazy import counts as much as a top-level one."""

from __future__ import annotations

import ast
from pathlib import Path

import hf_defer

PACKAGE = Path(hf_defer.__file__).resolve().parent
# Lower number = lower layer. A module may import its own layer or lower ones; modeling imports nothing else.
LAYERS = {"modeling": 0, "evaluation": 1, "data": 1, "experts": 1, "training": 2, "hub": 2,
          "commands": 3, "review": 3, "serving": 3}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """The hf_defer modules `path` imports, resolved to dotted names (a package for `from pkg import name`, unless
    `name` is itself a module of it)."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("hf_defer")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("hf_defer"):
                target = node.module
            else:
                continue
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
    assert {"modeling", "evaluation", "data", "experts", "training", "hub", "commands"} <= folders
    for folder in folders:
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""
        assert "import" in doc.lower(), f"hf_defer/{folder}/__init__.py must say what it may import"
    assert sorted(path.name for path in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]


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
            if other is None or other > own or (own == 0 and other != 0):
                wrong.append(f"{name} -> {target}")
    assert not wrong, wrong


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
