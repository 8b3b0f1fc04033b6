"""`hf_defer.commands.progress`: progress bars where a person watches (a terminal), none in a log file, with the
libraries' own switches; a user's own setting wins (issue 43.4)."""

from __future__ import annotations

import io
import os

import datasets
import huggingface_hub.utils
import pytest
import transformers

from hf_defer.commands.progress import progress_bars_disabled, quiet_progress_bars_unless_terminal


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def bars_on(monkeypatch):
    """Every library's bars on, the two variables unset; both restored afterwards."""
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)

    def enable():
        huggingface_hub.utils.enable_progress_bars()
        transformers.utils.logging.enable_progress_bar()
        datasets.enable_progress_bars()

    was_off = progress_bars_disabled()
    enable()
    yield
    enable()
    if was_off:
        huggingface_hub.utils.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
        datasets.disable_progress_bars()


def test_a_terminal_keeps_the_bars(bars_on):
    assert quiet_progress_bars_unless_terminal(Terminal()) is False
    assert not progress_bars_disabled() and transformers.utils.logging.is_progress_bar_enabled()
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ


def test_a_log_file_switches_every_librarys_bars_off(bars_on):
    assert quiet_progress_bars_unless_terminal(io.StringIO()) is True
    assert progress_bars_disabled()
    assert not transformers.utils.logging.is_progress_bar_enabled() and not datasets.is_progress_bar_enabled()
    # libraries imported later read the variables
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" == os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"]


def test_the_users_own_setting_wins(bars_on, monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    assert quiet_progress_bars_unless_terminal(io.StringIO()) is False
    assert not progress_bars_disabled() and datasets.is_progress_bar_enabled()
