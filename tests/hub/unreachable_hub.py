"""Fixtures for looking a model up where the Hub cannot answer (imported by the tests of `check_model_source` and of
the commands that call it): the Hub at a closed local port, offline mode, and a working folder with a model folder
`ann-model` and an `input.csv`."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub.constants
import pytest

CLOSED_PORT = "http://127.0.0.1:9"  # the discard port: nothing listens there, so connecting fails at once


@pytest.fixture
def online_but_unreachable(monkeypatch):
    """The Hub at a closed local port, offline mode off: a lookup fails with a connection error at once."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", CLOSED_PORT)


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    (tmp_path / "ann-model").mkdir()
    (tmp_path / "input.csv").write_text("text\ngood movie\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path
