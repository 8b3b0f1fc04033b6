"""hf_defer.data.checks: bad data caught when DeferralTrainer is built (it used to fail mid-training)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset, IterableDataset
from transformers import BertConfig, BertTokenizer, TrainingArguments

from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral
from hf_defer.data.checks import PEEK_ROWS, check_deferral_dataset

K, D = 3, 6
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a cat dog sat on mat is good bad very".split()]
POSITIONS = 16


def head_model(num_experts: int = 1) -> EncoderForDeferral:
    return EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=K, num_experts=num_experts))


def text_model() -> tuple[EncoderForDeferral, BertTokenizer]:
    encoder = BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20,
                         vocab_size=len(WORDS), max_position_embeddings=POSITIONS)
    return (EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=K)),
            BertTokenizer(vocab={word: i for i, word in enumerate(WORDS)}))


def features(n: int = 4, width: int = D, **columns) -> Dataset:
    rng = np.random.default_rng(0)
    data = {"features": rng.normal(size=(n, width)).astype("float32"), "labels": np.arange(n) % K,
            "expert_labels": (np.arange(n) + 1) % K}
    data.update(columns)
    return Dataset.from_dict(data)


def args(tmp_path: Path, **overrides) -> TrainingArguments:
    return TrainingArguments(**{"output_dir": str(tmp_path / "out"), "report_to": [], "use_cpu": True,
                                "disable_tqdm": True, "save_strategy": "no", "logging_strategy": "no", **overrides})


# ---------------------------------------------------------------------------------------------------- the datasets


def test_an_evaluation_set_whose_labels_are_all_ignored(tmp_path):
    """It used to crash at the first evaluation, mid-training, with "labels has no row to evaluate"."""
    ignored = features(labels=[-100] * 4)
    with pytest.raises(ValueError, match=r"eval_dataset: every 'labels' is -100 \(ignored\)"):
        DeferralTrainer(model=head_model(), args=args(tmp_path), train_dataset=features(), eval_dataset=ignored)
    with pytest.raises(ValueError, match=r"eval_dataset\['test'\]: every 'labels' is -100"):
        DeferralTrainer(model=head_model(), args=args(tmp_path), eval_dataset={"val": features(), "test": ignored})


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_infinite_features(tmp_path, bad):
    data = features(5)
    values = np.asarray(data["features"])
    values[3, 2] = bad
    with pytest.raises(ValueError, match=r"train_dataset: column 'features' holds NaN or infinite values in rows \[3\]"):
        DeferralTrainer(model=head_model(), args=args(tmp_path), train_dataset=data.remove_columns("features")
                        .add_column("features", list(values)))


def test_features_of_the_wrong_width(tmp_path):
    with pytest.raises(ValueError, match=r"train_dataset: column 'features' must have feature_size=6 numbers per row, "
                                         r"got 5, e\.g\. in rows \[0, 1, 2, 3\]"):
        DeferralTrainer(model=head_model(), args=args(tmp_path), train_dataset=features(width=5))
    ragged = Dataset.from_dict({"features": [[0.0] * D, [0.0] * (D + 1)], "labels": [0, 1], "expert_labels": [0, 1]})
    with pytest.raises(ValueError, match=r"got 7, e\.g\. in rows \[1\]"):
        check_deferral_dataset(ragged, head_model(), "train_dataset")


def test_a_text_dataset_never_tokenized(tmp_path):
    model, tokenizer = text_model()
    raw = Dataset.from_dict({"text": ["the cat", "a dog"], "labels": [0, 1], "expert_labels": [0, 0]})
    with pytest.raises(ValueError, match=r"train_dataset has no 'input_ids' column: it was not tokenized; tokenize it "
                                         r"first, e\.g\. "
                                         r"dataset\.map\(lambda batch: tokenizer\(batch\['text'\], truncation=True\)"):
        DeferralTrainer(model=model, args=args(tmp_path), train_dataset=raw, processing_class=tokenizer)
    lazy = raw.with_transform(lambda batch: {**tokenizer(batch["text"]), "labels": batch["labels"],
                                             "expert_labels": batch["expert_labels"]})
    check_deferral_dataset(lazy, model, "train_dataset")  # inputs made when rows are read: not checked


def test_texts_longer_than_the_encoders_positions(tmp_path):
    model, tokenizer = text_model()
    texts = ["the cat sat on the mat", " ".join(["very"] * 20), "a dog"]
    data = Dataset.from_dict({"text": texts, "labels": [0, 1, 2], "expert_labels": [0, 1, 1]})
    tokenized = data.map(lambda batch: tokenizer(batch["text"]), batched=True)
    with pytest.raises(ValueError, match=r"train_dataset: column 'input_ids' has rows of up to 22 tokens, more than the "
                                         r"encoder's 16 positions \(rows \[1\]\): tokenize with truncation=True, "
                                         r"max_length=16"):
        DeferralTrainer(model=model, args=args(tmp_path), train_dataset=tokenized, processing_class=tokenizer)
    fixed = data.map(lambda batch: tokenizer(batch["text"], truncation=True, max_length=POSITIONS), batched=True)
    DeferralTrainer(model=model, args=args(tmp_path), train_dataset=fixed, processing_class=tokenizer)


def test_token_ids_outside_the_vocabulary_and_empty_rows():
    model, _ = text_model()
    base = {"labels": [0, 1], "expert_labels": [0, 1]}
    with pytest.raises(ValueError, match=r"holds token ids from 2 to 30522, but the encoder's vocabulary has 16"):
        check_deferral_dataset(Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 30522, 3]], **base}), model, "data")
    with pytest.raises(ValueError, match=r"data: column 'input_ids' has empty rows \[0\]"):
        check_deferral_dataset(Dataset.from_dict({"input_ids": [[], [2, 5, 3]], **base}), model, "data")


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"labels": ["hate", "offensive", "neither", "hate"]},
         r"column 'labels' must hold class ids \(int\), got string values such as \['hate', 'offensive', 'neither'\]; "
         r"map class names to ids first \(hf_defer\.prepare_deferral_dataset, or dataset\.class_encode_column\('labels'\)\)"),
        ({"labels": [0.0, 1.0, 2.0, 0.5]}, r"column 'labels' must hold class ids \(int\), got double"),
        ({"labels": [0, None, 1, 2]}, r"column 'labels' has missing values \(None\), e\.g\. in rows \[1\]"),
        ({"expert_labels": [[0, 1], [1], [0, 2], [1, 1]]},
         r"column 'expert_labels' must have the same number of entries in every row \(one per expert\), got rows of 1 "
         r"and of 2, e\.g\. rows \[1\]"),
        ({"expert_labels": [[0, 1]] * 4}, r"expert_labels must have num_experts=3 entries per row, got 2"),
        ({"labels": [0, 1, 5, 0]}, r"labels must lie in \[0, 3\)"),
        ({"labels": [[0], [1], [2], [0]]},  # found by make test-explore: accepted here, refused by the collator
         r"column 'labels' must hold one class id \(int\) per row, got lists of 1; flatten it first"),
    ],
)
def test_malformed_label_columns(columns, message):
    with pytest.raises(ValueError, match=rf"train_dataset: {message}"):
        check_deferral_dataset(features(4, **columns), head_model(num_experts=3 if "num_experts=3" in message else 1),
                               "train_dataset")


def test_label_column_is_accepted_like_labels():
    check_deferral_dataset(features(4).rename_column("labels", "label"), head_model(), "train_dataset")
    with pytest.raises(ValueError, match="every 'label' is -100"):
        check_deferral_dataset(features(4, labels=[-100] * 4).rename_column("labels", "label"), head_model(), "d")


def test_a_streamed_dataset_is_checked_on_its_first_examples(tmp_path):
    def rows(bad_row: int):
        for i in range(PEEK_ROWS + 10):
            vector = [0.5] * D
            if i == bad_row:
                vector[0] = float("nan")
            yield {"features": vector, "labels": i % K, "expert_labels": 0}

    stream = IterableDataset.from_generator(rows, gen_kwargs={"bad_row": 2})
    with pytest.raises(ValueError, match=rf"train_dataset \(its first {PEEK_ROWS} examples\): column 'features' holds "
                                         r"NaN or infinite values in rows \[2\]"):
        DeferralTrainer(model=head_model(), args=args(tmp_path, max_steps=2), train_dataset=stream)
    # a bad row after the first ones is not read at construction (the stream is not consumed)
    DeferralTrainer(model=head_model(), args=args(tmp_path, max_steps=2),
                    train_dataset=IterableDataset.from_generator(rows, gen_kwargs={"bad_row": PEEK_ROWS + 5}))
    missing = IterableDataset.from_generator(lambda: iter([{"features": [0.0] * D, "labels": 0}]))
    with pytest.raises(ValueError, match=r"train_dataset \(its first 1 examples\) must have a 'expert_labels' column"):
        DeferralTrainer(model=head_model(), args=args(tmp_path, max_steps=2), train_dataset=missing)


def test_a_torch_dataset_is_not_checked():
    check_deferral_dataset(torch.utils.data.TensorDataset(torch.zeros(2, D)), head_model(), "train_dataset")


def test_checks_are_cheap_on_a_big_dataset():
    """Column-wise Arrow/numpy: 200k rows of 6 features check in well under a second."""
    import time

    n = 200_000
    rng = np.random.default_rng(0)
    data = Dataset.from_dict({"features": rng.normal(size=(n, D)).astype("float32"), "labels": rng.integers(0, K, n),
                              "expert_labels": rng.integers(0, K, n)})
    start = time.perf_counter()
    check_deferral_dataset(data.select(range(0, n, 2)), head_model(), "train_dataset")  # through an indices mapping
    check_deferral_dataset(data, head_model(), "train_dataset")
    assert time.perf_counter() - start < 2.0


def test_docstring_examples_run():
    import doctest

    import hf_defer.data.checks as checks_module

    result = doctest.testmod(checks_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_a_dataset_given_to_evaluate_is_checked_too(tmp_path):
    trainer = DeferralTrainer(model=head_model(), args=args(tmp_path), eval_dataset=features())
    with pytest.raises(ValueError, match=r"eval_dataset: every 'labels' is -100"):
        trainer.evaluate(features(labels=[-100] * 4))
    with pytest.raises(ValueError, match=r"eval_dataset: column 'features' must have feature_size=6"):
        trainer.evaluate({"good": features(), "narrow": features(width=3)})
    assert 0.0 <= trainer.evaluate()["eval_system_error"] <= 1.0
