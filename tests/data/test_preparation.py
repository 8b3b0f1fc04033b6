"""prepare_deferral_dataset: names through one label2id, missing annotations, inputs, the errors; and what the
trainer accepts of such data (`label`, untokenized text, NaN features)."""

from __future__ import annotations

import doctest
import logging

import datasets
import numpy as np
import pytest
import torch
from transformers import BertConfig, BertTokenizer, TrainingArguments, ViTConfig, ViTImageProcessor, pipeline

import hf_defer
import hf_defer.data.preparation as preparation_module
from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral, prepare_deferral_dataset

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"good bad fine movie plot".split()]


def reviews() -> datasets.DatasetDict:
    train = datasets.Dataset.from_dict({
        "review": ["good movie", "bad plot", "fine", "good plot", "bad movie"],
        "label": ["pos", "neg", "neutral", "pos", "neg"],
        "alice": ["pos", "neg", None, "pos", "pos"],
        "bob": ["neg", "neg", "neutral", None, "neg"],
        "other": [1, 2, 3, 4, 5],
    })
    test = datasets.Dataset.from_dict({
        "review": ["fine movie", "bad"], "label": ["neutral", "neg"], "alice": ["neutral", "neg"],
        "bob": ["pos", "neg"], "other": [0, 0],
    })
    return datasets.DatasetDict({"train": train, "test": test})


def tokenizer() -> BertTokenizer:
    return BertTokenizer(vocab={word: i for i, word in enumerate(WORDS)})


