"""`pipeline("deferral-cascade", model=folder, experts=...)`: a saved cascade loaded by transformers' `pipeline()` and
checked against hand-worked decisions, calls and payments; the folder layouts (stage 1 at the root, and the old
`stage1/` one); saving; and the errors (a folder that is no cascade, the single-model "deferral" task on a cascade)."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import pipeline

import hf_defer  # noqa: F401  (registers the tasks)
from hf_defer import EncoderForDeferral
from hf_defer.cascade import DeferralCascade, DeferralCascadePipeline, pipeline_cascade
from test_modeling_cascade import Recorder, build

PRICES = {"model": 0.5, "llm": 3.0, "person": 40.0}
TEXTS = ["a", "b", "c", "d"]
E0, E1, E2 = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]
FEATURES = np.array([E0, E1, E2, E1], dtype=np.float32)
LLM_PROBS = {"a": [0.7, 0.3], "b": [0.1, 0.9], "d": [0.6, 0.4]}
PERSON = {"b": "no", "c": "yes", "d": "no"}


def sigmoid(u: float) -> float:
    return 1.0 / (1.0 + math.exp(-u))


def stages() -> tuple[EncoderForDeferral, EncoderForDeferral]:
    """Stage 1 (A-OvA: p_y = sigmoid(u_y), a_j = sigmoid(u_{K+j}); logits [no, yes, llm, person], one column per
    one-hot feature): E0 -> u = [2, -2, -3, -3]: p_no 0.88 > a 0.05, the classifier answers "no"; E1 -> [0, 0, 3, -3]:
    a_llm 0.95 > p 0.5, the llm; E2 -> [0, 0, -3, 3]: the person. Stage 2 (route-only, a_j = sigmoid(u_j), default
    the llm) reads [x (3), p (2), max p, entropy, log-odds]: u_llm = 10 * max p - 7.5, u_person = 0 (a_person 0.5)."""
    cascade = build()  # the stages worked by hand in test_modeling_cascade.py
    return cascade.stage1, cascade.stage2


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cascade") / "my-cascade"
    DeferralCascade(*stages(), "llm", PRICES).save_pretrained(path)
    return path


def experts() -> dict[str, Recorder]:
    return {"llm": Recorder(LLM_PROBS), "person": Recorder(PERSON)}


def load(folder: Path, **kwargs) -> DeferralCascadePipeline:
    return pipeline("deferral-cascade", model=str(folder), device="cpu", **kwargs)


def test_layout_and_hand_worked_calls_and_payments(folder) -> None:
    assert sorted(p.name for p in folder.glob("*.json")) == ["cascade_config.json", "config.json"]
    assert (folder / "model.safetensors").is_file() and (folder / "stage2" / "config.json").is_file()
    assert json.loads((folder / "cascade_config.json").read_text()) == {
        "escalation_expert": "llm", "first_expert": None, "labels": ["no", "yes"], "prices": PRICES,
        "stages": [".", "stage2"]}
    team = experts()
    cascade = load(folder, experts=team)
    assert isinstance(cascade, DeferralCascadePipeline)
    outputs = cascade(FEATURES, inputs=TEXTS)
    # "b": max p 0.9 -> a_llm = sigmoid(1.5) = 0.82 > a_person 0.5, kept ("yes"); "d": max 0.6 -> sigmoid(-1.5) = 0.18
    # < 0.5, escalated to the person ("no").
    assert sigmoid(1.5) > 0.5 > sigmoid(-1.5)
    assert [o["answered_by"] for o in outputs] == ["model", "llm", "person", "person"]
    assert [o["experts_called"] for o in outputs] == [[], ["llm"], ["person"], ["llm", "person"]]
    assert [o["label"] for o in outputs] == ["no", "yes", "yes", "no"]
    assert [o["paid"] for o in outputs] == [0.5, 3.5, 40.5, 43.5]
    assert team["llm"].batches == [["b", "d"]] and team["person"].batches == [["c", "d"]]  # once, its rows only


def test_input_forms_and_default_expert_inputs(folder) -> None:
    seen = []
    llm = lambda rows: (seen.append([list(r) for r in rows]), [[0.1, 0.9]] * len(rows))[1]  # noqa: E731
    cascade = load(folder, experts={"llm": llm, "person": lambda rows: ["no"] * len(rows)})
    one = cascade(E1)  # one vector: one dict; the experts read the feature row itself
    assert one == {"label": "yes", "answered_by": "llm", "experts_called": ["llm"], "paid": 3.5}
    assert seen == [[E1]]
    assert cascade([E0, E1]) == cascade(torch.tensor([E0, E1])) == cascade(np.array([E0, E1]))
    assert [o["paid"] for o in cascade([E0, E1])] == [0.5, 3.5]
    assert cascade(E2, inputs="c")["label"] == "no"  # one vector, one expert input


def test_costs_and_thresholds_at_call_and_build_time(folder) -> None:
    team = experts()
    cascade = load(folder, experts=team)
    # stage 2: a person cost of 0.5 makes 0.5 - 0.5 = 0 < a_llm 0.18 for "d": the llm's answer (class 0) stands.
    outputs = cascade(FEATURES, inputs=TEXTS, stage2_costs=[0.0, 0.5])
    assert [o["paid"] for o in outputs] == [0.5, 3.5, 40.5, 3.5] and outputs[3]["label"] == "no"
    assert team["person"].batches == [["c"]]
    # stage 1: an llm cost of 1 makes a_llm - 1 = -0.05 and a_person = 0.05 < p = 0.5 for "b" and "d": the classifier
    # answers (tie 0.5 / 0.5 -> class 0, "no"); the llm is never called.
    team = experts()
    outputs = cascade(FEATURES, inputs=TEXTS, stage1_costs=[1.0, 0.0], experts=team)
    assert [o["answered_by"] for o in outputs] == ["model", "model", "person", "model"]
    assert [o["label"] for o in outputs] == ["no", "no", "yes", "no"] and team["llm"].batches == []
    # stage 2 threshold -0.5: "b" has margin a_person - a_llm = 0.5 - 0.82 = -0.32 > -0.5: escalated too ("no").
    team = experts()
    outputs = cascade(FEATURES, inputs=TEXTS, stage2_threshold=-0.5, experts=team)
    assert 0.5 - sigmoid(1.5) > -0.5
    assert [o["paid"] for o in outputs] == [0.5, 43.5, 40.5, 43.5] and outputs[1]["label"] == "no"
    assert team["person"].batches == [["b", "c", "d"]]
    # stage 1 threshold -1: "a" (margin 0.05 - 0.88 = -0.83 > -1) goes to the llm (tie of a_llm = a_person -> the
    # first); its max p 0.7 gives a_llm = sigmoid(-0.5) = 0.38 < a_person 0.5: escalated to the person ("yes" here).
    # Each expert gets its rows in input order.
    team = {"llm": Recorder(LLM_PROBS), "person": Recorder({**PERSON, "a": "yes"})}
    outputs = cascade(FEATURES, inputs=TEXTS, stage1_threshold=-1.0, experts=team)
    assert sigmoid(-0.5) < 0.5
    assert [o["paid"] for o in outputs] == [43.5, 3.5, 40.5, 43.5] and outputs[0]["label"] == "yes"
    assert team["llm"].batches == [["a", "b", "d"]] and team["person"].batches == [["a", "c", "d"]]
    # build-time costs apply to every call; call-time ones replace them.
    built = load(folder, experts=experts(), stage2_costs=[0.0, 0.5])
    assert built(FEATURES, inputs=TEXTS)[3]["paid"] == 3.5
    assert built(FEATURES, inputs=TEXTS, stage2_costs=[0.0, 0.0])[3]["paid"] == 43.5


def test_experts_at_call_time_replace_those_of_the_same_name(folder) -> None:
    cascade = load(folder, experts={"llm": Recorder(LLM_PROBS)})
    with pytest.raises(ValueError, match=r"missing \['person'\].*when building the pipeline or at call time"):
        cascade(FEATURES, inputs=TEXTS)
    person = Recorder({"c": "no", "d": "yes"})
    outputs = cascade(FEATURES, inputs=TEXTS, experts={"person": person})
    assert [o["label"] for o in outputs] == ["no", "yes", "no", "yes"] and person.batches == [["c", "d"]]


def test_old_layout_loads_and_resaves_in_the_new_one(tmp_path) -> None:
    stage1, stage2 = stages()
    old = tmp_path / "old"
    stage1.save_pretrained(old / "stage1")
    stage2.save_pretrained(old / "stage2")
    config = {"escalation_expert": "llm", "prices": PRICES, "stages": ["stage1", "stage2"]}
    (old / "cascade_config.json").write_text(json.dumps(config))
    team = experts()
    outputs = DeferralCascade.from_pretrained(old)(FEATURES, team, inputs=TEXTS)
    assert [o["paid"] for o in outputs] == [0.5, 3.5, 40.5, 43.5]
    team = experts()
    assert [o["paid"] for o in load(old / "stage1", experts=team)(FEATURES, inputs=TEXTS)] == [0.5, 3.5, 40.5, 43.5]
    assert team["person"].batches == [["c", "d"]]
    with pytest.raises(FileExistsError, match="overwrite=True"):
        DeferralCascade.from_pretrained(old).save_pretrained(old)
    DeferralCascade.from_pretrained(old).save_pretrained(old, overwrite=True)
    assert not (old / "stage1").exists() and (old / "config.json").is_file()
    assert json.loads((old / "cascade_config.json").read_text())["stages"] == [".", "stage2"]
    assert [o["label"] for o in load(old, experts=experts())(FEATURES, inputs=TEXTS)] == ["no", "yes", "yes", "no"]


def test_pipeline_saves_the_whole_cascade(folder, tmp_path) -> None:
    load(folder, experts=experts()).save_pretrained(tmp_path / "copy")
    outputs = load(tmp_path / "copy", experts=experts())(FEATURES, inputs=TEXTS)
    assert [o["paid"] for o in outputs] == [0.5, 3.5, 40.5, 43.5]
    with pytest.raises(FileExistsError, match="already holds a saved model or cascade"):
        load(folder, experts=experts()).save_pretrained(tmp_path / "copy")


def test_a_folder_without_cascade_config_and_the_deferral_task_on_a_cascade(folder, tmp_path) -> None:
    stages()[0].save_pretrained(tmp_path / "single")
    with pytest.raises(ValueError, match=r"single.*no cascade_config.json.*DeferralCascade.save_pretrained"):
        load(tmp_path / "single")
    with pytest.raises(ValueError, match=r"my-cascade.*'deferral' pipeline would run its stage 1 alone.*"
                                         r"deferral-cascade"):
        pipeline("deferral", model=str(folder), device="cpu")
    with pytest.raises(ValueError, match="deferral-cascade"):  # the code saved next to the weights refuses it too
        pipeline(model=str(folder), trust_remote_code=True, device="cpu")
    with pytest.raises(ValueError, match="not a local folder"):
        pipeline("deferral-cascade", model=stages()[0], device="cpu")


def test_bad_options_and_inputs(folder) -> None:
    cascade = load(folder, experts=experts())
    with pytest.raises(ValueError, match=r"features must be one vector of 3 numbers .* got shape \(2, 2\)"):
        cascade([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="non-empty"):
        cascade([])
    with pytest.raises(ValueError, match="finite"):
        cascade([float("nan"), 0.0, 0.0])
    with pytest.raises(TypeError, match="features must be feature vectors"):
        cascade("a text")
    with pytest.raises(ValueError, match=r"one input per feature vector \(4\), got 3"):
        cascade(FEATURES, inputs=TEXTS[:3])
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['stage3_costs'\]"):
        cascade(FEATURES, stage3_costs=[0.0])
    with pytest.raises(TypeError, match="batch_size"):
        cascade(FEATURES, batch_size=2)
    with pytest.raises(ValueError, match="stage2_costs"):
        cascade(FEATURES, stage2_costs=[0.0, -1.0])
    with pytest.raises(ValueError, match="stage1_threshold must be a finite number"):
        cascade(FEATURES, stage1_threshold=float("inf"))
    with pytest.raises(ValueError, match=r"experts names \['robot'\]"):
        load(folder, experts={"robot": print})
    with pytest.raises(TypeError, match=r"\['person'\] are not callable"):
        cascade(FEATURES, experts={"person": "Ann"})
    with pytest.raises(TypeError, match="inputs"):
        load(folder, inputs=TEXTS)
    with pytest.raises(NotImplementedError, match="upload_folder"):
        cascade.push_to_hub("me/cascade")


def test_docstring_example_runs() -> None:
    result = doctest.testmod(pipeline_cascade, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
