"""`ORTModelForDeferral` behind the deferral pipeline, `hf-defer predict --backend onnx` and `hf-defer serve --backend
onnx`: the same decisions and estimates as the PyTorch model (float32), and clear errors for what it cannot run."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import math  # noqa: E402

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from transformers import BertTokenizer, pipeline  # noqa: E402

from hf_defer import DeferralConfig, EncoderForDeferral, ORTModelForDeferral  # noqa: E402
from hf_defer.commands.cli import main as hf_defer_main  # noqa: E402
from hf_defer.modeling import get_surrogate  # noqa: E402
from hf_defer.modeling.surrogate_routing import RouteOnlySurrogate  # noqa: E402
from hf_defer.onnx import export_onnx, onnx_pipeline  # noqa: E402
from hf_defer.onnx.modeling_ort import decision_gap  # noqa: E402
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


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_decision_gap_worked_by_hand():
    aova = get_surrogate("aova", num_classes=2, num_experts=1)  # estimates: sigmoid of each logit
    logits = torch.tensor([[2.0, 0.0, 1.0],    # answered: margin a - p_0 < 0, classes 0.88 vs 0.5
                           [0.0, 0.2, 3.0],    # deferred to the one expert
                           [0.0, 0.4, 0.2]])   # answered, classes close: the class gap is the nearest flip
    margins = [_sigmoid(1) - _sigmoid(2), _sigmoid(3) - _sigmoid(0.2), _sigmoid(0.2) - _sigmoid(0.4)]
    class_gaps = [_sigmoid(2) - _sigmoid(0), None, _sigmoid(0.4) - _sigmoid(0)]
    expected = [min(abs(margins[0]), class_gaps[0]), abs(margins[1]), min(abs(margins[2]), class_gaps[2])]
    assert decision_gap(aova, logits).tolist() == pytest.approx(expected, abs=1e-7)
    # the threshold moves the boundary: row 1 is deferred by 0.403 - 0.4
    assert float(decision_gap(aova, logits, defer_threshold=0.4)[1]) == pytest.approx(margins[1] - 0.4, abs=1e-7)
    # two experts: a deferred row's nearest flip may be between them; costs are paid before comparing
    two = get_surrogate("aova", num_classes=2, num_experts=2)
    row = torch.tensor([[0.0, 0.0, 2.0, 1.5]])
    assert float(decision_gap(two, row)) == pytest.approx(_sigmoid(2) - _sigmoid(1.5), abs=1e-7)
    paid = (_sigmoid(2) - 0.05) - (_sigmoid(1.5) - 0.0)
    assert float(decision_gap(two, row, expert_costs=[0.05, 0.0])) == pytest.approx(paid, abs=1e-7)
    # an expert that cannot answer is no candidate: one expert left, the margin alone
    assert float(decision_gap(two, row, available=[False, True])) == pytest.approx(_sigmoid(1.5) - 0.5, abs=1e-7)


def test_decision_gap_of_a_router_worked_by_hand():
    router = RouteOnlySurrogate(num_experts=3, default_expert=0)
    logits = torch.tensor([[1.0, 0.5, 0.4],    # stays with the default expert
                           [0.0, 1.0, 0.9]])   # routed away, to expert 1 just ahead of expert 2
    gaps = decision_gap(router, logits, defer_threshold=0.1, route_only=True).tolist()
    assert gaps[0] == pytest.approx(abs(_sigmoid(0.5) - _sigmoid(1) - 0.1), abs=1e-7)
    assert gaps[1] == pytest.approx(min(_sigmoid(1) - _sigmoid(0) - 0.1, _sigmoid(1) - _sigmoid(0.9)), abs=1e-7)


def test_int8_rows_near_the_boundary_are_rescored_in_float32_and_get_the_torch_decision(folders, tmp_path):
    torch.manual_seed(7)
    model = EncoderForDeferral.from_encoder_pretrained(str(folders[0].parent / "encoder"), num_labels=3, num_experts=2,
                                                       pooling="mean", expert_names=["alice", "bob"])
    with torch.no_grad():
        model.head[-1].weight.mul_(8)  # estimates that vary between inputs and are not saturated
        # one hidden channel 200 times the others, the activation outlier that per-tensor int8 rounds the rest by
        model.encoder.embeddings.LayerNorm.weight[0] *= 200
    torch_folder = tmp_path / "torch"
    model.save_pretrained(torch_folder)
    BertTokenizer.from_pretrained(folders[0]).save_pretrained(torch_folder)
    export_onnx(torch_folder, tmp_path / "int8", quantize="int8")
    texts = TEXTS + ["great thanks", "awful awful idiot", "what is prove", "hello the city"]
    expected = pipeline("deferral", model=str(torch_folder))(texts, batch_size=len(texts), return_margin=True)
    alone = onnx_pipeline(tmp_path / "int8", fallback_tolerance=0)
    int8 = alone(texts, batch_size=len(texts), return_margin=True)
    assert {out["scored_by"] for out in int8} == {"int8"}
    # the threshold put between PyTorch's margin and int8's on the row where they differ most: int8 alone decides
    # that row otherwise than PyTorch
    shifts = [abs(a["margin"] - b["margin"]) for a, b in zip(int8, expected)]
    row = max(range(len(texts)), key=shifts.__getitem__)
    assert shifts[row] > 5e-5  # int8 rounding moved it, float32 (below 1e-6) does not
    threshold = (int8[row]["margin"] + expected[row]["margin"]) / 2
    torch_at = pipeline("deferral", model=str(torch_folder))(texts, batch_size=len(texts), defer_threshold=threshold)
    int8_at = alone(texts, batch_size=len(texts), defer_threshold=threshold)
    assert int8_at[row]["defer"] != torch_at[row]["defer"]
    # the fallback: a tolerance just wider than that row's distance from the threshold re-scores it in float32
    tolerance = shifts[row] / 2 + 1e-6
    fallback = onnx_pipeline(tmp_path / "int8", fallback_tolerance=tolerance)
    got = fallback(texts, batch_size=len(texts), defer_threshold=threshold, return_margin=True)
    assert got[row]["scored_by"] == "float32"
    assert (got[row]["label"], got[row]["expert"]) == (torch_at[row]["label"], torch_at[row]["expert"])
    assert got[row]["margin"] == pytest.approx(expected[row]["margin"], abs=1e-6)  # float32's, not int8's
    # the other rows: re-scored exactly where their int8 decision gap (at the call's threshold) is below the tolerance
    # (one batch, as the pipeline's: int8 quantizes the activations over the batch, so the batch is part of the input)
    model = fallback.model
    logits = alone.model(**dict(BertTokenizer.from_pretrained(tmp_path / "int8")(texts, padding=True,
                                                                               return_tensors="pt"))).logits
    near = decision_gap(model.surrogate, logits, defer_threshold=threshold) < tolerance
    assert [out["scored_by"] == "float32" for out in got] == near.tolist()
    assert "int8" in {out["scored_by"] for out in got}
    for out, want in zip(got, expected):
        if out["scored_by"] == "float32":
            assert out["margin"] == pytest.approx(want["margin"], abs=1e-6)
    # the model's own output says the same, for its config's threshold
    output = model(**dict(BertTokenizer.from_pretrained(tmp_path / "int8")(texts, padding=True, return_tensors="pt")))
    assert output.rescored.tolist() == (decision_gap(model.surrogate, logits) < tolerance).tolist()


def test_hf_defer_serve_routes_with_the_int8_router_and_its_fallback_as_pytorch(tmp_path):
    pytest.importorskip("fastapi")
    from hf_defer.commands.serve import build_app

    router = save_tiny_router(tmp_path)
    export_onnx(router, tmp_path / "router-int8", quantize="int8")  # fallback below a decision gap of 0.05
    urls = ["--model", "weak=http://127.0.0.1:9/v1", "--model", "strong=http://127.0.0.1:9/v1"]
    app, _ = build_app(["--router", str(tmp_path / "router-int8"), "--backend", "onnx", *urls])
    model = app.state.router.pipeline.model
    assert model.quantized and model.fallback_tolerance == 0.05
    decisions = app.state.router.decide(PROMPTS)
    threshold = app.state.router.defer_threshold
    margins = margins_by_forward(router, PROMPTS)  # PyTorch's
    assert [out["expert"] for out in decisions] == ["strong" if m > threshold else "weak" for m in margins]
    distance = [abs(m - threshold) for m in margins]
    assert min(distance) < 0.04 and max(distance) > 0.06  # both paths taken
    for out, margin, far in zip(decisions, margins, distance):
        if far < 0.04:  # near the boundary: float32, PyTorch's margin
            assert out["scored_by"] == "float32" and out["margin"] == pytest.approx(margin, abs=1e-5)
        elif far > 0.06:
            assert out["scored_by"] == "int8"


def test_hf_defer_predict_with_an_int8_export_says_which_graph_scored_each_row(folders, tmp_path):
    torch_folder, _ = folders
    export_onnx(torch_folder, tmp_path / "int8", quantize="int8", fallback_tolerance=0.2)  # some rows near, some not
    pd.DataFrame({"text": TEXTS}).to_csv(tmp_path / "in.csv", index=False)
    assert hf_defer_main(["predict", "--model", str(tmp_path / "int8"), "--input", str(tmp_path / "in.csv"),
                          "--backend", "onnx", "--output", str(tmp_path / "out.csv"),
                          "--batch_size", str(len(TEXTS))]) == 0
    got = pd.read_csv(tmp_path / "out.csv")
    assert got.columns[-1] == "scored_by"  # after the columns of a float32 or PyTorch file, which have none
    expected = onnx_pipeline(tmp_path / "int8")(TEXTS, batch_size=len(TEXTS))
    assert got["scored_by"].tolist() == [out["scored_by"] for out in expected]
    assert got["label"].tolist() == [out["label"] for out in expected]
    assert set(got["scored_by"]) == {"int8", "float32"}  # both paths taken on these six texts
