"""Tests for hf_defer.data: the HateSpeech loader (local CSV, Hub, defaults); the collator is in test_collator.py."""

from __future__ import annotations

import csv
import doctest
import math
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest

import hf_defer.data.hatespeech as data_module
from hf_defer.data import load_hatespeech

LABEL_NAMES = ["hate_speech", "offensive_language", "neither"]
COUNT_COLUMNS = ["hate_speech", "offensive_language", "neither"]


def synthetic_rows(n: int = 50) -> list[dict]:
    """Rows in the Davidson layout; tweets are unique and include CSV-hostile text."""
    rng = np.random.default_rng(123)
    rows = []
    for i in range(n):
        count = int(rng.integers(3, 7))
        counts = rng.multinomial(count, [0.2, 0.5, 0.3])
        specials = {0: "NA", 1: "null", 2: 'she said "hi", then\nleft', 3: ""}
        rows.append(
            {
                "count": count,
                "hate_speech": int(counts[0]),
                "offensive_language": int(counts[1]),
                "neither": int(counts[2]),
                "class": int(np.argmax(counts)),
                "tweet": specials.get(i, f"tweet number {i}"),
            }
        )
    return rows


def write_davidson_csv(path: Path, rows: list[dict]) -> Path:
    """Write the CSV the way the upstream file looks: an unnamed index column first."""
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(["", "count", "hate_speech", "offensive_language", "neither", "class", "tweet"])
        for index, row in enumerate(rows):
            writer.writerow([index, row["count"], row["hate_speech"], row["offensive_language"], row["neither"],
                             row["class"], row["tweet"]])
    return path


@pytest.fixture
def rows() -> list[dict]:
    return synthetic_rows()


@pytest.fixture
def csv_path(tmp_path: Path, rows: list[dict]) -> Path:
    return write_davidson_csv(tmp_path / "labeled_data.csv", rows)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("HF_DEFER_HATESPEECH", raising=False)


def all_rows(dsd: datasets.DatasetDict) -> pd.DataFrame:
    return pd.concat([dsd[split].to_pandas().assign(split=split) for split in dsd], ignore_index=True)


# ------------------------------------------------------------------------------------------------ load_hatespeech


def test_load_hatespeech_from_csv(csv_path: Path, rows: list[dict]):
    dsd = load_hatespeech(csv_path, seed=0)
    assert list(dsd) == ["train", "validation", "test"]
    # 50 rows: round(0.1 * 50) = 5 validation, round(0.2 * 50) = 10 test, 35 train
    assert [dsd[s].num_rows for s in dsd] == [35, 5, 10]
    for split in dsd.values():
        assert set(split.column_names) == {"text", "labels", "count", *COUNT_COLUMNS, "expert_labels"}
        assert split.features["labels"] == datasets.ClassLabel(names=LABEL_NAMES)
        assert split.features["expert_labels"] == datasets.Value("int64")

    frame = all_rows(dsd)
    source = pd.DataFrame(rows)
    assert sorted(frame["text"]) == sorted(source["tweet"])  # a partition: nothing lost, nothing duplicated
    merged = frame.merge(source, left_on="text", right_on="tweet", suffixes=("", "_src"))
    assert len(merged) == len(rows)
    np.testing.assert_array_equal(merged["labels"], merged["class"])
    for name in ["count", *COUNT_COLUMNS]:
        np.testing.assert_array_equal(merged[name], merged[f"{name}_src"])
    # CSV-hostile tweets survive as strings
    assert {"NA", "null", 'she said "hi", then\nleft', ""} <= set(frame["text"])
    # each expert answer is a class that some annotator of that tweet chose
    counts = merged[COUNT_COLUMNS].to_numpy()
    assert np.all(counts[np.arange(len(merged)), merged["expert_labels"].to_numpy()] > 0)


