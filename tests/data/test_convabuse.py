"""Tests of hf_defer.data.convabuse: the shipped ConvAbuse splits (Cercas Curry et al., EMNLP 2021).

The expected numbers are the ones published with the offline copy (shared/data/convabuse/PROVENANCE.md), typed in
here: rows per split, annotations, annotators per item, severity counts and coverage.
"""

from __future__ import annotations

import doctest
import fnmatch
import gzip
import hashlib
import shutil
import tomllib
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import pytest

import hf_defer.data.bundled_data as bundled
import hf_defer.data.convabuse as convabuse
from hf_defer.data import (
    CONVABUSE_ANNOTATORS,
    CONVABUSE_BINARY_NAMES,
    CONVABUSE_CITATION,
    CONVABUSE_SEVERITY_NAMES,
    load_convabuse,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
ROWS = {"train": 2501, "validation": 831, "test": 853}
UPSTREAM = {  # upstream split file: (bytes, SHA-256)
    "train": (878_309, "23abab3eff791d0e8cac681cec15a5ef299ed052699e4fca762d1d4640c36936"),
    "valid": (293_536, "a28bc3083fe3ea305b8c417539a20fda7e68057dc06365507b85c46b60e65443"),
    "test": (302_095, "8387d70332cd2245a095240534629152dd5729e8e9556e91b6b20dabdc0bb9d0"),
}


@pytest.fixture(scope="module")
def binary() -> datasets.DatasetDict:
    return load_convabuse()


@pytest.fixture(scope="module")
def first() -> datasets.DatasetDict:
    return load_convabuse(repeats="first")


def everything(splits: datasets.DatasetDict) -> datasets.Dataset:
    return datasets.concatenate_datasets([splits[name] for name in ROWS])


@pytest.mark.parametrize("upstream", sorted(UPSTREAM))
def test_shipped_splits_are_the_upstream_files(upstream):
    name = f"convabuse/ConvAbuseEMNLP{upstream}.csv"
    raw = gzip.decompress(bundled.bundled_path(name).read_bytes())
    assert (len(raw), hashlib.sha256(raw).hexdigest()) == UPSTREAM[upstream]
    assert bundled.BUNDLED_FILES[name].sha256 == UPSTREAM[upstream][1]


def test_rows_per_split_and_columns(binary):
    assert binary.num_rows == ROWS
    for split in binary.values():
        assert split.column_names[-8:] == [f"Annotator{k}" for k in range(1, 9)] == list(CONVABUSE_ANNOTATORS)
        for annotator in CONVABUSE_ANNOTATORS:
            assert split.features[annotator] == datasets.ClassLabel(names=list(CONVABUSE_BINARY_NAMES))
        assert split.features["is_abuse"].names == ["not_abusive", "abusive"]
        assert split.features["severity"].names == list(CONVABUSE_SEVERITY_NAMES)
        assert set(split["bot"]) == {"E.L.I.Z.A.", "CarbonBot"}


def test_text_and_context_of_the_first_training_item(binary):
    # first data line of ConvAbuseEMNLPtrain.csv:
    # 278.0,164070.0,Please go on.,"well, i have a eatproblem",Can you elaborate on that?,yes,E.L.I.Z.A., ...
    row = binary["train"][0]
    assert (row["example_id"], row["conv_id"], row["bot"], row["text"]) == (278, "164070", "E.L.I.Z.A.", "yes")
    assert row["context"] == "agent: Please go on.\nuser: well, i have a eatproblem\nagent: Can you elaborate on that?"
    # Annotators 2, 3 and 7 each said "not abusive" (one-hot is_abuse.1)
    assert [row[name] for name in CONVABUSE_ANNOTATORS] == [None, 0, 0, None, None, None, 0, None]
    assert (row["is_abuse"], row["severity"], row["num_annotators"]) == (0, 0, 3)


def test_every_annotation_is_read_including_repeats():
    severities = Counter()
    for upstream in UPSTREAM:
        severities.update(convabuse._long_annotations(convabuse._read_split(upstream), upstream)["severity"])
    # 1_full's 12,768 rows (one per annotation, repeats included): 1: 10,068, 0: 671, -1: 813, -2: 934, -3: 282
    assert [severities[name] for name in CONVABUSE_SEVERITY_NAMES] == [10_068, 671, 813, 934, 282]


def test_annotations_and_coverage_match_the_provenance(first):
    full = everything(first)
    present = {name: sum(value is not None for value in full[name]) for name in CONVABUSE_ANNOTATORS}
    assert sum(present.values()) == 12_411  # annotated (item, annotator) pairs in the splits
    coverage = [round(count / full.num_rows, 3) for count in present.values()]
    assert min(coverage) == 0.245 and max(coverage) == 0.415  # "each expert labelled 24.5-41.5 %"
    assert all(0.245 <= value <= 0.415 for value in coverage)
    # annotators per training item: 2 (653), 3 (1,458), 4 (232), 5 (136), 6 (21), 7 (1)
    assert np.bincount(first["train"]["num_annotators"]).tolist() == [0, 0, 653, 1458, 232, 136, 21, 1]


def test_majority_repeats_leave_conflicting_repeats_missing(binary, first):
    by_majority, by_first = everything(binary), everything(first)
    for name in CONVABUSE_ANNOTATORS:
        a, b = by_majority[name], by_first[name]
        # a cell is only ever lost (a tie among one annotator's repeats), never changed into another answer
        assert all(x is None or x == y for x, y in zip(a, b))
        assert 0.23 <= sum(value is not None for value in a) / len(a) <= 0.42


def test_targets_are_majorities_with_ties_marked(first):
    severity = load_convabuse(task="severity", repeats="first")
    for split in ROWS:
        answers = np.array([[np.nan if v is None else v for v in severity[split][name]] for name in CONVABUSE_ANNOTATORS])
        binary_answers = np.array([[np.nan if v is None else v for v in first[split][name]] for name in
                                   CONVABUSE_ANNOTATORS])
        # the binary answer is "abusive" exactly when the severity is mildly, strongly or very strongly abusive
        np.testing.assert_array_equal(binary_answers, np.where(np.isnan(answers), np.nan, answers >= 2))
        abusive = (binary_answers == 1).sum(axis=0)
        not_abusive = (binary_answers == 0).sum(axis=0)
        tied = abusive == not_abusive
        assert first[split]["is_abuse_tied"][:] == tied.tolist()
        expected = [None if t else int(a > n) for t, a, n in zip(tied, abusive, not_abusive)]
        assert first[split]["is_abuse"][:] == expected
        counts = np.stack([(answers == k).sum(axis=0) for k in range(5)])
        top = counts.max(axis=0)
        severity_tied = (counts == top).sum(axis=0) > 1
        assert severity[split]["severity_tied"][:] == severity_tied.tolist()
        assert severity[split]["severity"][:] == [None if t else int(np.argmax(c)) for t, c in
                                                   zip(severity_tied, counts.T)]
    assert 0 < sum(first["train"]["is_abuse_tied"]) < 0.05 * ROWS["train"]


def test_severity_task_columns(binary):
    severity = load_convabuse(task="severity")
    assert severity["test"].features["Annotator5"].names == list(CONVABUSE_SEVERITY_NAMES)
    # the aggregated targets do not depend on `task`
    assert severity["test"]["is_abuse"][:] == binary["test"]["is_abuse"][:]


def test_annotator_columns_feed_prepare_deferral_dataset(binary):
    from hf_defer import prepare_deferral_dataset

    train = binary["train"].filter(lambda row: not row["is_abuse_tied"])
    both = sum(a is not None and b is not None for a, b in zip(train["Annotator2"], train["Annotator3"]))
    prepared = prepare_deferral_dataset(train, "is_abuse", ["Annotator2", "Annotator3"], text_column="context",
                                        text_pair_column="text", missing_expert="drop")
    assert prepared.dataset.num_rows == both > 0  # None is read as a missing answer
    assert list(prepared.id2label.values()) == list(CONVABUSE_BINARY_NAMES)
    assert prepared.expert_names == ["Annotator2", "Annotator3"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="`task` must be one of"):
        load_convabuse(task="abuse")
    with pytest.raises(ValueError, match="`repeats` must be one of"):
        load_convabuse(repeats="error")


def test_a_corrupted_copy_is_refused(tmp_path, monkeypatch):
    copy = tmp_path / "bundled"
    shutil.copytree(bundled.BUNDLED_DIR / "convabuse", copy / "convabuse")
    target = copy / "convabuse" / "ConvAbuseEMNLPvalid.csv.gz"
    raw = bytearray(gzip.decompress(target.read_bytes()))
    raw[raw.index(b"E.L.I.Z.A.")] = ord("F")  # one edited byte, still valid gzip
    target.write_bytes(gzip.compress(bytes(raw)))
    monkeypatch.setattr(bundled, "BUNDLED_DIR", copy)
    with pytest.raises(OSError, match="does not match its upstream checksum"):
        load_convabuse()
    target.write_bytes(target.read_bytes()[:1000])  # truncated
    with pytest.raises(OSError, match="is damaged"):
        load_convabuse()


def test_license_citation_and_content_warning_ship():
    license_text = (bundled.BUNDLED_DIR / "convabuse" / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("Attribution 4.0 International")
    assert hashlib.sha256(license_text.encode("utf-8")).hexdigest() == (
        "9e5f1b3c610b9c2da5c313bf81d577a7d1acec686bdb0384edefa6df0f90cd94")  # upstream LICENSE, verbatim
    patterns = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for shipped in ("convabuse/LICENSE", *(entry.path for key, entry in bundled.BUNDLED_FILES.items()
                                          if key.startswith("convabuse/"))):
        assert any(fnmatch.fnmatch(f"bundled/{shipped}", pattern) for pattern in patterns["hf_defer.data"]), shipped
    assert "cercas-curry-etal-2021-convabuse" in CONVABUSE_CITATION and "7388--7403" in CONVABUSE_CITATION
    assert "Content warning" in load_convabuse.__doc__ and "Content warning" in convabuse.__doc__
    readme = (bundled.BUNDLED_DIR / "README.md").read_text(encoding="utf-8")
    assert "ConvAbuse user turns contain abusive" in readme and "c0a9469f48956e868276c605d499010ea3c7c0d0" in readme


def test_docstring_examples():
    result = doctest.testmod(convabuse, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
