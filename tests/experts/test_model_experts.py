"""Experts that are models: expert labels from a pipeline, a model and a callable (cached), clear errors, and the
deferral pipeline calling only the routed predictor on only the routed inputs."""

from __future__ import annotations

from unittest import mock

import datasets
import pytest
import torch
from transformers import (BertConfig, BertForSequenceClassification, BertTokenizer, LlamaConfig,
                          LlamaForSequenceClassification, pipeline)

from hf_defer import DeferralConfig, EncoderForDeferral
from hf_defer.experts import model_expert
from hf_defer.experts.model_experts import answers_to_ids, predictor_identity

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat dog sat on mat is good bad very".split()]
TEXTS = ["the cat is good", "a dog sat", "very bad", "the mat", "good dog", "bad cat sat on the mat", "a", "very good"]
CLASSES = ["neg", "pos"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def text_dataset() -> datasets.Dataset:
    features = datasets.Features({"text": datasets.Value("string"), "labels": datasets.ClassLabel(names=CLASSES)})
    return datasets.Dataset.from_dict({"text": TEXTS, "labels": [1, 1, 0, 0, 1, 0, 0, 1]}, features=features)


def tiny_classifier() -> tuple[BertForSequenceClassification, BertTokenizer, list[int]]:
    """A random 2-class BERT whose classes are named like the dataset's, its tokenizer, and its answers one by one."""
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                        vocab_size=len(WORDS), num_labels=2, id2label=dict(enumerate(CLASSES)))
    model = BertForSequenceClassification(config).eval()
    tokenizer = BertTokenizer(vocab={word: i for i, word in enumerate(WORDS)})
    with torch.no_grad():
        alone = [int(model(**tokenizer(text, return_tensors="pt")).logits.argmax()) for text in TEXTS]
    return model, tokenizer, alone


def count_forwards(model: torch.nn.Module) -> list[int]:
    calls: list[int] = []
    model.register_forward_hook(lambda module, args, kwargs, output: calls.append(1), with_kwargs=True)
    return calls


def test_expert_labels_from_a_callable_are_cached(tmp_path):
    calls = mock.Mock(side_effect=lambda texts: ["pos" if "good" in t else 0 for t in texts])  # names or ids
    ds = model_expert(text_dataset(), calls, batch_size=3, predictor_id="keyword-v1", cache_dir=tmp_path)
    assert ds["expert_labels"][:] == [1 if "good" in t else 0 for t in TEXTS]
    assert calls.call_count == 3 and [len(c.args[0]) for c in calls.call_args_list] == [3, 3, 2]
    again = model_expert(text_dataset(), calls, batch_size=3, predictor_id="keyword-v1", cache_dir=tmp_path)
    assert calls.call_count == 3  # a cache hit: same data fingerprint, same predictor identity
    assert again["expert_labels"][:] == ds["expert_labels"][:]
    model_expert(text_dataset(), calls, batch_size=3, predictor_id="keyword-v2", cache_dir=tmp_path)
    assert calls.call_count == 6  # another predictor: computed again
    other = text_dataset().select([0, 1])
    model_expert(other, calls, batch_size=3, predictor_id="keyword-v1", cache_dir=tmp_path)
    assert calls.call_count == 7  # other data: computed again


def test_expert_labels_from_a_model_with_its_tokenizer(tmp_path):
    model, tokenizer, alone = tiny_classifier()
    forwards = count_forwards(model)
    ds = model_expert(text_dataset(), model, tokenizer=tokenizer, column="bert", batch_size=4, cache_dir=tmp_path)
    assert ds["bert"][:] == alone and len(forwards) == 2
    assert model_expert(text_dataset(), model, tokenizer=tokenizer, column="bert", batch_size=4,
                        cache_dir=tmp_path)["bert"][:] == alone
    assert len(forwards) == 2  # cache hit, keyed by a hash of the weights
    with torch.no_grad():
        model.classifier.bias.add_(1.0)
    model_expert(text_dataset(), model, tokenizer=tokenizer, column="bert", batch_size=4, cache_dir=tmp_path)
    assert len(forwards) == 4  # new weights: a new key
    with pytest.raises(ValueError, match="needs its tokenizer"):
        model_expert(text_dataset(), model, cache_dir=tmp_path)


