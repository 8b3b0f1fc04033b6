"""Fixtures of the review tests. The tests marked `review` (a live Label Studio server) and `browser` (headless
Chromium) run only when the marker expression asks for them (`make test-review`; tests/conftest.py deselects them
otherwise); the rest of tests/review/ is the default suite: offline, on recorded server responses."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def label_studio():
    """A live Label Studio server (its own venv, a free port of 127.0.0.1, a temporary data folder), for the session;
    the admin's API token is a random one in $LABEL_STUDIO_API_KEY of this process only.

    With $HF_DEFER_REVIEW_TEST_URL set (a local server already running, its admin's token in $LABEL_STUDIO_API_KEY),
    the tests use that server instead; they create projects and users on it."""
    from hf_defer.review.server import LabelStudioServer

    if os.environ.get("HF_DEFER_REVIEW_TEST_URL"):
        yield SimpleNamespace(url=os.environ["HF_DEFER_REVIEW_TEST_URL"].rstrip("/"))
        return

    previous = os.environ.get("LABEL_STUDIO_API_KEY")
    os.environ["LABEL_STUDIO_API_KEY"] = secrets.token_hex(20)
    server = LabelStudioServer(venv=ROOT / ".venv-label-studio")
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if previous is None:
            os.environ.pop("LABEL_STUDIO_API_KEY", None)
        else:
            os.environ["LABEL_STUDIO_API_KEY"] = previous


@pytest.fixture
def project_title(request):
    """A project title of its own for each test (the session's server is shared)."""
    return f"{request.node.name[5:38]}-{secrets.token_hex(3)}"  # Label Studio titles have at most 50 characters
