"""`hf-defer serve --model`: a deferral model with people as experts. Decisions are checked against the rule worked
out here from the model's forward pass (defer iff max_j a_j - max_y p(y|x) > threshold, to argmax_j a_j); deferred
inputs go to a review project, a fake of `ReviewProject` holding its tasks in memory, through the real push and pull."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from transformers import BertTokenizer, pipeline

from fake_upstream import serve_in_thread
from hf_defer import EncoderForDeferral
from hf_defer.review.labeling import CONTROL_NAME
from hf_defer.review.tasks import KEY_FIELD
from hf_defer.serving import build_decision_app
from tiny_bert import save_tiny_bert

WORDS = "you are kind rude nice awful great terrible maybe the a of".split()
TEXTS = [" ".join(WORDS[(5 * i + k) % len(WORDS)] for k in range(1 + i % 4)) for i in range(16)]
TEXTS = list(dict.fromkeys(TEXTS))


class FakeProject:
    """What `push` and `pull` use of a `ReviewProject`, in memory; `answer` is a reviewer answering in the UI."""

    title = "fake reviews"

    def __init__(self, classes: list[str]) -> None:
        self.classes = classes
        self.tasks: list[dict] = []

    def task_keys(self) -> dict[str, int]:
        return {task["data"][KEY_FIELD]: task["id"] for task in self.tasks}

    def import_tasks(self, tasks) -> list[int]:
        created = []
        for task in tasks:
            self.tasks.append({"id": 100 + len(self.tasks), "data": task["data"], "annotations": []})
            created.append(self.tasks[-1]["id"])
        return created

    def annotated_tasks(self) -> list[dict]:
        return [task for task in self.tasks if task["annotations"]]

    def users(self, refresh: bool = False) -> dict[int, str]:
        return {7: "rev@example.com"}

    def answer(self, task_id: int, choice: str) -> None:
        task = next(task for task in self.tasks if task["id"] == task_id)
        task["annotations"].append({"id": len(task["annotations"]) + 1, "completed_by": 7,
                                    "updated_at": "2026-11-27T01:00:00Z", "lead_time": 3.0,
                                    "result": [{"from_name": CONTROL_NAME, "type": "choices",
                                                "value": {"choices": [choice]}}]})


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("decider")
    save_tiny_bert(root / "encoder", WORDS)
    torch.manual_seed(3)
    model = EncoderForDeferral.from_encoder_pretrained(str(root / "encoder"), num_labels=2, num_experts=2,
                                                       id2label={0: "ok", 1: "abusive"},
                                                       expert_names=["alice", "bob"], pooling="mean")
    with torch.no_grad():
        model.head[-1].weight.mul_(20)
    model.save_pretrained(root / "model")
    BertTokenizer.from_pretrained(root / "encoder").save_pretrained(root / "model")
    return root / "model"


@pytest.fixture(scope="module")
def expected(model_folder) -> dict[str, tuple[bool, str]]:
    """(deferred, the class or the expert) per text, from the forward pass at the saved threshold (0)."""
    model = EncoderForDeferral.from_pretrained(model_folder).eval()
    tokenizer = BertTokenizer.from_pretrained(model_folder)
    out = {}
    with torch.no_grad():
        for text in TEXTS:
            result = model(**tokenizer(text, return_tensors="pt"))
            probs, accuracy = result.class_probs[0].double(), result.expert_accuracy[0].double()
            margin = float(accuracy.max() - probs.max())
            assert abs(margin) > 1e-6
            deferred = margin > model.config.defer_threshold
            out[text] = (deferred, model.config.expert_names[int(accuracy.argmax())] if deferred
                         else model.config.id2label[int(probs.argmax())])
    assert 0 < sum(deferred for deferred, _ in out.values()) < len(TEXTS)  # both kinds of decision
    return out


def test_decide_answers_or_defers_as_the_model_rule_says(model_folder, expected):
    with serve_in_thread(build_decision_app(pipeline("deferral", model=str(model_folder)))) as url:
        got = {text: httpx.post(url + "/v1/decide", json={"input": text}).json() for text in TEXTS}
        looked_up = httpx.get(url + f"/v1/decisions/{got[TEXTS[0]]['id']}").json()
        missing = httpx.get(url + "/v1/decisions/nope")
        bad = httpx.post(url + "/v1/decide", json={"text": "x"})
    for text, (deferred, who) in expected.items():
        decision = got[text]
        assert decision["deferred"] is deferred
        assert (decision["status"], decision["expert"] if deferred else decision["answer"]) == \
            ("deferred" if deferred else "answered", who)
    assert looked_up == got[TEXTS[0]]
    assert missing.status_code == 404 and "no decision 'nope'" in missing.json()["error"]["message"]
    assert bad.status_code == 400 and '"input"' in bad.json()["error"]["message"]


def test_a_deferred_input_becomes_a_review_task_and_its_answer_comes_back(model_folder, expected):
    project = FakeProject(["ok", "abusive"])
    deferred_text = next(text for text, (deferred, _) in expected.items() if deferred)
    kept_text = next(text for text, (deferred, _) in expected.items() if not deferred)
    app = build_decision_app(pipeline("deferral", model=str(model_folder)), review_project=project)
    with serve_in_thread(app) as url:
        kept = httpx.post(url + "/v1/decide", json={"input": kept_text, "id": "k1"}).json()
        first = httpx.post(url + "/v1/decide", json={"input": deferred_text, "id": "d1"}).json()
        again = httpx.post(url + "/v1/decide", json={"input": deferred_text, "id": "d1"}).json()
        clash = httpx.post(url + "/v1/decide", json={"input": kept_text, "id": "d1"})
        pending = httpx.get(url + "/v1/decisions/d1").json()
        project.answer(first["task_id"], "abusive")
        reviewed = httpx.get(url + "/v1/decisions/d1").json()
    assert kept["status"] == "answered" and kept["task_id"] is None
    assert first["status"] == "pending_review" and first["expert"] == expected[deferred_text][1]
    assert [task["data"][KEY_FIELD] for task in project.tasks] == ["id:d1"]  # one task, the same id posted twice
    assert again == first and clash.status_code == 409
    assert pending["status"] == "pending_review" and pending["answer"] is None
    assert (reviewed["status"], reviewed["answer"], reviewed["reviewer"]) == ("reviewed", "abusive", "rev@example.com")


def test_a_review_project_without_the_models_classes_is_refused(model_folder):
    pipe = pipeline("deferral", model=str(model_folder))
    with pytest.raises(ValueError, match=r"does not offer the model's classes \['abusive'\]"):
        build_decision_app(pipe, review_project=FakeProject(["ok", "spam"]))


def test_serve_model_behind_keys_with_long_inputs_and_bad_bodies(model_folder, monkeypatch):
    """`hf-defer serve --model` with client keys: the keys open /v1/decide, /v1/decisions and /metrics (not
    /health); a text longer than the encoder's 32 positions is truncated to them (as predict does), not refused; a
    body of the wrong shape is 400 in OpenAI's shape; nothing refused becomes a decision."""
    from fastapi.testclient import TestClient

    from hf_defer.commands.serve import build_app

    key = "sk-reviews-0123456789abcdef"
    monkeypatch.setenv("HF_DEFER_TEST_KEYS", f"frontend:{key}")
    app, _ = build_app(["--model", str(model_folder), "--auth_keys_env", "HF_DEFER_TEST_KEYS",
                        "--max_request_bytes", "2000", "--max_requests_per_minute", "600"])
    bearer = {"Authorization": f"Bearer {key}"}
    long_text = " ".join(TEXTS) * 4
    with TestClient(app) as http:
        refused = [http.post("/v1/decide", json={"input": TEXTS[0], "id": "a"}),
                   http.post("/v1/decide", json={"input": TEXTS[0], "id": "a"}, headers={"Authorization": "Bearer "
                                                                                          + "k" * len(key)}),
                   http.post(f"/v1/decide?api_key={key}", json={"input": TEXTS[0], "id": "a"}),
                   http.get("/v1/decisions/a"), http.get("/metrics")]
        health = http.get("/health")
        long = http.post("/v1/decide", json={"input": long_text, "id": "long"}, headers=bearer)
        bad = [http.post("/v1/decide", json=body, headers=bearer) for body in (
            {"input": ["a", "list"]}, {"input": {"text": "x"}}, {"input": "kind", "id": ["x"]}, [1, 2],
            {"input": "kind", "available_experts": 7})]
        huge = http.post("/v1/decide", json={"input": "kind " * 1000}, headers=bearer)
        nested = http.post("/v1/decide", content=b"[" * 1900, headers=bearer)
        metrics = http.get("/metrics", params={"format": "json"}, headers=bearer).json()
        missing = http.get("/v1/decisions/a", headers=bearer)
    assert [r.status_code for r in refused] == [401] * 5 and health.json() == {"status": "ok"}
    assert all(r.json()["error"]["code"] == "invalid_api_key" for r in refused)
    assert long.status_code == 200 and long.json()["status"] in ("answered", "deferred")
    assert [r.status_code for r in bad] == [400] * 5, [r.text for r in bad]
    assert all(set(r.json()["error"]) == {"message", "type", "param", "code"} for r in bad)
    assert huge.status_code == 413 and nested.status_code == 400 and "nested too deeply" in nested.text
    assert missing.status_code == 404  # the refused posts made no decision
    assert sum(metrics["decisions"].values()) == 1 and metrics["client_requests"] == {"frontend": 8.0}
    assert metrics["rejected"] == {"too_large": {"frontend": 1.0}, "unauthorized": {"-": 5.0}}


