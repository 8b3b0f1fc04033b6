"""The monitor's gauges: on a registry of their own, and on `hf-defer serve --model`'s `/metrics` and `/monitor`."""

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import hf_defer
from hf_defer import DeferralMonitor
from hf_defer.monitoring import register_monitor_metrics
from hf_defer.serving import build_decision_app


def samples(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_gauges_follow_the_monitor_and_its_alarm():
    registry = CollectorRegistry()
    monitor = DeferralMonitor(["alice"], confidence=0.9, max_deferral_rate=0.1)
    register_monitor_metrics(registry, {"m": monitor})
    kept = {"defer": False, "expert": None, "class_label": "a", "class_score": 0.8, "expert_scores": {"alice": 0.9}}
    deferred = {**kept, "defer": True, "expert": "alice"}
    monitor.update([deferred] * 300 + [kept] * 200)  # 60 % deferred against a 10 % budget
    found = samples(generate_latest(registry).decode())
    key = (("channel", "deferral_rate"), ("model", "m"))
    assert found["hf_defer_monitor_mean", key] == pytest.approx(0.6)
    assert found["hf_defer_monitor_target", key] == 0.1
    assert found["hf_defer_monitor_alarm", key] == 1.0
    assert found["hf_defer_monitor_threshold", key] == pytest.approx(10.0)
    assert found["hf_defer_monitor_lower", key] > 0.1
    assert found["hf_defer_monitor_mean", (("channel", "estimated_error"), ("model", "m"))] == pytest.approx(
        (300 * 0.1 + 200 * 0.2) / 500)
    assert found["hf_defer_monitor_rows", (("model", "m"),)] == 500
    assert ("hf_defer_monitor_alarm", (("channel", "estimated_error"), ("model", "m"))) not in found  # no target


def test_the_decision_server_exposes_its_monitor():
    model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2))
    rng = np.random.default_rng(0)
    hf_defer.calibrate_deferral(model, list(rng.normal(size=(300, 4)).astype("float32")), max_deferral_rate=0.3,
                                confidence=0.9)
    client = TestClient(build_decision_app(hf_defer.DeferralPipeline(model=model)))
    answers = [client.post("/v1/decide", json={"input": [float(v) for v in row], "id": f"d{i}"}).json()
               for i, row in enumerate(rng.normal(size=(25, 4)))]
    share = np.mean([answer["deferred"] for answer in answers])
    state = client.get("/monitor").json()
    assert state["rows"] == 25 and state["channels"]["deferral_rate"]["target"] == 0.3
    assert state["channels"]["deferral_rate"]["mean"] == pytest.approx(share)
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)
    assert found["hf_defer_monitor_mean", (("channel", "deferral_rate"), ("model", "model"))] == pytest.approx(share)
    assert found["hf_defer_monitor_alarm", (("channel", "deferral_rate"), ("model", "model"))] == 0.0
