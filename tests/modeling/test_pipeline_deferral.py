"""pipeline("deferral"): decisions against hand computations, costs, thresholds, batching, inputs, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import BertConfig, BertModel, BertTokenizer, pipeline

import hf_defer  # noqa: F401  (registers the "deferral" task)
from hf_defer import DeferralConfig, EncoderForDeferral
from hf_defer.modeling.pipeline_deferral import DeferralPipeline

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat dog sat on mat is good bad very".split()]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def fixed_logit_model(logits: list[float], num_labels: int, surrogate: str = "asm", feature_size: int = 4,
                      **config) -> EncoderForDeferral:
    """A head-only model whose logits are `logits` whatever the features (zero weights, bias = logits)."""
    model = EncoderForDeferral(DeferralConfig(feature_size=feature_size, num_labels=num_labels,
                                              num_experts=len(logits) - num_labels, surrogate=surrogate, **config))
    with torch.no_grad():
        model.head[-1].weight.zero_()
        model.head[-1].bias.copy_(torch.tensor(logits))
    return model.eval()


def sigmoid(t: float) -> float:
    return 1.0 / (1.0 + math.exp(-t))


# K = 3 classes, M = 2 experts, A-SM. Hand computation:
#   class probs = softmax(1, 0, 0) -> top class 0 with e / (e + 2) = 0.57612
#   expert j accuracy = e^{u_j} / (e^{u_j} + e^0 + e^0)  (the classes other than y* = 0)
#     alice: e^2 / (e^2 + 2) = 0.78699, bob: e^0.5 / (e^0.5 + 2) = 0.45186
LOGITS = [1.0, 0.0, 0.0, 2.0, 0.5]
P_TOP = math.e / (math.e + 2)
ACC = [math.exp(2) / (math.exp(2) + 2), math.exp(0.5) / (math.exp(0.5) + 2)]
NAMES = {"id2label": {0: "hate", 1: "offensive", 2: "neither"}, "expert_names": ["alice", "bob"]}


def test_zero_cost_decision_matches_a_hand_computation():
    classify = pipeline("deferral", model=fixed_logit_model(LOGITS, 3, **NAMES))
    out = classify([0.3, -1.0, 2.0, 0.5])
    assert out["class_label"] == "hate" and out["class_score"] == pytest.approx(P_TOP, abs=1e-6)
    assert out["expert_accuracy"] == pytest.approx(ACC, abs=1e-6)
    assert out["defer"] is True and out["label"] == "defer" and out["expert"] == "alice"
    p_other = 1 / (math.e + 2)
    assert out["scores"] == pytest.approx({"hate": P_TOP, "offensive": p_other, "neither": p_other}, abs=1e-6)
    assert list(out["scores"])[0] == "hate"


def test_expert_costs_flip_the_decision_and_the_chosen_expert():
    classify = pipeline("deferral", model=fixed_logit_model(LOGITS, 3, **NAMES))
    features = [0.0, 0.0, 0.0, 0.0]
    # alice's gain 0.78699 - 0.3 = 0.48699 and bob's 0.45186 are both below the top class probability 0.57612.
    out = classify(features, expert_costs=[0.3, 0.0])
    assert out["defer"] is False and out["label"] == "hate" and out["expert"] is None
    # Alice costs 0.4: her gain 0.38699 falls below bob's 0.45186, so with margin -0.2 (0.45186 - 0.57612 = -0.124
    # > -0.2) bob gets it.
    out = classify(features, expert_costs=[0.4, 0.0], defer_threshold=-0.2)
    assert out["defer"] is True and out["expert"] == "bob"
    assert classify(features, expert_costs=np.array([0.3, 0.0]))["defer"] is False
    assert classify(features, expert_costs=torch.tensor([0.4, 0.0]), defer_threshold=-0.2)["expert"] == "bob"


def test_threshold_is_a_margin_on_probabilities_and_defaults_to_the_config():
    model = fixed_logit_model(LOGITS, 3, **NAMES)
    classify = pipeline("deferral", model=model)
    margin = ACC[0] - P_TOP  # 0.21087
    assert classify([0.0] * 4, defer_threshold=margin - 1e-3)["defer"] is True
    assert classify([0.0] * 4, defer_threshold=margin + 1e-3)["defer"] is False
    model.config.defer_threshold = margin + 1e-3  # what calibrate_deferral writes; read at call time
    assert classify([0.0] * 4)["defer"] is False
    assert classify([0.0] * 4, defer_threshold=0.0)["defer"] is True


def test_pipeline_and_model_agree_where_clipped_estimates_tie():
    # S-OvA with u = (1, -3 | 1.5): the expert logit beats every class logit, so the logit rule defers. Clipped, the
    # estimates tie (class 0: min(1, sigmoid(1)(1 + e^1.5)) = 1, the expert: min(1, e^1.5) = 1); unclipped, the
    # margin is e^1.5 - sigmoid(1)(1 + e^1.5) = (e^1.5 - e^1) / (1 + e^1) > 0. One rule: the pipeline defers too.
    model = fixed_logit_model([1.0, -3.0, 1.5], 2, surrogate="sova")
    assert bool(model(features=torch.zeros(1, 4)).defer[0]) is True
    out = pipeline("deferral", model=model)([0.0] * 4, return_margin=True)
    assert out["class_score"] == 1.0 and out["expert_accuracy"] == [1.0]
    assert out["scores"]["LABEL_1"] == pytest.approx(sigmoid(-3.0) * (1 + math.exp(1.5)), abs=1e-6)
    assert out["margin"] == pytest.approx((math.exp(1.5) - math.exp(1.0)) / (1 + math.exp(1.0)), rel=1e-5)
    assert out["defer"] is True and out["label"] == "defer"


def test_top_k_limits_and_sorts_scores():
    classify = pipeline("deferral", model=fixed_logit_model([0.0, 2.0, 1.0, 0.0], 3))
    out = classify([0.0] * 4, top_k=2)
    assert list(out["scores"]) == ["LABEL_1", "LABEL_2"]
    z = 1 + math.exp(2) + math.exp(1)
    assert out["scores"]["LABEL_2"] == pytest.approx(math.exp(1) / z, abs=1e-6)
    assert len(classify([0.0] * 4, top_k=None)["scores"]) == 3


def test_batches_of_feature_vectors_match_single_calls():
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=3, num_experts=2)).eval()
    classify = pipeline("deferral", model=model)
    batch = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    singles = [classify(row.tolist()) for row in batch]
    for result in (classify(batch, batch_size=2), classify(list(batch), batch_size=3), classify(torch.tensor(batch))):
        assert len(result) == 5
        for got, want in zip(result, singles):
            assert got["label"] == want["label"]
            assert got["expert_accuracy"] == pytest.approx(want["expert_accuracy"], abs=1e-6)
    with torch.no_grad():
        expected = model(features=torch.tensor(batch, device=model.device)).class_probs.max(dim=1).values.cpu()
    assert [s["class_score"] for s in singles] == pytest.approx(expected.tolist(), abs=1e-6)
    assert classify({"features": batch[0]})["class_score"] == pytest.approx(singles[0]["class_score"])


def tiny_text_model(num_experts: int = 1) -> tuple[EncoderForDeferral, BertTokenizer]:
    torch.manual_seed(0)
    encoder = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                         vocab_size=len(WORDS))
    model = EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=3, num_experts=num_experts, pooling="mean"))
    return model.eval(), BertTokenizer(vocab={word: i for i, word in enumerate(WORDS)})


def test_text_inputs_pairs_batching_and_truncation():
    model, tokenizer = tiny_text_model()
    classify = pipeline("deferral", model=model, tokenizer=tokenizer)
    texts = ["the cat sat on the mat", "a dog", "the very bad dog is good"]

    def by_hand(**encoded) -> float:
        with torch.no_grad():
            return float(model(**tokenizer(**encoded, return_tensors="pt")).class_probs.max())

    singles = [classify(text) for text in texts]
    assert [s["class_score"] for s in singles] == pytest.approx([by_hand(text=t) for t in texts], abs=1e-5)
    batched = classify(texts, batch_size=2)
    assert [b["class_score"] for b in batched] == pytest.approx([s["class_score"] for s in singles], abs=1e-5)
    column = Dataset.from_dict({"text": texts})["text"]  # a datasets Column, not a list
    assert [c["class_score"] for c in classify(column)] == pytest.approx([s["class_score"] for s in singles], abs=1e-5)
    pair = classify({"text": "the cat", "text_pair": "a dog"})
    assert pair["class_score"] == pytest.approx(by_hand(text="the cat", text_pair="a dog"), abs=1e-5)
    assert len(classify([{"text": "the cat", "text_pair": "a dog"}, {"text": "a mat"}])) == 2
    short = classify(texts[0], truncation=True, max_length=4)
    assert short["class_score"] == pytest.approx(by_hand(text=texts[0], truncation=True, max_length=4), abs=1e-5)
    assert short["class_score"] != pytest.approx(singles[0]["class_score"], abs=1e-6)


def test_image_inputs_use_the_image_processor():
    from PIL import Image
    from transformers import ViTConfig, ViTImageProcessor

    torch.manual_seed(0)
    encoder = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                        image_size=16, patch_size=8)
    model = EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=2)).eval()
    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    classify = pipeline("deferral", model=model, image_processor=processor)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)) for _ in range(3)]
    with torch.no_grad():
        expected = model(pixel_values=processor(images, return_tensors="pt")["pixel_values"]).expert_accuracy[:, 0]
    got = classify(images, batch_size=2)
    assert [g["expert_accuracy"][0] for g in got] == pytest.approx(expected.tolist(), abs=1e-5)
    assert classify(images[0])["expert_accuracy"][0] == pytest.approx(float(expected[0]), abs=1e-5)


def test_bad_inputs_and_parameters_raise_clear_errors():
    classify = pipeline("deferral", model=fixed_logit_model(LOGITS, 3, **NAMES))
    with pytest.raises(ValueError, match="expert_costs must have one cost per expert"):
        classify([0.0] * 4, expert_costs=[0.1])
    with pytest.raises(TypeError, match="expert_costs must be a sequence"):
        classify([0.0] * 4, expert_costs="0.1")
    with pytest.raises(ValueError, match="expert_costs must be finite, non-negative"):
        classify([0.0] * 4, expert_costs=[0.1, float("nan")])
    with pytest.raises(ValueError, match="expert_costs must be finite, non-negative"):
        classify([0.0] * 4, expert_costs=[0.1, -0.4])
    with pytest.raises(ValueError, match="empty batch"):
        classify([])
    with pytest.raises(TypeError, match="feature vectors"):
        classify("some text")
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        classify([0.0, 1.0])
    with pytest.raises(ValueError, match="top_k"):
        classify([0.0] * 4, top_k=0)
    with pytest.raises(ValueError, match="defer_threshold"):
        classify([0.0] * 4, defer_threshold=float("inf"))

    model, tokenizer = tiny_text_model()
    text_pipe = pipeline("deferral", model=model, tokenizer=tokenizer)
    with pytest.raises(TypeError, match="must be str"):
        text_pipe(42)
    with pytest.raises(ValueError, match="text_pair"):
        text_pipe({"sentence": "the cat"})
    with pytest.raises(ValueError, match="tokenizer"):
        DeferralPipeline(model=model)


def test_non_deferral_model_is_rejected(tmp_path):
    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                                vocab_size=len(WORDS)))
    with pytest.raises(ValueError, match="needs a deferral model"):
        DeferralPipeline(model=bert)
    bert.save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match="needs a deferral model"):
        pipeline("deferral", model=str(tmp_path / "bert"))


# ---------------------------------------------------------------------------------------------------- issue 11
# Every option is recognised or refused with the list of valid ones (they used to be dropped in silence: a
# misspelled expert_costs left the costs out and changed the answer).


@pytest.mark.parametrize(
    ("option", "hint"),
    [("expert_cost", "Did you mean 'expert_costs' for 'expert_cost'?"), ("costs", ""), ("foo", ""),
     ("return_all_scores", ""), ("defer_treshold", "Did you mean 'defer_threshold'"),
     ("return_tensors", ""), ("return_overflowing_tokens", "")],
)
def test_unknown_options_are_refused_with_the_valid_ones(option, hint):
    model, tokenizer = tiny_text_model(num_experts=2)
    classify = pipeline("deferral", model=model, tokenizer=tokenizer)
    with pytest.raises(TypeError, match=rf"unknown option\(s\) \['{option}'\]\.") as error:
        classify("the cat", **{option: 1})
    assert hint in str(error.value)
    for valid in ("'expert_costs'", "'defer_threshold'", "'top_k'", "'batch_size'", "'truncation'", "'max_length'",
                  "'padding'", "BertTokenizer"):
        assert valid in str(error.value)
    with pytest.raises(TypeError, match=rf"unknown option\(s\) \['{option}'\]"):  # at construction as well
        pipeline("deferral", model=model, tokenizer=tokenizer, **{option: 1})


def test_head_only_and_image_pipelines_refuse_unknown_options_too():
    classify = pipeline("deferral", model=fixed_logit_model(LOGITS, 3, **NAMES))
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['truncation'\].*head-only model takes no tokenizer"):
        classify([0.0] * 4, truncation=True)
    from transformers import ViTConfig, ViTImageProcessor

    encoder = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                        image_size=16, patch_size=8)
    model = EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=2)).eval()
    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['truncation'\].*'do_resize'"):
        pipeline("deferral", model=model, image_processor=processor, truncation=True)
    pipeline("deferral", model=model, image_processor=processor, do_normalize=False)  # a valid one


def test_tokenizer_options_pass_and_max_length_needs_truncation_or_padding():
    """max_length alone is ambiguous (the tokenizer would guess 'longest_first' truncation with a warning): refused."""
    model, tokenizer = tiny_text_model()
    classify = pipeline("deferral", model=model, tokenizer=tokenizer)
    text = "the cat sat on the mat"
    with pytest.raises(ValueError, match="max_length=4 was given without truncation or padding: pass truncation=True"):
        classify(text, max_length=4)
    cut = classify(text, max_length=4, truncation=True)["class_score"]
    assert cut != pytest.approx(classify(text)["class_score"], abs=1e-6)
    padded = classify("a dog", max_length=12, padding="max_length")["class_score"]  # mean pooling ignores the padding
    assert padded == pytest.approx(classify("a dog")["class_score"], abs=1e-5)
    built = pipeline("deferral", model=model, tokenizer=tokenizer, truncation=True)  # truncation given at construction
    assert built(text, max_length=4)["class_score"] == pytest.approx(cut, abs=1e-6)
    assert classify(text, add_special_tokens=False, padding_side="left")["label"]  # other tokenizer options pass


def test_over_long_text_without_truncation_names_the_fix():
    model, tokenizer = tiny_text_model()
    model.encoder.embeddings.position_embeddings = torch.nn.Embedding(8, 32)  # an 8-position encoder
    classify = pipeline("deferral", model=model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"input_ids has 11 tokens per row, more than the 8 positions.*truncation=True"):
        classify("the cat sat on the mat is very good")
    assert classify("the cat sat on the mat is very good", truncation=True, max_length=8)["label"]


@pytest.mark.parametrize("device", [0, "cuda", "cuda:3", torch.device("cuda", 1), "mps"])
def test_a_device_the_machine_lacks_is_an_error(device):
    """device=0 without a GPU used to run on the CPU without a word."""
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator")
    model = fixed_logit_model(LOGITS, 3, **NAMES)
    with pytest.raises(ValueError, match=r"device=.*(has none|not available).*pass device='cpu'"):
        pipeline("deferral", model=model, device=device)
    for fine in ("cpu", -1, torch.device("cpu"), None):
        assert pipeline("deferral", model=model, device=fine).device.type == "cpu"
    with pytest.raises(ValueError, match="device must name a device"):
        pipeline("deferral", model=model, device="gpu0")
    with pytest.raises(TypeError, match="device must be"):
        pipeline("deferral", model=model, device=1.5)


def test_numpy_integer_top_k():
    out = pipeline("deferral", model=fixed_logit_model(LOGITS, 3, **NAMES))([0.0] * 4, top_k=np.int64(2))
    assert list(out["scores"]) == ["hate", "offensive"]


@pytest.mark.parametrize(("option", "value"), [("batch_size", 0), ("batch_size", False), ("num_workers", -1)])
def test_loader_options_are_checked(option, value):
    model = fixed_logit_model(LOGITS, 3, **NAMES)
    with pytest.raises(ValueError, match=rf"{option} must be an integer >= "):
        pipeline("deferral", model=model)([[0.0] * 4] * 2, **{option: value})
    with pytest.raises(ValueError, match=rf"{option} must be an integer >= "):
        pipeline("deferral", model=model, **{option: value})


def test_a_call_off_the_calibrated_costs_or_threshold_warns_and_every_output_says_what_decided():
    # Issue 41: a threshold calibrated at costs [0, 0] and a call with `expert_costs=[0, 0.1]` moved every decision,
    # silently (only a model with a guarantee warned).
    import warnings

    model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2, num_experts=2))
    held_out = list(np.random.default_rng(0).normal(size=(40, 4)).astype("float32"))
    defer = pipeline("deferral", model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # never calibrated: costs are the Bayes rule's own, nothing to warn about
        out = defer(held_out[0], expert_costs=[0.0, 0.1])
    assert (out["expert_costs"], out["defer_threshold"]) == ([0.0, 0.1], 0.0)
    threshold = hf_defer.calibrate_deferral(model, held_out, max_deferral_rate=0.2)
    assert model.config.calibrated_expert_costs == [0.0, 0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the settings it was calibrated for: quiet
        out = defer(held_out[0])
    assert (out["expert_costs"], out["defer_threshold"]) == ([0.0, 0.0], threshold)
    with pytest.warns(UserWarning, match=r"expert_costs \[0.0, 0.1\] \(calibrated at \[0.0, 0.0\]\)"):
        assert defer(held_out[0], expert_costs=[0.0, 0.1])["expert_costs"] == [0.0, 0.1]
    with pytest.warns(UserWarning, match=r"defer_threshold 0.5 \(calibrated: "):
        assert defer(held_out[0], defer_threshold=0.5)["defer_threshold"] == 0.5
    model.config.expert_costs = [0.2, 0.0]  # changed in the config after calibrating: the same shift, warned
    with pytest.warns(UserWarning, match="was calibrated for other settings"):
        defer(held_out[0])
    hf_defer.calibrate_deferral(model, held_out, max_deferral_rate=0.2, expert_costs=[0.2, 0.0])
    assert model.config.calibrated_expert_costs == [0.2, 0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        defer(held_out[0])
