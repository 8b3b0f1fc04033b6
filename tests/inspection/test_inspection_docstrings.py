"""The runnable examples in hf_defer.inspection's docstrings: each module's, its functions' included (tests/docs/
test_docstrings.py leaves these modules to this test, `ALREADY_RUN`)."""

from __future__ import annotations

import doctest

import pytest


@pytest.mark.parametrize("name", ["adapters", "model_checks"])
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    import importlib

    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(f"hf_defer.inspection.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
