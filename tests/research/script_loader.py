"""`load_script`: a file of `scripts/` imported as a module (its `main` and helpers callable from a test), for the
tests of every folder (`tests/conftest.py` puts this folder on the path)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(filename: str) -> ModuleType:
    """`scripts/<filename>` imported under its stem, without running its `__main__` block."""
    spec = importlib.util.spec_from_file_location(Path(filename).stem, SCRIPTS / filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