class RecordingPipe:
    """A pipeline of an image or feature model that records what it is given and defers nothing."""

    def __init__(self, input_kind: str) -> None:
        from types import SimpleNamespace

        self.input_kind, self.calls = input_kind, []
        self.model = SimpleNamespace(config=SimpleNamespace(model_type="deferral", route_only=False,
                                                            id2label={0: "ok", 1: "bad"}, expert_names=["alice"]))

    def __call__(self, model_input, **kwargs):
        self.calls.append(model_input)
        return {"defer": False, "label": "ok", "expert": None, "class_label": "ok", "class_score": 0.9,
                "expert_scores": [0.1]}


def test_an_image_model_reads_data_urls_only_never_a_path_or_url(tmp_path):
    """A path or a URL as `input` would make the server read its own files or fetch internal URLs for a client: 400,
    and the pipeline is never called; a base64 PNG is decoded here and reaches the pipeline as the image."""
    import base64
    import io

    from fastapi.testclient import TestClient
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(buffer, format="PNG")
    png = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    secret = tmp_path / "secret.png"
    secret.write_bytes(buffer.getvalue())
    pipe = RecordingPipe("image")
    with TestClient(build_decision_app(pipe)) as http:
        refused = [http.post("/v1/decide", json={"input": value}) for value in (
            str(secret), "file://" + str(secret), "http://169.254.169.254/latest/meta-data", ["a.png"],
            base64.b64encode(buffer.getvalue()).decode())]
        garbage = http.post("/v1/decide", json={"input": "data:image/png;base64,bm90IGFuIGltYWdl"})
        good = http.post("/v1/decide", json={"input": png})
    assert [r.status_code for r in refused] == [400] * 5
    assert all("base64 data URL" in r.json()["error"]["message"] for r in refused)
    assert garbage.status_code == 400 and "not a readable base64 image" in garbage.json()["error"]["message"]
    assert good.status_code == 200 and good.json()["answer"] == "ok"
    assert len(pipe.calls) == 1 and pipe.calls[0].size == (4, 3) and pipe.calls[0].getpixel((0, 0)) == (200, 10, 10)


def test_a_feature_model_takes_one_vector_of_numbers():
    from fastapi.testclient import TestClient

    pipe = RecordingPipe("features")
    with TestClient(build_decision_app(pipe)) as http:
        refused = [http.post("/v1/decide", json={"input": value}) for value in (
            [[0.1, 0.2], [0.3, 0.4]], [], ["0.1"], [True, 0.2], "0.1,0.2", {"x": 1})]
        good = http.post("/v1/decide", json={"input": [0.1, 2, -3.5]})
    assert [r.status_code for r in refused] == [400] * 6
    assert good.status_code == 200 and pipe.calls == [[0.1, 2, -3.5]]
