"""Fixtures of the serving tests: the tiny text router, saved once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_router import save_tiny_router


@pytest.fixture(scope="session")
def router_folder(tmp_path_factory) -> Path:
    return save_tiny_router(tmp_path_factory.mktemp("router"))
