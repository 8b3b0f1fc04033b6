"""`export_onnx` and `hf-defer export --onnx`: the exported graph computes the PyTorch model's logits for any batch
and sequence length (side features included), int8 quantization writes int8 weights, and mistakes are refused before
anything is written."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

import json  # noqa: E402

import torch  # noqa: E402
from transformers import BertTokenizer  # noqa: E402

from hf_defer import DeferralConfig, EncoderForDeferral  # noqa: E402
from hf_defer.commands.cli import main as hf_defer_main  # noqa: E402
from hf_defer.onnx import ORTModelForDeferral, export_onnx, require_onnx  # noqa: E402
from hf_defer.onnx.export import DEFAULT_FALLBACK_TOLERANCE  # noqa: E402
from tiny_bert import save_tiny_bert  # noqa: E402

WORDS = "you are great awful idiot thanks hello the a of what is capital city prove".split()
SIDE = [{"name": "tier", "kind": "categorical", "categories": ["free", "pro"], "dim": 3},
        {"name": "length", "kind": "numeric", "mean": 40.0, "std": 20.0}]


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    save_tiny_bert(root / "encoder", WORDS)
    torch.manual_seed(3)
    model = EncoderForDeferral.from_encoder_pretrained(str(root / "encoder"), num_labels=3, num_experts=2,
                                                       pooling="mean", side_features=SIDE).eval()
    model.save_pretrained(root / "model")
    BertTokenizer.from_pretrained(root / "encoder").save_pretrained(root / "model")
    return root / "model", model


def _batch(tokenizer, texts):
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    n = len(texts)
    batch["side_categorical"] = torch.tensor([[i % 3] for i in range(n)])  # 0: a tier not seen in training
    batch["side_numeric"] = torch.tensor([[5.0 + 17 * i] for i in range(n)])
    return batch


def test_float32_export_matches_pytorch_for_other_batch_sizes_lengths_and_padding(text_model, tmp_path):
    folder, model = text_model
    path = export_onnx(folder, tmp_path / "onnx")
    assert path.name == "model.onnx" and (tmp_path / "onnx" / "config.json").is_file()
    files = {p.name for p in (tmp_path / "onnx").iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json"} <= files  # the tokenizer travels with the graph
    assert not [name for name in files if name.endswith(".py")]  # no remote code: the folder loads with hf_defer
    tokenizer = BertTokenizer.from_pretrained(tmp_path / "onnx")
    ort = ORTModelForDeferral.from_pretrained(tmp_path / "onnx")
    assert ort.input_names == ["input_ids", "attention_mask", "token_type_ids", "side_categorical", "side_numeric"]
    for texts in (["hello"], ["you are great", "what is the capital city of a the of prove", "idiot"],
                  [" ".join(WORDS * 2)] + ["a"] * 6):
        batch = _batch(tokenizer, texts)
        with torch.no_grad():
            expected = model(**batch)
        got = ort(**batch)
        assert got.logits.shape == expected.logits.shape
        for name in ("logits", "class_probs", "expert_accuracy"):
            assert torch.allclose(getattr(got, name), getattr(expected, name), atol=1e-4, rtol=0), name
        assert torch.equal(got.defer, expected.defer)


@pytest.mark.parametrize("route_only", [False, True])
def test_head_only_models_export_their_head(tmp_path, route_only):
    torch.manual_seed(0)
    classes = {"route_only": True} if route_only else {"num_labels": 3}
    model = EncoderForDeferral.class_for_config(config := DeferralConfig(feature_size=6, num_experts=2, **classes))
    model = model(config).eval()
    export_onnx(model, tmp_path / "onnx")
    ort = ORTModelForDeferral.from_pretrained(tmp_path / "onnx")
    features = torch.randn(17, 6) * 3
    with torch.no_grad():
        expected = model(features=features)
    got = ort(features=features)
    assert torch.allclose(got.logits, expected.logits, atol=1e-5)
    assert torch.allclose(got.expert_accuracy, expected.expert_accuracy, atol=1e-5)
    assert got.class_probs.shape == (17, 0 if route_only else 3) and torch.equal(got.defer, expected.defer)


def test_int8_export_quantizes_the_weights_and_stays_close(text_model, tmp_path):
    folder, model = text_model
    path = export_onnx(folder, tmp_path / "int8", quantize="int8", fallback_tolerance=0)
    assert path.name == "model_quantized.onnx" and not (tmp_path / "int8" / "model.onnx").exists()
    assert json.loads((tmp_path / "int8" / "ort_config.json").read_text())["fallback"] is None
    graph = onnx.load(str(path)).graph
    int8 = [t.name for t in graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert int8 and any(node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for node in graph.node)
    # the tiny BERT's one layer: its feed-forward output projection and the head stay float32, the other 5 do not
    # (newer onnxruntime rewrites the head's Gemm as a MatMul named so, older ones leave it a Gemm)
    weights = {t.name for t in graph.initializer}
    float_matmuls = [node.name.removesuffix("_MatMul") for node in graph.node
                     if node.op_type in ("MatMul", "Gemm") and node.input[1] in weights]
    assert sorted(float_matmuls) == ["/model/encoder/encoder/layer.0/output/dense/MatMul", "/model/head/head.1/Gemm"]
    assert sum(node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for node in graph.node) == 5
    tokenizer = BertTokenizer.from_pretrained(tmp_path / "int8")
    batch = _batch(tokenizer, ["you are great", "what is the capital city", "idiot thanks"])
    with torch.no_grad():
        expected = model(**batch).expert_accuracy
    ort = ORTModelForDeferral.from_pretrained(tmp_path / "int8")
    assert ort.quantized and ort.fallback_session is None
    output = ort(**batch)
    assert output.rescored is None and (output.expert_accuracy - expected).abs().max() < 0.05  # int8 rounding


def test_int8_export_keeps_the_float32_graph_for_the_fallback(text_model, tmp_path):
    folder, _ = text_model
    path = export_onnx(folder, tmp_path / "int8", quantize="int8")
    assert path.name == "model_quantized.onnx"
    assert sorted(p.name for p in (tmp_path / "int8").glob("*.onnx")) == ["model.onnx", "model_quantized.onnx"]
    saved = json.loads((tmp_path / "int8" / "ort_config.json").read_text())
    assert saved["fallback"] == {"file": "model.onnx", "tolerance": DEFAULT_FALLBACK_TOLERANCE}
    assert saved["quantization"]["format"] == "int8" and saved["quantization"]["quantized"] == 5
    ort = ORTModelForDeferral.from_pretrained(tmp_path / "int8")
    assert ort.model_path.name == "model_quantized.onnx" and ort.fallback_tolerance == DEFAULT_FALLBACK_TOLERANCE
    assert ORTModelForDeferral.from_pretrained(tmp_path / "int8", fallback_tolerance=0.2).fallback_tolerance == 0.2
    alone = ORTModelForDeferral.from_pretrained(tmp_path / "int8", fallback_tolerance=0)
    assert alone.quantized and alone.fallback_session is None
    as_float = ORTModelForDeferral.from_pretrained(tmp_path / "int8", file_name="model.onnx")
    assert not as_float.quantized and as_float.fallback_session is None
    export_onnx(folder, tmp_path / "int8", overwrite=True)  # a float32 re-export leaves no int8 file behind
    assert sorted(p.name for p in (tmp_path / "int8").iterdir() if p.suffix in (".onnx", ".json") and
                  p.name != "config.json" and "token" not in p.name) == ["model.onnx"]
    with pytest.raises(ValueError, match="has no int8 graph kept with its float32 one"):
        ORTModelForDeferral.from_pretrained(tmp_path / "int8", fallback_tolerance=0.1)


@pytest.mark.parametrize("tolerance, quantize, message", [
    (-0.1, "int8", r"--fallback_tolerance must be a finite number >= 0 \(0: no float32 fallback\), got -0.1"),
    (float("nan"), "int8", "--fallback_tolerance must be a finite number >= 0"),
    ("0.1", "int8", "--fallback_tolerance must be a finite number >= 0"),
    (0.1, None, "--fallback_tolerance is for an int8 export"),
])
def test_a_bad_fallback_tolerance_is_refused(text_model, tmp_path, tolerance, quantize, message):
    folder, _ = text_model
    with pytest.raises(ValueError, match=message):
        export_onnx(folder, tmp_path / "out", quantize=quantize, fallback_tolerance=tolerance)
    assert not (tmp_path / "out").exists()


def test_mistakes_are_refused_before_anything_is_written(text_model, tmp_path):
    folder, _ = text_model
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="exists and is not empty; choose another folder or pass --overwrite"):
        export_onnx(folder, tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["notes.txt"]
    with pytest.raises(ValueError, match=r"--quantize must be one of \['int8'\], got 'int4'"):
        export_onnx(folder, tmp_path / "q", quantize="int4")
    with pytest.raises(OSError, match="is not a folder of a saved deferral model"):
        export_onnx(tmp_path / "nothing", tmp_path / "out")
    with pytest.raises(ValueError, match="--encoder 'x' is for a head-only model"):
        export_onnx(folder, tmp_path / "out", encoder="x")
    assert not (tmp_path / "q").exists() and not (tmp_path / "out").exists()


def test_without_the_extra_the_error_names_it(monkeypatch, capsys, text_model, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'hf-defer\[onnx\]'"):
        require_onnx()
    folder, _ = text_model
    assert hf_defer_main(["export", "--onnx", str(folder), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "hf-defer[onnx]" in err and len(err.splitlines()) == 1
    (tmp_path / "x.txt").write_text("hello\n")
    assert hf_defer_main(["predict", "--model", str(folder), "--input", str(tmp_path / "x.txt"), "--backend", "onnx",
                          "--output", str(tmp_path / "p.csv")]) == 2
    assert "hf-defer[onnx]" in capsys.readouterr().err


def test_hf_defer_export_writes_the_folder_and_asks_for_onnx(text_model, tmp_path, capsys):
    folder, _ = text_model
    assert hf_defer_main(["export", str(folder), str(tmp_path / "out")]) == 2
    assert "pass --onnx" in capsys.readouterr().err
    assert hf_defer_main(["export", "--onnx", "--quantize", "int8", str(folder), str(tmp_path / "out")]) == 0
    assert "model_quantized.onnx" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").glob("*.onnx")) == ["model.onnx", "model_quantized.onnx"]
    assert hf_defer_main(["export", "--onnx", "--quantize", "int8", "--fallback_tolerance", "0", "--overwrite",
                          str(folder), str(tmp_path / "out")]) == 0
    assert "int8 alone" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").glob("*.onnx")) == ["model_quantized.onnx"]
    assert hf_defer_main(["export", "--onnx", "--fallback_tolerance", "0.1", str(folder), str(tmp_path / "x")]) == 2
    assert "--fallback_tolerance is for an int8 export" in capsys.readouterr().err
    assert hf_defer_main(["export", "--onnx", str(folder), str(tmp_path / "out")]) == 2  # not over a folder
    assert hf_defer_main(["export", "--onnx", "--overwrite", str(folder), str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").glob("*.onnx")) == ["model.onnx"]  # one graph per folder