def test_load_hatespeech_seeding(csv_path: Path):
    a, b = load_hatespeech(csv_path, seed=3), load_hatespeech(csv_path, seed=3)
    for split in a:
        assert a[split]["text"][:] == b[split]["text"][:]
        assert a[split]["expert_labels"][:] == b[split]["expert_labels"][:]
    c = load_hatespeech(csv_path, seed=4)
    assert sorted(a["test"]["text"][:]) != sorted(c["test"]["text"][:])
    # expert labels are drawn per example before the split: fixing expert_seed keeps them across split seeds
    fixed_3 = all_rows(load_hatespeech(csv_path, seed=3, expert_seed=9)).set_index("text")["expert_labels"]
    fixed_4 = all_rows(load_hatespeech(csv_path, seed=4, expert_seed=9)).set_index("text")["expert_labels"]
    pd.testing.assert_series_equal(fixed_3.sort_index(), fixed_4.sort_index())


def test_load_hatespeech_custom_split_and_directory(csv_path: Path):
    dsd = load_hatespeech(csv_path.parent, split=(0.5, 0.3, 0.2))
    assert [dsd[s].num_rows for s in dsd] == [25, 15, 10]
    nested = csv_path.parent / "root" / "hatespeech"
    nested.mkdir(parents=True)
    write_davidson_csv(nested / "labeled_data.csv", synthetic_rows(20))
    assert sum(load_hatespeech(str(csv_path.parent / "root")).num_rows.values()) == 20


def test_default_source_resolution(monkeypatch: pytest.MonkeyPatch, csv_path: Path):
    monkeypatch.setenv("HF_DEFER_HATESPEECH", str(csv_path))
    assert data_module.default_hatespeech_source() == str(csv_path)
    assert sum(load_hatespeech().num_rows.values()) == 50
    monkeypatch.delenv("HF_DEFER_HATESPEECH")
    assert data_module.default_hatespeech_source() is None  # the copy shipped in the package, never the Hub


def test_default_never_touches_the_hub(monkeypatch: pytest.MonkeyPatch):
    def no_hub(*args, **kwargs):
        raise AssertionError("load_hatespeech() must not go to the Hub unless a Hub id is passed")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    monkeypatch.chdir(Path(__file__).resolve().parent)  # no data folder around: only the package's own copy
    assert sum(load_hatespeech().num_rows.values()) == 24_783


