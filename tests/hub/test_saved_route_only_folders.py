"""Route-only folders saved while route-only was a flag of `EncoderForDeferral` keep loading as the same model with the
same outputs: `tests/fixtures/saved_route_only_flag/` (a text router with a side feature, a head-only router) was written
by `make_saved_route_only_flag.py` at the commit in `saved_route_only_flag.json`, its config naming `EncoderForDeferral`
with `route_only: true`, its outputs recorded then."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer, pipeline

import hf_defer
from hf_defer.modeling.side_features import side_feature_tensors
from without_hf_defer import BLOCK_HF_DEFER

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RECORDED = json.loads((FIXTURES / "saved_route_only_flag.json").read_text())


@pytest.fixture
def folders(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shutil.copytree(FIXTURES / "saved_route_only_flag", tmp_path / "saved")
    return tmp_path / "saved"


def assert_same_routes(got: list[dict], want: list[dict]) -> None:
    assert [(o["expert"], o["defer"], o["label"]) for o in got] == [(o["expert"], o["defer"], o["label"]) for o in want]
    for g, w in zip(got, want):
        assert g["expert_accuracy"] == pytest.approx(w["expert_accuracy"], abs=1e-6)
        assert g["estimated_accuracy"] == pytest.approx(w["estimated_accuracy"], abs=1e-6)
        assert g["cost"] == pytest.approx(w["cost"], abs=1e-12)


def text_rows() -> list[dict]:
    return [{"text": t, "subject": s} for t, s in zip(RECORDED["text"]["texts"], RECORDED["text"]["subjects"])]


def test_the_fixture_is_a_folder_of_the_flag_era():
    for kind in ("text", "features"):
        config = json.loads((FIXTURES / "saved_route_only_flag" / kind / "config.json").read_text())
        assert config["architectures"] == ["EncoderForDeferral"] and config["route_only"] is True
        assert config["auto_map"]["AutoModel"] == "modeling_deferral.EncoderForDeferral"
    # the recorded decisions are not all alike, so that a wrong rule would show
    assert {o["expert"] for o in RECORDED["text"]["pipeline"]} == {"small", "person"}
    assert set(RECORDED["features"]["defer"]) == {True, False}


def test_a_text_router_saved_as_a_flag_loads_with_the_same_outputs(folders):
    folder = folders / "text"
    outputs = pipeline("deferral", model=str(folder))(text_rows())
    assert_same_routes(outputs, RECORDED["text"]["pipeline"])
    model = hf_defer.AutoModelForDeferral.from_pretrained(folder).eval()
    assert type(model) is hf_defer.EncoderForRouting  # the class the config describes, not the one it names
    tokenizer = AutoTokenizer.from_pretrained(folder)
    side_categorical, _ = side_feature_tensors(model.config.side_features, text_rows())
    with torch.no_grad():
        logits = model(**tokenizer(RECORDED["text"]["texts"], return_tensors="pt", padding=True),
                       side_categorical=side_categorical).logits
    np.testing.assert_allclose(logits.numpy(), RECORDED["text"]["logits"], atol=1e-5)


@pytest.mark.parametrize("load", ["auto_model_for_deferral", "auto_model", "from_pretrained"])
def test_a_head_only_router_saved_as_a_flag_loads_with_the_same_outputs(folders, load):
    folder = folders / "features"
    loader = {"auto_model_for_deferral": hf_defer.AutoModelForDeferral.from_pretrained,
              "auto_model": AutoModel.from_pretrained,
              "from_pretrained": hf_defer.EncoderForDeferral.from_pretrained}[load]
    model = loader(folder).eval()
    assert type(model) is hf_defer.EncoderForRouting
    x = torch.tensor(RECORDED["features"]["features"])
    with torch.no_grad():
        out = model(features=x)
    np.testing.assert_allclose(out.logits.numpy(), RECORDED["features"]["logits"], atol=1e-5)
    np.testing.assert_allclose(out.expert_accuracy.numpy(), RECORDED["features"]["expert_accuracy"], atol=1e-6)
    assert out.defer.tolist() == RECORDED["features"]["defer"]
    outputs = pipeline("deferral", model=str(folder))(list(x.numpy()))
    assert_same_routes(outputs, RECORDED["features"]["pipeline"])


def test_saving_an_old_router_again_names_encoder_for_routing_and_keeps_its_outputs(folders, tmp_path):
    model = hf_defer.AutoModelForDeferral.from_pretrained(folders / "features").eval()
    model.save_pretrained(tmp_path / "again")
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert config["architectures"] == ["EncoderForRouting"] and config["route_only"] is True
    assert config["auto_map"]["AutoModel"] == "modeling_deferral.EncoderForRouting"
    with torch.no_grad():
        logits = AutoModel.from_pretrained(tmp_path / "again")(features=torch.tensor(RECORDED["features"]["features"]))
    np.testing.assert_allclose(logits.logits.numpy(), RECORDED["features"]["logits"], atol=1e-5)


REMOTE = BLOCK_HF_DEFER + r"""
import torch
from transformers import AutoModel, pipeline

folder, rows = sys.argv[1], json.loads(sys.argv[2])
model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
with torch.no_grad():
    logits = model(features=torch.tensor(rows)).logits.tolist()
print("RESULT" + json.dumps({"logits": logits, "pipeline": pipeline(model=folder, trust_remote_code=True)(rows),
                             "modules": sorted(name for name in sys.modules if name.startswith("hf_defer"))}))
"""


@pytest.mark.slow  # a fresh interpreter: make test-slow (CI) runs it
def test_remote_code_mode_loads_a_router_saved_as_a_flag(folders, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), TOKENIZERS_PARALLELISM="false")
    run = subprocess.run([sys.executable, "-c", REMOTE, str(folders / "features"),
                          json.dumps(RECORDED["features"]["features"])], cwd=tmp_path, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    remote = json.loads(run.stdout.split("RESULT", 1)[1])
    assert remote["modules"] == []
    np.testing.assert_allclose(remote["logits"], RECORDED["features"]["logits"], atol=1e-5)
    assert_same_routes(remote["pipeline"], RECORDED["features"]["pipeline"])
