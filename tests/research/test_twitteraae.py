"""Tests of research.twitteraae: tokenizer, CVB0 inference and the TwitterAAE model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from research.twitteraae import SHIPPED_DIR, TwitterAAE, cvb0_proportions, shipped_table, tokenize_tweet



# ----------------------------------------------------------------------------- tokenizer
def test_tokenize_drops_mentions_urls_and_retweet_marker():
    text = "RT @some_user: I ain't finna go!!! :) https://t.co/abc &amp; #blessed"
    assert tokenize_tweet(text) == ["i", "ain't", "finna", "go", "!!!", ":)", "&", "#blessed"]


def test_tokenize_keeps_masked_words_and_punctuation_runs():
    assert tokenize_tweet("That B*TCH... really??") == ["that", "b*tch", "...", "really", "??"]


def test_tokenize_rejects_non_string():
    with pytest.raises(TypeError, match="text must be a str"):
        tokenize_tweet(["a", "list"])


# ----------------------------------------------------------------------------- CVB0
def test_cvb0_single_token_is_its_normalised_likelihood():
    theta, q = cvb0_proportions(np.array([[3.0, 1.0]]), alpha=0.5, num_passes=7)
    np.testing.assert_allclose(theta, [0.75, 0.25])
    np.testing.assert_allclose(q, [[0.75, 0.25]])


def test_cvb0_two_tokens_one_pass_by_hand():
    # lik = [[.75, .25], [.5, .5]]. Token 1: others' mass [.5, .5] + 1 -> q1 ∝ [.75*1.5, .25*1.5] = [.75, .25].
    # Token 2: others' mass [.75, .25] + 1 -> q2 ∝ [.5*1.75, .5*1.25] = [7/12, 5/12]. Sum = [4/3, 2/3] -> [2/3, 1/3].
    theta, q = cvb0_proportions(np.array([[3.0, 1.0], [2.0, 2.0]]), alpha=1.0, num_passes=2)
    np.testing.assert_allclose(theta, [2 / 3, 1 / 3])
    np.testing.assert_allclose(q, [[0.75, 0.25], [7 / 12, 5 / 12]])


def test_cvb0_no_update_pass_averages_token_likelihoods():
    theta, _ = cvb0_proportions(np.array([[1.0, 3.0], [1.0, 1.0], [4.0, 0.0001]]), num_passes=1)
    expected = (np.array([0.25, 0.75]) + np.array([0.5, 0.5]) + np.array([4.0, 0.0001]) / 4.0001) / 3
    np.testing.assert_allclose(theta, expected)


def test_cvb0_converges_to_a_fixed_point():
    rng = np.random.default_rng(0)
    lik = rng.uniform(0.01, 1.0, size=(9, 4))
    theta, q = cvb0_proportions(lik, alpha=0.7, num_passes=500)
    assert theta.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(q.sum(axis=1), 1.0)
    normalised = lik / lik.sum(axis=1, keepdims=True)
    total = q.sum(axis=0)
    for i in range(len(q)):  # each token distribution satisfies its own update
        row = normalised[i] * (total - q[i] + 0.7)
        np.testing.assert_allclose(q[i], row / row.sum(), atol=1e-10)
    np.testing.assert_allclose(theta, total / len(q))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"likelihoods": np.ones((0, 4))}, "likelihoods must have shape"),
        ({"likelihoods": np.array([[1.0, -1.0]])}, "finite and positive"),
        ({"likelihoods": np.ones((2, 2)), "alpha": 0.0}, "alpha must be a positive number"),
        ({"likelihoods": np.ones((2, 2)), "num_passes": 0}, "num_passes must be a positive integer"),
    ],
)
def test_cvb0_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cvb0_proportions(**kwargs)


# ----------------------------------------------------------------------------- TwitterAAE on a hand-made model
def _write_model(folder: Path, words: list[str], counts: list[list[float]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_vocab.txt").write_text("".join(f"{1000 - i}\t{w}\n" for i, w in enumerate(words)), encoding="utf-8")
    (folder / "model_count_table.txt").write_text("".join(" ".join(map(str, row)) + "\n" for row in counts))
    return folder


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    # Topic totals: every column sums to 100, so p(word | topic) = (count + 1) / 100.
    words = ["finna", "lol", "store", "the"]
    counts = [[79, 1, 1, 1], [9, 9, 9, 9], [1, 40, 40, 60], [11, 50, 50, 30]]
    return _write_model(tmp_path / "twitteraae", words, counts)


def test_tiny_model_single_word_posterior(tiny_model_dir):
    model = TwitterAAE(tiny_model_dir)
    # "finna" alone: likelihood (80, 2, 2, 2) / 100 -> normalised 80/86, 2/86, 2/86, 2/86.
    np.testing.assert_allclose(model.proportions("Finna"), np.array([80, 2, 2, 2]) / 86)
    assert model.is_aae(["finna", "the store"]).tolist() == [True, False]


def test_tiny_model_vocabulary_thresholds(tiny_model_dir):
    model = TwitterAAE(tiny_model_dir, min_tokens=2, min_in_vocab=0.5)
    assert model.proportions("finna") is None  # one known token < min_tokens
    assert model.proportions("finna lol qq rr ss") is None  # 2 of 5 known < 50 %
    assert model.proportions("finna lol qq") is not None
    out = model.predict(["finna", "finna lol"])
    assert np.isnan(out[0]).all() and out[1].sum() == pytest.approx(1.0)
    assert model.is_aae(["finna"]).tolist() == [False]  # no estimate counts as not AAE


def test_tiny_model_rejects_bad_files(tmp_path):
    with pytest.raises(ValueError, match="model_count_table.txt is missing|is missing"):
        TwitterAAE(tmp_path)
    bad = _write_model(tmp_path / "bad", ["a", "b"], [[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="one row of 4 counts per vocabulary word"):
        TwitterAAE(bad)
    with pytest.raises(TypeError, match="model_dir"):
        TwitterAAE(3)


def test_predict_rejects_single_string(tiny_model_dir):
    with pytest.raises(TypeError, match="sequence of tweets"):
        TwitterAAE(tiny_model_dir).predict("finna")


# ----------------------------------------------------------------------------- the real TwitterAAE tables
def test_real_model_on_hand_made_tweets():
    model = TwitterAAE()  # the tables in research/data/twitteraae/
    aae = ["bruh dat shit ain't it smh", "he finna go to the sto lol", "yo ion even kno wassup wit chu"]
    standard = ["I am going to the store tomorrow.", "Wonderful weather in the park with my family today",
                "The meeting has been moved to Thursday afternoon."]
    flags = model.is_aae(aae + standard)
    assert flags.tolist() == [True] * 3 + [False] * 3
    proportions = model.predict(aae + standard)
    np.testing.assert_allclose(proportions.sum(axis=1), 1.0)
    assert (proportions >= 0).all()


def test_gzip_tables_and_environment_variable(tiny_model_dir, tmp_path, monkeypatch):
    import gzip

    packed = tmp_path / "packed"
    packed.mkdir()
    for name in ("model_count_table.txt", "model_vocab.txt"):
        (packed / f"{name}.gz").write_bytes(gzip.compress((tiny_model_dir / name).read_bytes()))
    np.testing.assert_allclose(TwitterAAE(packed).proportions("Finna"), np.array([80, 2, 2, 2]) / 86)
    monkeypatch.setenv("HF_DEFER_TWITTERAAE", str(packed))  # the default folder, before the shipped copy
    assert sorted(TwitterAAE().word_index) == ["finna", "lol", "store", "the"]


def test_shipped_tables_have_the_upstream_size():
    # Blodgett et al.'s model: 191,874 words x 4 topics (shared/data/README.md)
    model = TwitterAAE()
    assert model.word_likelihoods.shape == (191_874, 4)


# The upstream checksums and sizes, as published with the offline copies (shared/data/SHA256SUMS.txt), typed in here.
@pytest.mark.parametrize("name, sha256, size", [
    ("model_count_table.txt", "9907158995bea09301022050736bb91dda71bd577af9d3e643ae434d5c3fbf4e", 4_162_510),
    ("model_vocab.txt", "6ef8e0ed59ed13776ad015a7dc14a0dd26a24ce9f6906edf860dfe40bf679133", 2_332_533),
])
def test_research_copies_decompress_to_the_upstream_bytes(name, sha256, size):
    import gzip
    import hashlib

    raw = gzip.decompress((SHIPPED_DIR / f"{name}.gz").read_bytes())
    assert hashlib.sha256(raw).hexdigest() == sha256 and len(raw) == size
    assert shipped_table(name) == raw


def test_a_damaged_or_unknown_table_is_refused(tmp_path, monkeypatch):
    import gzip

    import research.twitteraae as aae_module

    (tmp_path / "model_vocab.txt.gz").write_bytes(gzip.compress(b"finna\n"))
    monkeypatch.setattr(aae_module, "SHIPPED_DIR", tmp_path)
    with pytest.raises(OSError, match="does not match its upstream checksum"):
        shipped_table("model_vocab.txt")
    with pytest.raises(OSError, match="missing or damaged"):
        shipped_table("model_count_table.txt")
    with pytest.raises(ValueError, match="name must be one of"):
        shipped_table("model_vocab.csv")


def test_the_tables_come_with_their_mit_license():
    text = (SHIPPED_DIR / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "Permission is hereby granted, free of charge" in text


def test_docstring_examples():
    import doctest

    import research.twitteraae as aae_module

    result = doctest.testmod(aae_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