def test_shipped_copy_is_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import gzip

    import hf_defer.data.bundled_data as bundled

    original = bundled.bundled_path("hatespeech/labeled_data.csv").read_bytes()
    folder = tmp_path / "hatespeech"
    folder.mkdir()
    monkeypatch.setattr(bundled, "BUNDLED_DIR", tmp_path)
    (folder / "labeled_data.csv.gz").write_bytes(gzip.compress(gzip.decompress(original)[:-10]))  # one row cut
    with pytest.raises(OSError, match="does not match its upstream checksum"):
        load_hatespeech()
    (folder / "labeled_data.csv.gz").write_bytes(original[: len(original) // 2])  # truncated download
    with pytest.raises(OSError, match="damaged"):
        load_hatespeech()
    (folder / "labeled_data.csv.gz").unlink()
    with pytest.raises(FileNotFoundError, match="without its package data"):
        load_hatespeech()


def test_gzip_csv_path(tmp_path: Path, rows: list[dict]):
    import gzip

    plain = write_davidson_csv(tmp_path / "labeled_data.csv", rows)
    packed = tmp_path / "copy" / "labeled_data.csv.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    expected = load_hatespeech(plain, seed=3)
    for source in (packed, packed.parent):
        loaded = load_hatespeech(source, seed=3)
        assert loaded["test"]["text"] == expected["test"]["text"]
        assert loaded["train"]["expert_labels"] == expected["train"]["expert_labels"]


def hub_like_dataset(rows: list[dict]) -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {
            "count": [r["count"] for r in rows],
            "hate_speech_count": [r["hate_speech"] for r in rows],
            "offensive_language_count": [r["offensive_language"] for r in rows],
            "neither_count": [r["neither"] for r in rows],
            "class": [r["class"] for r in rows],
            "tweet": [r["tweet"] for r in rows],
        },
        features=datasets.Features(
            {
                "count": datasets.Value("int64"),
                "hate_speech_count": datasets.Value("int64"),
                "offensive_language_count": datasets.Value("int64"),
                "neither_count": datasets.Value("int64"),
                "class": datasets.ClassLabel(names=["hate speech", "offensive language", "neither"]),
                "tweet": datasets.Value("string"),
            }
        ),
    )


def test_load_hatespeech_from_hub(monkeypatch: pytest.MonkeyPatch, rows: list[dict]):
    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return hub_like_dataset(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dsd = load_hatespeech("tdavidson/hate_speech_offensive", seed=1)
    assert calls == [(("tdavidson/hate_speech_offensive",), {"split": "train"})]
    frame = all_rows(dsd)
    assert set(frame.columns) == {"text", "labels", "count", *COUNT_COLUMNS, "expert_labels", "split"}
    assert dsd["train"].features["labels"].names == LABEL_NAMES
    merged = frame.merge(pd.DataFrame(rows), left_on="text", right_on="tweet", suffixes=("", "_src"))
    assert len(merged) == len(rows)
    np.testing.assert_array_equal(merged["labels"], merged["class"])
    np.testing.assert_array_equal(merged["hate_speech"], merged["hate_speech_src"])

    # same data and seeds from the CSV or from the Hub give the same dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: hub_like_dataset(rows))
    from_hub = load_hatespeech("someone/copy", seed=1)
    assert from_hub["test"]["text"][:] == dsd["test"]["text"][:]


def test_load_hatespeech_hub_wrong_columns(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict({"tweet": ["x"]}))
    with pytest.raises(ValueError, match=r"missing \['count'"):
        load_hatespeech("someone/other")


def test_load_hatespeech_errors(tmp_path: Path, rows: list[dict], csv_path: Path):
    with pytest.raises(FileNotFoundError, match="path_or_repo"):
        load_hatespeech(tmp_path / "missing.csv")
    with pytest.raises(FileNotFoundError, match="path_or_repo"):
        load_hatespeech("./nowhere/data")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="labeled_data.csv"):
        load_hatespeech(empty)

    pd.DataFrame({"tweet": ["a"], "class": [0]}).to_csv(tmp_path / "wrong.csv")
    with pytest.raises(ValueError, match=r"expected \['count'.*missing \['count', 'hate_speech'"):
        load_hatespeech(tmp_path / "wrong.csv")

    bad_sum = [dict(r) for r in rows]
    bad_sum[7]["count"] += 1
    with pytest.raises(ValueError, match=r"add up to 'count'.*\[7\]"):
        load_hatespeech(write_davidson_csv(tmp_path / "bad_sum.csv", bad_sum))
    bad_class = [dict(r) for r in rows]
    bad_class[4]["class"] = 3
    with pytest.raises(ValueError, match=r"'class'.*\[4\]"):
        load_hatespeech(write_davidson_csv(tmp_path / "bad_class.csv", bad_class))

    for split, match in [((0.7, 0.3), "three"), ((0.7, 0.2, 0.2), "sum to 1"), ((1.0, 0.0, 0.0), r"\(0, 1\)")]:
        with pytest.raises(ValueError, match=match):
            load_hatespeech(csv_path, split=split)
    with pytest.raises(ValueError, match="empty split"):
        load_hatespeech(write_davidson_csv(tmp_path / "tiny.csv", rows[:3]))
    with pytest.raises(ValueError, match="`seed`"):
        load_hatespeech(csv_path, seed=-1)
    with pytest.raises(ValueError, match="`expert_seed`"):
        load_hatespeech(csv_path, expert_seed=1.5)
    with pytest.raises(ValueError, match="path_or_repo"):
        load_hatespeech(42)


def test_load_hatespeech_real_data():
    dsd = load_hatespeech(seed=0)  # the copy shipped in the package
    n = 24_783  # README: 24,783 rows
    assert [dsd[s].num_rows for s in dsd] == [n - round(0.1 * n) - round(0.2 * n), round(0.1 * n), round(0.2 * n)]
    labels = np.concatenate([np.asarray(dsd[s]["labels"][:]) for s in dsd])
    experts = np.concatenate([np.asarray(dsd[s]["expert_labels"][:]) for s in dsd])
    assert np.bincount(labels).tolist() == [1430, 19190, 4163]  # README class counts
    # README: expected accuracy of the random annotator against `class` is 0.905; the sd of the mean of 24,783
    # Bernoullis is at most 0.5 / sqrt(n) ~ 0.0032
    assert abs(np.mean(labels == experts) - 0.905) < 5 * 0.5 / math.sqrt(n)


def test_docstring_examples_run():
    result = doctest.testmod(data_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
