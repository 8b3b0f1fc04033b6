"""A cascade folder saved before the cascade got its own subpackage keeps loading as the same cascade:
`tests/fixtures/saved_cascade/` was written by `tests/fixtures/make_saved_cascade.py` at the commit recorded in
`saved_cascade.json`, with the decisions and answers that code gave on the recorded inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from transformers import pipeline

import hf_defer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RECORDED = json.loads((FIXTURES / "saved_cascade.json").read_text())
LLM = np.asarray(RECORDED["llm_probs"])
PERSON = RECORDED["person_answers"]
EXPERTS = {"llm": lambda rows: LLM[list(rows)], "person": lambda rows: [PERSON[i] for i in rows]}
IDS = list(range(len(RECORDED["features"])))  # the experts read the row's index


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    copy = tmp_path / "cascade"
    shutil.copytree(FIXTURES / "saved_cascade", copy)
    return copy


def assert_same_outputs(got: list[dict], want: list[dict]) -> None:
    assert [(o["label"], o["answered_by"], o["experts_called"]) for o in got] == \
        [(o["label"], o["answered_by"], o["experts_called"]) for o in want]
    assert [o["paid"] for o in got] == pytest.approx([o["paid"] for o in want])


def test_the_saved_cascade_names_no_module_of_hf_defer(folder):
    # only the code files copied next to the weights are named, so moving the library's modules cannot break it
    for path in folder.rglob("*.json"):
        assert "hf_defer" not in path.read_text(), path
    assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModel"] == \
        "modeling_deferral.EncoderForDeferral"


def test_the_recorded_inputs_take_every_path_of_the_cascade():
    # the fixture is worth keeping only if its inputs reach the classifier, the llm kept, the llm overruled and the
    # person asked directly
    paths = {tuple(o["experts_called"]) for o in RECORDED["outputs"]}
    assert paths == {(), ("llm",), ("llm", "person"), ("person",)}


def test_a_cascade_saved_by_the_old_layout_decides_as_it_did(folder):
    cascade = hf_defer.DeferralCascade.from_pretrained(folder)
    assert cascade.expert_names == ["llm", "person"] and cascade.labels == ["hate", "offensive", "neither"]
    decision = cascade.decide(RECORDED["features"], lambda rows: LLM[rows], **RECORDED["costs"])
    for key in ("stage1", "prediction", "escalate", "stage2", "stage2_prediction"):
        np.testing.assert_array_equal(decision[key], RECORDED["decide"][key], err_msg=key)
    np.testing.assert_allclose(decision["stage2_margin"], RECORDED["decide"]["stage2_margin"], atol=1e-5)
    assert_same_outputs(cascade(RECORDED["features"], EXPERTS, inputs=IDS, **RECORDED["costs"]), RECORDED["outputs"])


def test_the_cascade_pipeline_runs_a_cascade_saved_by_the_old_layout(folder):
    run = pipeline("deferral-cascade", model=str(folder), device="cpu", experts=EXPERTS)
    assert_same_outputs(run(RECORDED["features"], inputs=IDS, **RECORDED["costs"]), RECORDED["outputs"])


def test_a_missing_stage_is_named_by_folder_and_stage_not_as_a_config_problem(folder, tmp_path):
    no_stage2 = tmp_path / "no-stage2"
    shutil.copytree(folder, no_stage2)
    shutil.rmtree(no_stage2 / "stage2")
    for load in (lambda: hf_defer.DeferralCascade.from_pretrained(no_stage2),
                 lambda: pipeline("deferral-cascade", model=str(no_stage2), device="cpu", experts=EXPERTS)):
        with pytest.raises(FileNotFoundError, match=rf"cascade folder '{no_stage2}' is missing stage 2: no "
                                                    r"config.json in stage2/"):
            load()
    (folder / "config.json").unlink()  # stage 1 lives at the root
    with pytest.raises(FileNotFoundError, match=rf"cascade folder '{folder}' is missing stage 1: no config.json at "
                                                r"its root\."):
        hf_defer.DeferralCascade.from_pretrained(folder)
    config = json.loads((folder / "cascade_config.json").read_text())
    del config["stages"]  # a folder of the layout before "stages": stage 1 in stage1/ when the root has none
    (folder / "cascade_config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match=r"is missing stage 1: no config.json at its root \(or in stage1/"):
        hf_defer.DeferralCascade.from_pretrained(folder)