def test_predictor_identity_covers_the_head_of_a_model_whose_backbone_is_called_model():
    # LlamaForSequenceClassification keeps its backbone in `.model` and its head in `.score`: a new head is a new key
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=2, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    before = predictor_identity(model)
    with torch.no_grad():
        model.score.weight.add_(1.0)
    assert predictor_identity(model) != before
    assert predictor_identity(model) == predictor_identity(model)


def test_expert_labels_from_a_pipeline(tmp_path):
    model, tokenizer, alone = tiny_classifier()
    model.config.id2label = {0: "LABEL_0", 1: "LABEL_1"}  # transformers' default names map to class ids
    forwards = count_forwards(model)
    classifier = pipeline("text-classification", model=model, tokenizer=tokenizer)
    ds = model_expert(text_dataset(), classifier, batch_size=8, cache_dir=tmp_path)
    assert ds["expert_labels"][:] == alone
    calls = len(forwards)
    assert calls >= 1
    model_expert(text_dataset(), classifier, batch_size=8, cache_dir=tmp_path)
    assert len(forwards) == calls  # cache hit
    # A label map from the predictor's names to the dataset's: every answer flipped.
    flipped = model_expert(text_dataset(), classifier, label_map={"LABEL_0": "pos", "LABEL_1": "neg"},
                           cache_dir=tmp_path)
    assert flipped["expert_labels"][:] == [1 - a for a in alone]


def test_predictor_errors_name_the_expert_and_the_first_bad_row(tmp_path):
    ds = text_dataset()
    with pytest.raises(ValueError, match=r"expert 'gpt' answered 'maybe' for row 3, which is not a label.*neg"):
        model_expert(ds, lambda texts: ["maybe" if "mat" in t else "neg" for t in texts], name="gpt",
                     predictor_id="a", cache_dir=tmp_path, batch_size=4)
    with pytest.raises(ValueError, match=r"expert 'gpt' must return one answer per input: the batch starting at row 4 "
                                         r"has 4 inputs, the expert returned 3"):
        model_expert(ds, lambda texts: [0] * min(len(texts), 3) if "good dog" in texts else [0] * len(texts),
                     name="gpt", predictor_id="b", cache_dir=tmp_path, batch_size=4)

    def broken(texts):
        raise ConnectionError("the API is down")

    with pytest.raises(RuntimeError, match=r"expert 'gpt' failed on the batch starting at row 0: ConnectionError"):
        model_expert(ds, broken, name="gpt", predictor_id="c", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="ClassLabel"):
        model_expert(ds.cast_column("labels", datasets.Value("int64")), broken, predictor_id="d", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="input_column"):
        model_expert(ds, broken, input_column="tweet", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="for row 1"):
        answers_to_ids(["neg", 2], {"neg": 0, "pos": 1}, "x")
    with pytest.raises(ValueError, match="for row 1"):
        answers_to_ids(["neg", True], {"neg": 0, "pos": 1}, "x")


# ------------------------------------------------------------------ the pipeline runs model experts
def routing_model() -> EncoderForDeferral:
    """A-SM, K = 2, M = 2 (big, person), logits (0, 0, 5 x0, 5 x1): both classes at 0.5, expert j's accuracy
    e^{5 x_j} / (e^{5 x_j} + 1) > 0.5 iff x_j > 0, so an input goes to the expert with the larger positive x_j."""
    model = EncoderForDeferral(DeferralConfig(feature_size=2, num_labels=2, num_experts=2, id2label={0: "a", 1: "b"},
                                              expert_names=["big", "person"], expert_kinds=["model", "person"],
                                              expert_costs=[0.01, 0.02]))
    with torch.no_grad():
        model.head[-1].weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 0.0], [5.0, 0.0], [0.0, 5.0]]))
        model.head[-1].bias.zero_()
    return model.eval()