def test_string_labels_and_two_annotators_map_through_one_label2id_and_drop_logs_per_split(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_defer.data.preparation"):
        prepared = prepare_deferral_dataset(reviews(), "label", ["alice", "bob"], text_column="review",
                                            missing_expert="drop")
    assert prepared.id2label == {0: "neg", 1: "neutral", 2: "pos"}  # sorted names
    assert prepared.label2id == {"neg": 0, "neutral": 1, "pos": 2}
    assert prepared.expert_names == ["alice", "bob"]
    train, test = prepared.dataset["train"], prepared.dataset["test"]
    assert train.column_names == ["text", "labels", "expert_labels"]  # 'other' dropped, 'review' renamed
    assert train["text"][:] == ["good movie", "bad plot", "bad movie"]  # rows 2 and 3 miss an annotation
    assert train["labels"][:] == [2, 0, 0]
    assert train["expert_labels"][:] == [[2, 0], [0, 0], [2, 0]]
    assert train.features["labels"].names == ["neg", "neutral", "pos"]
    assert test["expert_labels"][:] == [[1, 2], [0, 0]]
    messages = [record.getMessage() for record in caplog.records]
    assert any("dropped 2 of 5 rows of split 'train'" in message for message in messages)
    assert not any("'test'" in message for message in messages)
    assert prepared.model_kwargs() == {"num_labels": 3, "num_experts": 2, "id2label": prepared.id2label,
                                       "expert_names": ["alice", "bob"]}


def test_missing_annotation_is_an_error_naming_column_and_row_by_default():
    with pytest.raises(ValueError, match=r"expert column 'alice' of split 'train', row 2: .*missing.*2 row\(s\)"):
        prepare_deferral_dataset(reviews(), "label", ["alice", "bob"], text_column="review")


@pytest.mark.parametrize("missing", [None, -1, float("nan")])
def test_every_kind_of_missing_annotation_is_recognised(missing):
    data = datasets.Dataset.from_dict({"label": [0, 1, 1], "expert": [0, missing, 1]})
    prepared = prepare_deferral_dataset(data, "label", "expert", missing_expert="drop")
    assert prepared.dataset["expert_labels"][:] == [0, 1] and prepared.dataset["labels"][:] == [0, 1]
    assert prepared.id2label == {0: "0", 1: "1"}


def test_classlabel_keeps_its_names_and_experts_answer_with_names_or_ids():
    features = datasets.Features({"labels": datasets.ClassLabel(names=["cat", "dog", "bird"]),
                                  "by_name": datasets.Value("string"),
                                  "by_id": datasets.ClassLabel(names=["cat", "dog", "bird"])})
    data = datasets.Dataset.from_dict({"labels": [0, 2, 1], "by_name": ["bird", "dog", "cat"], "by_id": [1, 1, 2]},
                                      features=features)
    prepared = prepare_deferral_dataset(data, "labels", ["by_name", "by_id"])
    assert prepared.id2label == {0: "cat", 1: "dog", 2: "bird"}
    assert prepared.dataset["expert_labels"][:] == [[2, 1], [1, 1], [0, 2]]
    reordered = prepare_deferral_dataset(data, "labels", ["by_name"], label_names=["bird", "cat", "dog"])
    assert reordered.dataset["labels"][:] == [1, 0, 2] and reordered.dataset["expert_labels"][:] == [0, 2, 1]


def test_a_list_column_holds_several_experts():
    data = datasets.Dataset.from_dict({"label": ["a", "b"], "panel": [["a", "b", "b"], ["b", None, "b"]]})
    prepared = prepare_deferral_dataset(data, "label", "panel", missing_expert="drop")
    assert prepared.expert_names == ["panel_0", "panel_1", "panel_2"]
    assert prepared.dataset["expert_labels"][:] == [[0, 1, 1]]
    ragged = datasets.Dataset.from_dict({"label": ["a", "b"], "panel": [["a", "b"], ["b"]]})
    with pytest.raises(ValueError, match="expert column 'panel' holds lists of different lengths"):
        prepare_deferral_dataset(ragged, "label", "panel")


@pytest.mark.parametrize(
    ("change", "kwargs", "message"),
    [
        (lambda d: d.remove_columns("bob"), {}, r"expert_columns \['bob'\] not found in the dataset"),
        (lambda d: d.rename_column("label", "y"), {}, r"label_column \['label'\] not found"),
        (lambda d: d.map(lambda r: {"bob": "great"}), {}, r"column 'bob', row 0: 'great' is not one of the 3 classes"),
        (lambda d: d.map(lambda r: {"review": 3}), {}, r"text column 'review' must hold text"),
        (lambda d: d, {"label_names": ["neg", "pos"]}, r"column 'label', row 2: 'neutral' is not one of the 2"),
        (lambda d: d, {"expert_columns": []}, r"expert_columns must name at least one column"),
        (lambda d: d, {"expert_columns": ["alice", "label"]}, r"must be distinct and differ from label_column"),
        (lambda d: d, {"missing_expert": "skip"}, r"missing_expert must be one of"),
        (lambda d: d, {"processor": "tok", "text_column": None}, r"needs text_column"),
        (lambda d: d.map(lambda r: {"label": "pos"}), {}, r"has 1 class\(es\) \['pos'\]; learning to defer needs"),
    ],
)
def test_errors_name_the_column_and_what_was_expected(change, kwargs, message):
    data = change(reviews()["train"])
    arguments = {"expert_columns": ["alice", "bob"], "text_column": "review", "missing_expert": "drop", **kwargs}
    if arguments.get("processor") == "tok":
        arguments["processor"] = tokenizer()
    with pytest.raises(ValueError, match=message):
        prepare_deferral_dataset(data, "label", **arguments)


def test_labels_all_ignored_or_absent_and_images_that_are_not_images():
    ignored = datasets.Dataset.from_dict({"label": [-100, -100], "e": [0, 1]})
    with pytest.raises(ValueError, match=r"every label of label column 'label' is -100"):
        prepare_deferral_dataset(ignored, "label", "e", label_names=["a", "b"])
    absent = datasets.Dataset.from_dict({"label": ["a", None, "b"], "e": ["a", "a", "b"]})
    with pytest.raises(ValueError, match=r"label column 'label' has no label in rows \[1\]"):
        prepare_deferral_dataset(absent, "label", "e")
    with pytest.raises(ValueError, match=r"image column 'img' must hold images"):
        prepare_deferral_dataset(datasets.Dataset.from_dict({"img": ["x.png"], "label": [0], "e": [1]}), "label", "e",
                                 image_column="img", label_names=["a", "b"])


def test_tokenized_text_pairs_train_with_names_in_pipeline_and_card(tmp_path):
    data = datasets.Dataset.from_dict({"q": ["good movie", "bad"], "a": ["fine plot", "movie"], "label": ["yes", "no"],
                                       "ann": ["yes", "yes"]})
    prepared = prepare_deferral_dataset(data, "label", "ann", text_column="q", text_pair_column="a",
                                        processor=tokenizer(), max_length=6)
    row = prepared.dataset[0]
    assert row["input_ids"] == tokenizer()("good movie", "fine plot", truncation=True, max_length=6)["input_ids"]
    assert max(len(ids) for ids in prepared.dataset["input_ids"]) <= 6
    encoder = BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=20)
    model = EncoderForDeferral(DeferralConfig(encoder=encoder, **prepared.model_kwargs()))
    args = TrainingArguments(str(tmp_path / "my-model"), report_to=[], use_cpu=True, max_steps=1, save_strategy="no")
    trainer = DeferralTrainer(model=model, args=args, train_dataset=prepared.dataset, eval_dataset=prepared.dataset,
                              processing_class=tokenizer())
    trainer.train()
    trainer.evaluate()
    trainer.save_model()
    out = pipeline("deferral", model=str(tmp_path / "my-model"))({"text": "good movie", "text_pair": "fine plot"})
    assert out["class_label"] in ("no", "yes") and set(out["scores"]) == {"no", "yes"}
    card = (tmp_path / "my-model" / "README.md").read_text()
    assert "# my-model" in card and "deferral-model" not in card  # named after output_dir
    assert "ann" in card and "yes" in card and "LABEL_0" not in card and "expert_0" not in card


