"""Fixtures of the documentation tests: the site built once per session with `mkdocs build --strict` (what `make docs`
runs), into a temporary folder. The test marked `browser` (headless Chromium) runs only when the marker expression
names it (`make test-docs`; tests/conftest.py deselects it otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The site built from this checkout with --strict: its folder, the build's output and its time in seconds."""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "NO_MKDOCS_2_WARNING": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    return SimpleNamespace(path=site, returncode=done.returncode, output=done.stdout + done.stderr,
                           seconds=time.perf_counter() - start)
