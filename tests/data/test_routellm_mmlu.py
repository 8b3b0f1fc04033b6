"""hf_defer.data.load_routellm_mmlu: the shipped RouteLLM MMLU results, their checksums, and a user's own copy."""

from __future__ import annotations

import doctest
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

import hf_defer.data.bundled_data as bundled
import hf_defer.data.routellm_mmlu as module
from hf_defer.data import ROUTELLM_MMLU_STRONG, ROUTELLM_MMLU_WEAK, load_routellm_mmlu
from script_loader import load_script

NAME = "routellm-mmlu/routellm_mmlu.tar"


@pytest.fixture(scope="module")
def full():
    return load_routellm_mmlu(keep_contaminated=True)


def test_shipped_results_match_the_upstream_counts(full):
    # Counted on the upstream files when they were copied (shared/data/routellm-mmlu/PROVENANCE.md): 14,042 rows,
    # GPT-4 right 0.8058, Mixtral 0.6808; both right 8,818, only Mixtral 742, only GPT-4 2,497, neither 1,985.
    strong, weak = np.array(full[ROUTELLM_MMLU_STRONG]), np.array(full[ROUTELLM_MMLU_WEAK])
    assert full.num_rows == 14042 and len(set(full["subject"])) == 57
    assert [(strong & weak).sum(), (~strong & weak).sum(), (strong & ~weak).sum(), (~strong & ~weak).sum()] == [
        8818, 742, 2497, 1985]
    assert round(strong.mean(), 4) == 0.8058 and round(weak.mean(), 4) == 0.6808
    subjects = np.array(full["subject"])
    assert {s: int((subjects == s).sum()) for s in ("abstract_algebra", "professional_law", "moral_scenarios")} == {
        "abstract_algebra": 100, "professional_law": 1534, "moral_scenarios": 895}
    assert full.features[ROUTELLM_MMLU_STRONG].dtype == "bool" and full.features["prompt"].dtype == "string"


def test_contaminated_prompts_are_dropped_by_default_as_routellm_does(full):
    members = bundled.bundled_tar_members(NAME, module.ROUTELLM_MMLU_MEMBER_SHA256)
    prompts = {json.loads(line)["eval_prompt"] for line in members["contaminated_prompts.jsonl"].decode().splitlines()}
    assert len(prompts) == 5
    assert sum(full["contaminated"]) == 5
    assert {p for p, c in zip(full["prompt"], full["contaminated"]) if c} == prompts
    clean = load_routellm_mmlu()
    assert clean.num_rows == 14037 and "contaminated" not in clean.column_names
    assert not prompts & set(clean["prompt"])


def test_every_member_is_checked_against_its_upstream_checksum(tmp_path, monkeypatch):
    """A tar whose own checksum is re-recorded but whose member differs from upstream is still refused."""
    members = bundled.bundled_tar_members(NAME, module.ROUTELLM_MMLU_MEMBER_SHA256)
    members["responses/mmlu_anatomy.csv"] = members["responses/mmlu_anatomy.csv"].replace(b"True", b"False", 1)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    folder = tmp_path / "routellm-mmlu"
    folder.mkdir()
    (folder / "routellm_mmlu.tar.gz").write_bytes(gzip.compress(buffer.getvalue()))
    entry = bundled.BUNDLED_FILES[NAME]
    monkeypatch.setattr(bundled, "BUNDLED_DIR", tmp_path)
    monkeypatch.setitem(bundled.BUNDLED_FILES, NAME, bundled.BundledFile(
        entry.path, hashlib.sha256(buffer.getvalue()).hexdigest(), entry.source))
    with pytest.raises(OSError, match="mmlu_anatomy.csv.*upstream checksum"):
        load_routellm_mmlu()
    monkeypatch.setitem(bundled.BUNDLED_FILES, NAME, entry)  # the recorded tar checksum refuses it first
    with pytest.raises(OSError, match="does not match its upstream checksum"):
        load_routellm_mmlu()


def test_the_pack_script_rebuilds_the_shipped_archive_byte_for_byte(tmp_path):
    for name, data in bundled.bundled_tar_members(NAME, module.ROUTELLM_MMLU_MEMBER_SHA256).items():
        (tmp_path / "mmlu" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "mmlu" / name).write_bytes(data)
    pack = load_script("pack_routellm_mmlu.py")
    pack.main([str(tmp_path / "mmlu"), "--output", str(tmp_path / "out.tar.gz")])
    assert (tmp_path / "out.tar.gz").read_bytes() == bundled.bundled_path(NAME).read_bytes()
    (tmp_path / "mmlu" / "responses" / "mmlu_virology.csv").write_bytes(b"prompt\n")
    with pytest.raises(SystemExit, match="mmlu_virology.csv"):
        pack.main([str(tmp_path / "mmlu"), "--output", str(tmp_path / "other.tar.gz")])


def test_license_and_citation_ship_with_the_data():
    text = (bundled.BUNDLED_DIR / "routellm-mmlu" / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "2406.18665" in module.ROUTELLM_MMLU_CITATION and "Hendrycks" in module.ROUTELLM_MMLU_CITATION


def write_copy(folder: Path, rows: dict[str, str], contaminated: list[str] = ()) -> Path:
    (folder / "responses").mkdir(parents=True)
    for subject, text in rows.items():
        (folder / "responses" / f"mmlu_{subject}.csv").write_text(text)
    if contaminated:
        (folder / "contaminated_prompts.jsonl").write_text(
            "".join(json.dumps({"train_prompt": "x", "eval_prompt": p}) + "\n" for p in contaminated))
    return folder


HEADER = "prompt,mistralai/Mixtral-8x7B-Instruct-v0.1,gpt-4-1106-preview\n"


def test_a_local_copy_with_zero_one_columns_loads(tmp_path):
    folder = write_copy(tmp_path / "mmlu", {"zoology": HEADER + "q1,1,0\n\"q2, with a comma\",0,1\nNA,True,True\n",
                                            "algebra": HEADER + "q3,0,0\n"}, contaminated=["q1"])
    ds = load_routellm_mmlu(folder)
    assert ds["prompt"] == ["q3", "q2, with a comma", "NA"]  # subjects sorted; "NA" stays a string; q1 dropped
    assert ds["subject"] == ["algebra", "zoology", "zoology"]
    assert ds[ROUTELLM_MMLU_WEAK] == [False, False, True] and ds[ROUTELLM_MMLU_STRONG] == [False, True, True]


def test_bad_input_gets_clear_errors(tmp_path):
    folder = write_copy(tmp_path / "bad", {"zoology": HEADER + "q1,yes,0\n"})
    with pytest.raises(ValueError, match="'mistralai/Mixtral-8x7B-Instruct-v0.1' must hold booleans.*yes"):
        load_routellm_mmlu(folder)
    folder = write_copy(tmp_path / "two", {"zoology": HEADER + "q1,1,2\n"})
    with pytest.raises(ValueError, match="'gpt-4-1106-preview' must hold booleans"):
        load_routellm_mmlu(folder)
    folder = write_copy(tmp_path / "columns", {"zoology": "prompt,gpt-4-1106-preview\nq1,1\n"})
    with pytest.raises(ValueError, match="lacks the columns"):
        load_routellm_mmlu(folder)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_routellm_mmlu(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no responses"):
        load_routellm_mmlu(tmp_path / "empty")
    with pytest.raises(ValueError, match="keep_contaminated"):
        load_routellm_mmlu(keep_contaminated="yes")


def test_docstring_examples():
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