def test_image_processor_makes_pixel_values_when_rows_are_read():
    from PIL import Image

    images = [Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8)) for value in (0, 255)]
    data = datasets.Dataset.from_dict({"img": images, "label": [0, 1], "e": [1, 1]},
                                      features=datasets.Features({"img": datasets.Image(),
                                                                  "label": datasets.ClassLabel(names=["dark", "light"]),
                                                                  "e": datasets.Value("int64")}))
    processor = ViTImageProcessor(size={"height": 4, "width": 4})
    prepared = prepare_deferral_dataset(data, "label", "e", image_column="img", processor=processor)
    row = prepared.dataset[1]
    assert sorted(row) == ["expert_labels", "labels", "pixel_values"]
    np.testing.assert_allclose(np.asarray(row["pixel_values"]), np.ones((3, 4, 4)), atol=1e-6)  # 255 -> (1-0.5)/0.5
    vit = ViTConfig(image_size=4, patch_size=2, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=8)
    model = EncoderForDeferral(DeferralConfig(encoder=vit, **prepared.model_kwargs()))
    hf_defer.training.trainer.check_deferral_dataset(prepared.dataset, model)  # lazy pixel_values are not "untokenized"


def test_trainer_takes_label_and_rejects_untokenized_text_nan_features_and_ignored_labels(tmp_path):
    args = TrainingArguments(str(tmp_path), report_to=[], use_cpu=True, max_steps=2, save_strategy="no")
    rng = np.random.default_rng(0)
    head = EncoderForDeferral(DeferralConfig(feature_size=3, num_labels=2))
    data = datasets.Dataset.from_dict({"features": rng.normal(size=(6, 3)).astype("float32"),
                                       "label": [0, 1, 0, 1, 1, 0], "expert_labels": [0, 1, 1, 1, 0, 0]})
    DeferralTrainer(model=head, args=args, train_dataset=data, eval_dataset=data).train()
    features = np.array(data["features"][:], dtype=np.float32)
    features[4, 1] = np.nan
    with pytest.raises(ValueError, match=r"column 'features' holds NaN or infinite values in rows \[4\]"):
        DeferralTrainer(model=head, args=args, train_dataset=data.remove_columns("features").add_column(
            "features", list(features)))
    with pytest.raises(ValueError, match=r"every 'label' is -100"):
        DeferralTrainer(model=head, args=args, eval_dataset=data.map(lambda r: {"label": -100}))
    with pytest.raises(ValueError, match=r"'labels' must hold class ids \(int\)"):
        DeferralTrainer(model=head, args=args, eval_dataset=data.rename_column("label", "labels").map(
            lambda r: {"labels": "pos"}))
    encoder = BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=20)
    text_model = EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=2))
    raw = datasets.Dataset.from_dict({"text": ["good", "bad"], "label": [0, 1], "expert_labels": [0, 0]})
    with pytest.raises(ValueError, match=r"train_dataset has no 'input_ids' column: it was not tokenized"):
        DeferralTrainer(model=text_model, args=args, train_dataset=raw)
    with pytest.raises(ValueError, match=r"prepare_deferral_dataset\(\.\.\., expert_columns="):
        DeferralTrainer(model=head, args=args, train_dataset=data.remove_columns("expert_labels"))


def test_calibration_loads_the_saved_tokenizer_and_uses_the_pipelines_truncation(tmp_path):
    encoder = BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=20)
    torch.manual_seed(0)
    EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=2)).save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    model = EncoderForDeferral.from_pretrained(tmp_path)
    with torch.no_grad():
        model.head[-1].bias[2] += 3.0  # the expert logit: most inputs would defer, so the budget binds
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS[5:], size=rng.integers(1, 12))) for _ in range(40)]
    threshold = hf_defer.calibrate_deferral(model, texts, max_deferral_rate=0.2, truncation=True, max_length=4)
    clf = pipeline("deferral", model=model, tokenizer=tokenizer())
    margins = sorted((max(o["expert_accuracy"]) - o["class_score"] for o in clf(texts, truncation=True, max_length=4)),
                     reverse=True)
    assert margins[8] > 0 and margins[7] > margins[8]  # the budget binds: more than floor(0.2 * 40) = 8 would defer
    # halfway between the 8th and 9th margin (the pipeline reports float32 estimates, calibration works in float64)
    assert threshold == pytest.approx((margins[7] + margins[8]) / 2, abs=1e-7)
    # the threshold comes from the truncated inputs, as the pipeline will see them
    assert abs(hf_defer.calibrate_deferral(model, texts, max_deferral_rate=0.2) - threshold) > 1e-6
    assert sum(o["defer"] for o in clf(texts, truncation=True, max_length=4)) <= 8
    fresh = EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=2))
    with pytest.raises(ValueError, match="found no tokenizer saved with the model"):
        hf_defer.calibrate_deferral(fresh, texts)


def test_docstring_examples_run():
    result = doctest.testmod(preparation_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
