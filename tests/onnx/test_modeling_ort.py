"""`ORTModelForDeferral` behind the deferral pipeline, `hf-defer predict --backend onnx` and `hf-defer serve --backend
onnx`: the same decisions and estimates as the PyTorch model (float32), and clear errors for what it cannot run."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from transformers import BertTokenizer, pipeline  # noqa: E402

from hf_defer import DeferralConfig, EncoderForDeferral, ORTModelForDeferral  # noqa: E402
from hf_defer.commands.cli import main as hf_defer_main  # noqa: E402
from hf_defer.onnx import export_onnx, onnx_pipeline  # noqa: E402
from tiny_bert import save_tiny_bert  # noqa: E402
from tiny_router import PROMPTS, margins_by_forward, save_tiny_router  # noqa: E402

WORDS = "you are great awful idiot thanks hello the a of what is capital city prove".split()
TEXTS = ["you are great", "idiot", "what is the capital city", "thanks a of the", "prove", "hello you awful idiot"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ort")
    save_tiny_bert(root / "encoder", WORDS)
    torch.manual_seed(5)
    model = EncoderForDeferral.from_encoder_pretrained(str(root / "encoder"), num_labels=3, num_experts=2,
                                                       pooling="mean", expert_names=["alice", "bob"],
                                                       id2label={0: "ok", 1: "rude", 2: "hate"})
    with torch.no_grad():
        model.head[-1].weight.mul_(30)  # decisions that differ between inputs: some deferred, some not
    model.save_pretrained(root / "torch")
    BertTokenizer.from_pretrained(root / "encoder").save_pretrained(root / "torch")
    export_onnx(root / "torch", root / "onnx")
    return root / "torch", root / "onnx"


def test_the_pipeline_over_onnx_decides_as_the_pytorch_pipeline(folders):
    torch_folder, onnx_folder = folders
    expected = pipeline("deferral", model=str(torch_folder))(TEXTS, batch_size=4, return_margin=True)
    got = onnx_pipeline(onnx_folder)(TEXTS, batch_size=4, return_margin=True)
    assert len({out["label"] for out in expected}) > 1  # not a constant decision
    for want, have in zip(expected, got):
        assert (have["label"], have["defer"], have["expert"], have["class_label"]) == \
            (want["label"], want["defer"], want["expert"], want["class_label"])
        assert have["expert_accuracy"] == pytest.approx(want["expert_accuracy"], abs=1e-4)
        assert have["scores"] == pytest.approx(want["scores"], abs=1e-4)
        assert have["margin"] == pytest.approx(want["margin"], abs=1e-4)
    # the transformers factory takes the model object, as with optimum's ORTModel classes
    same = pipeline("deferral", model=ORTModelForDeferral.from_pretrained(onnx_folder), tokenizer=str(onnx_folder))
    assert [out["label"] for out in same(TEXTS)] == [out["label"] for out in expected]
    # and the exported folder by its name: AutoModelForDeferral loads an ONNX export as an ORTModelForDeferral
    by_name = pipeline("deferral", model=str(onnx_folder))
    assert isinstance(by_name.model, ORTModelForDeferral)
    assert [out["label"] for out in by_name(TEXTS)] == [out["label"] for out in expected]


def test_from_pretrained_says_what_is_missing(folders, tmp_path):
    torch_folder, onnx_folder = folders
    with pytest.raises(OSError, match="has no ONNX model .*hf-defer export --onnx"):
        ORTModelForDeferral.from_pretrained(torch_folder)
    with pytest.raises(OSError, match="is not a folder"):
        ORTModelForDeferral.from_pretrained(tmp_path / "nothing")
    with pytest.raises(TypeError, match=r"\['quantize'\] are options of the export: pass export=True"):
        ORTModelForDeferral.from_pretrained(onnx_folder, quantize="int8")
    model = ORTModelForDeferral.from_pretrained(onnx_folder)
    with pytest.raises(ValueError, match="runs on the CPU"):
        model.to("cuda")
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 20\)"):
        model(input_ids=torch.tensor([[2, 25, 3]]))
    with pytest.raises(ValueError, match=r"takes \['input_ids', 'attention_mask', 'token_type_ids'\], got \['features'\]"):
        model(input_ids=torch.tensor([[2, 5, 3]]), features=torch.zeros(1, 4))


def test_export_on_the_fly_and_head_only_inputs_are_checked(tmp_path):
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2, num_experts=1)).eval()
    model.save_pretrained(tmp_path / "head")
    ort = ORTModelForDeferral.from_pretrained(tmp_path / "head", export=True)
    features = torch.randn(9, 4)
    with torch.no_grad():
        assert torch.allclose(ort(features=features).logits, model(features=features).logits, atol=1e-5)
    with pytest.raises(ValueError, match=r"features must have shape \[batch, feature_size\] = \[B, 4\], got shape"):
        ort(features=torch.randn(2, 5))
    loss = ort(features=features, labels=torch.zeros(9, dtype=torch.long), expert_labels=torch.zeros(9, dtype=torch.long))
    with torch.no_grad():
        expected = model(features=features, labels=torch.zeros(9, dtype=torch.long),
                         expert_labels=torch.zeros(9, dtype=torch.long)).loss
    assert float(loss.loss) == pytest.approx(float(expected), abs=1e-5)


def test_hf_defer_predict_backend_onnx_writes_the_torch_backend_file(folders, tmp_path):
    torch_folder, onnx_folder = folders
    pd.DataFrame({"text": TEXTS}).to_csv(tmp_path / "in.csv", index=False)
    for backend, folder in (("torch", torch_folder), ("onnx", onnx_folder)):
        assert hf_defer_main(["predict", "--model", str(folder), "--input", str(tmp_path / "in.csv"), "--backend",
                              backend, "--output", str(tmp_path / f"{backend}.csv"), "--batch_size", "4"]) == 0
    want, got = pd.read_csv(tmp_path / "torch.csv"), pd.read_csv(tmp_path / "onnx.csv")
    assert list(got.columns) == list(want.columns)
    numbers = [c for c in want.columns if want[c].dtype.kind == "f"]
    pd.testing.assert_frame_equal(got.drop(columns=numbers), want.drop(columns=numbers))
    pd.testing.assert_frame_equal(got[numbers], want[numbers], atol=1e-4, rtol=0)
    # a PyTorch folder with --backend onnx: the error says how to export it
    assert hf_defer_main(["predict", "--model", str(torch_folder), "--input", str(tmp_path / "in.csv"), "--backend",
                          "onnx", "--output", str(tmp_path / "x.csv")]) == 2


def test_hf_defer_serve_backend_onnx_routes_as_the_pytorch_router(tmp_path):
    pytest.importorskip("fastapi")
    from hf_defer.commands.serve import build_app

    router = save_tiny_router(tmp_path)
    export_onnx(router, tmp_path / "router-onnx")
    urls = ["--model", "weak=http://127.0.0.1:9/v1", "--model", "strong=http://127.0.0.1:9/v1"]
    app, _ = build_app(["--router", str(tmp_path / "router-onnx"), "--backend", "onnx", *urls])
    assert isinstance(app.state.router.pipeline.model, ORTModelForDeferral)
    decisions = app.state.router.decide(PROMPTS)
    threshold = app.state.router.defer_threshold
    margins = margins_by_forward(router, PROMPTS)  # PyTorch's, one prompt at a time
    assert [out["margin"] for out in decisions] == pytest.approx(margins, abs=1e-4)
    assert [out["expert"] for out in decisions] == ["strong" if m > threshold else "weak" for m in margins]
    with pytest.raises(ValueError, match="--backend onnx: --router .* must be an exported router that reads text"):
        build_app(["--router", str(tmp_path / "router-onnx"), "--backend", "onnx", "--encoder", "x", *urls])