def test_pipeline_calls_only_the_routed_predictor_on_only_the_routed_inputs():
    inputs = [[1.0, -1.0], [-1.0, -1.0], [0.5, 1.0], [2.0, 0.1], [-1.0, 0.0], [0.3, -2.0], [0.9, 0.2]]
    routed_big = [0, 3, 5, 6]  # x0 > 0 and (x0 - 0.01 cost) beats x1's expert
    big = mock.Mock(side_effect=lambda batch: ["b"] * len(batch))
    classify = pipeline("deferral", model=routing_model(), experts={"big": big}, batch_size=3)
    plain = pipeline("deferral", model=routing_model())(inputs)
    assert [i for i, out in enumerate(plain) if out["expert"] == "big"] == routed_big
    outputs = classify(inputs)
    seen = [row for call in big.call_args_list for row in call.args[0]]
    assert [list(map(float, row)) for row in seen] == [inputs[i] for i in routed_big]
    assert big.call_count == 2  # batches of 3: 3 + 1
    for i, (out, before) in enumerate(zip(outputs, plain)):
        assert out["defer"] == before["defer"] and out["expert"] == before["expert"]
        if i in routed_big:
            assert out["label"] == "b" and out["answered_by"] == "big" and out["cost"] == 0.01
        elif before["defer"]:  # the person: as today, with the cost that will be paid
            assert out["label"] == "defer" and out["expert"] == "person" and out["answered_by"] is None
            assert out["cost"] == 0.02
        else:
            assert out["label"] == before["label"] and out["answered_by"] == "classifier" and out["cost"] == 0.0
    big.reset_mock()
    kept = classify([[-1.0, -1.0], [-2.0, 0.0]])
    assert big.call_count == 0 and [out["answered_by"] for out in kept] == ["classifier", "classifier"]
    single = classify([1.0, -1.0], expert_costs=[0.0, 0.0])  # one input; the call's costs override the config's
    assert single["answered_by"] == "big" and single["cost"] == 0.0 and big.call_count == 1
    # Two model experts: each is called on its own routed inputs only, and not at all when none is routed to it.
    big.reset_mock()
    other = mock.Mock(side_effect=lambda batch: ["a"] * len(batch))
    both = pipeline("deferral", model=routing_model(), experts={"big": big, "person": other})
    both([inputs[i] for i in routed_big])
    assert other.call_count == 0 and big.call_count == 1
    routed_person = [i for i, out in enumerate(plain) if out["expert"] == "person"]
    outputs = both(inputs)
    assert [list(map(float, row)) for row in other.call_args.args[0]] == [inputs[i] for i in routed_person]
    assert [outputs[i]["answered_by"] for i in routed_person] == ["person"] * len(routed_person)


def test_pipeline_model_expert_from_a_model_and_errors():
    with pytest.raises(ValueError, match=r"not in config.expert_names"):
        pipeline("deferral", model=routing_model(), experts={"gpt": lambda batch: batch})
    bad = pipeline("deferral", model=routing_model(), experts={"big": lambda batch: ["c"] * len(batch)})
    with pytest.raises(ValueError, match=r"expert 'big' answered 'c' for row 1"):
        bad([[-1.0, -1.0], [1.0, -1.0]])
    # A text deferral model that defers everything (expert logit 5, class logits 0) to a (model, tokenizer) expert,
    # whose class names are the deferral model's: each text gets the expert's own answer.
    classifier, tokenizer, alone = tiny_classifier()
    encoder = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                         vocab_size=len(WORDS))
    deferrer = EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=2, id2label=dict(enumerate(CLASSES)),
                                                 expert_names=["bert"], expert_kinds=["model"]))
    with torch.no_grad():
        deferrer.head[-1].weight.zero_()
        deferrer.head[-1].bias.copy_(torch.tensor([0.0, 0.0, 5.0]))
    defer = pipeline("deferral", model=deferrer.eval(), tokenizer=tokenizer, experts={"bert": (classifier, tokenizer)})
    outputs = defer(TEXTS)
    assert [out["label"] for out in outputs] == [CLASSES[a] for a in alone]
    assert {out["answered_by"] for out in outputs} == {"bert"}
