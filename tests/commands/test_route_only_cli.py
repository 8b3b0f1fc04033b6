"""Route-only models from a user's CSV (prompts + per-model correctness), as a new user would: `prepare_deferral_dataset`
with no label column, `hf-defer train --route_only`, then `hf-defer predict`, checked against the saved model's own
estimates and the rule argmax_j (a_j - c_j) worked out here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from transformers import BertTokenizer

from hf_defer import EncoderForDeferral, prepare_deferral_dataset
from hf_defer.commands.arguments import parse_run_arguments
from hf_defer.commands.cli import main as hf_defer_main
from tiny_bert import save_tiny_bert

WORDS = "add two numbers prove theorem integrate limit name capital city translate word".split()
HARD = {"prove", "theorem", "integrate", "limit"}
COMMON = ["--report_to", "none", "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0",
          "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--learning_rate", "1e-2"]


# ------------------------------------------------------------------ prepare_deferral_dataset without a label
def test_prepare_route_only_data_gives_correctness_and_route_only_model_kwargs():
    table = datasets.Dataset.from_dict({"prompt": ["a", "b", "c"], "small": [True, False, None],
                                        "large": [1, 1, 0], "judge": [0.25, 1.0, 0.5]})
    prepared = prepare_deferral_dataset(table, None, None, expert_correct_columns=["small", "large", "judge"],
                                        text_column="prompt", missing_expert="mask")
    assert prepared.model_kwargs() == {"route_only": True, "num_experts": 3, "expert_names": ["small", "large",
                                                                                                "judge"]}
    assert prepared.route_only and prepared.id2label == {} and prepared.num_labels == 0
    assert sorted(prepared.dataset.column_names) == ["expert_correct", "text"]  # no labels column
    assert prepared.dataset["expert_correct"][:] == [[1.0, 1.0, 0.25], [0.0, 1.0, 1.0], [-100.0, 0.0, 0.5]]


@pytest.mark.parametrize("kwargs, words", [
    ({"expert_columns": ["answer"], "expert_correct_columns": ["small", "large"]}, "expert_columns"),
    ({"expert_correct_columns": ["small", "large"], "label_names": ["x", "y"]}, "label_names"),
    ({"expert_correct_columns": ["small"]}, "at least two"),
])
def test_route_only_data_refuses_what_it_cannot_use(kwargs, words):
    table = datasets.Dataset.from_dict({"prompt": ["a", "b"], "small": [True, False], "large": [True, True],
                                        "answer": ["x", "y"]})
    with pytest.raises(ValueError, match=words):
        prepare_deferral_dataset(table, None, text_column="prompt", **kwargs)


@pytest.mark.parametrize("bad", [["yes", "no"], [0.5, 1.5], [-0.5, 1.0]])
def test_route_only_correctness_must_be_booleans_or_scores_in_unit_interval(bad):
    table = datasets.Dataset.from_dict({"prompt": ["a", "b"], "small": bad, "large": [True, True]})
    with pytest.raises(ValueError, match="expert correctness column 'small'.*neither a boolean nor a number in"):
        prepare_deferral_dataset(table, None, expert_correct_columns=["small", "large"], text_column="prompt")


def test_route_only_flags_refuse_a_label_column_and_an_unknown_default_expert():
    base = ["--model_name_or_path", "m", "--train_file", "t.csv", "--output_dir", "o", "--route_only",
            "--expert_correct_columns", "small,large"]
    _, data_args, _ = parse_run_arguments(base + ["--default_expert", "large"])
    assert data_args.label_column_name is None and data_args.default_expert == "large"
    with pytest.raises(ValueError, match="--route_only.*--label_column_name 'label'"):
        parse_run_arguments(base + ["--label_column_name", "label"])
    with pytest.raises(ValueError, match="--surrogate 'sova' does not apply with --route_only"):
        parse_run_arguments(base + ["--surrogate", "sova"])
    with pytest.raises(ValueError, match="--default_expert must be one of"):
        parse_run_arguments(base + ["--default_expert", "medium"])
    with pytest.raises(ValueError, match="--default_expert is for route-only"):
        parse_run_arguments([a for a in base if a != "--route_only"] + ["--default_expert", "large"])
    _, plain, _ = parse_run_arguments([a for a in base if a != "--route_only"])
    assert plain.label_column_name == "label"  # the default without --route_only


# ------------------------------------------------------------------ train and predict through the command line
@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A tiny BERT and CSVs of prompts with two models' correctness (booleans): the small model fails on the
    prompts with a hard word, the large one is right everywhere but one row in ten."""
    root = tmp_path_factory.mktemp("route_only")
    save_tiny_bert(root / "encoder", WORDS)
    rng = np.random.default_rng(0)
    for split, n in (("train", 64), ("dev", 20), ("test", 12)):
        prompts = [" ".join(rng.choice(WORDS, size=rng.integers(2, 5))) for _ in range(n)]
        hard = [bool(HARD & set(p.split())) for p in prompts]
        frame = pd.DataFrame({"prompt": prompts, "small_llm": [not h for h in hard],
                              "large_llm": [bool(rng.random() > 0.1) for _ in prompts]})
        if split == "test":
            frame = frame[["prompt"]]  # new prompts: no correctness known
        frame.to_csv(root / f"{split}.csv", index=False)
    return root


def test_hf_defer_train_and_predict_route_only_from_csv(project, capsys):
    out = project / "router"
    code = hf_defer_main(["train", "--model_name_or_path", str(project / "encoder"),
                          "--train_file", str(project / "train.csv"), "--validation_file", str(project / "dev.csv"),
                          "--test_file", str(project / "test.csv"), "--text_column_names", "prompt",
                          "--route_only", "--expert_correct_columns", "small_llm,large_llm",
                          "--default_expert", "small_llm", "--max_deferral_rate", "0.5", "--num_train_epochs", "8",
                          "--pooling", "mean",
                          "--do_train", "--do_eval", "--do_predict", "--output_dir", str(out), *COMMON])
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["route_only"] is True and config["expert_names"] == ["small_llm", "large_llm"]
    assert config["default_expert"] == "small_llm" and not config.get("id2label")
    results = json.loads((out / "all_results.json").read_text())
    assert np.isfinite(results["eval_loss"]) and np.isfinite(results["calibrated_eval_loss"])
    threshold = float(config["defer_threshold"])
    summary = json.loads((out / "hf_defer_run.json").read_text())
    assert summary["defer_threshold"] == pytest.approx(threshold) and summary["predicted_rows"] == 12

    # The saved model's own estimates a_j(x), by a plain forward pass on the tokenized prompts.
    model = EncoderForDeferral.from_pretrained(out).eval()
    tokenizer = BertTokenizer.from_pretrained(out)
    dev = pd.read_csv(project / "dev.csv")
    test = pd.read_csv(project / "test.csv")

    def estimates(prompts: list[str]) -> np.ndarray:
        with torch.no_grad():
            logits = model(**tokenizer(prompts, padding=True, return_tensors="pt")).logits
        return torch.sigmoid(logits.double()).numpy()

    # Calibration: at most half of the validation prompts are sent to the large model (margin > threshold).
    dev_a = estimates(list(dev["prompt"]))
    assert ((dev_a[:, 1] - dev_a[:, 0]) > threshold).mean() <= 0.5 + 1e-9

    # Prices that split the test prompts: the large model goes for a1 - a0 - threshold > c1 - c0, so c1 - c0 is put
    # halfway across the widest gap between those margins near their median (none sits on the boundary).
    a = estimates(list(test["prompt"]))
    margins = np.sort(a[:, 1] - a[:, 0] - threshold)
    middle = len(margins) // 2
    gaps = margins[middle - 3 + 1:middle + 3] - margins[middle - 3:middle + 3 - 1]
    cut = middle - 3 + int(np.argmax(gaps))
    shift = round(float(margins[cut] + margins[cut + 1]) / 2, 8)
    costs = [max(-shift, 0.0), max(shift, 0.0)]
    code = hf_defer_main(["predict", "--model", str(out), "--input", str(project / "test.csv"),
                          "--output", str(project / "decisions.csv"), "--text_column_names", "prompt",
                          "--expert_costs", ",".join(map(str, costs)), "--copy_columns", "prompt"])
    assert code == 0
    with open(project / "decisions.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["row", "prompt", "label", "defer", "expert", "estimated_accuracy", "cost", "margin",
                             "expert_accuracy_small_llm", "expert_accuracy_large_llm"]
    gains = a - np.array(costs)  # a_j - c_j; the default answers unless another gains more than the threshold
    expected = np.where(gains[:, 1] - gains[:, 0] > threshold, 1, 0)
    names = ["small_llm", "large_llm"]
    assert 0 < expected.sum() < len(expected)  # both models are chosen
    assert [row["prompt"] for row in rows] == list(test["prompt"])
    for row, j, accuracy in zip(rows, expected, a):
        assert row["expert"] == names[j] and row["label"] == names[j]
        assert row["defer"] == str(bool(j == 1))
        assert float(row["estimated_accuracy"]) == pytest.approx(accuracy[j], abs=1e-5)
        assert float(row["cost"]) == costs[j]
        assert float(row["margin"]) == pytest.approx((accuracy[1] - costs[1]) - (accuracy[0] - costs[0]), abs=1e-5)
        assert [float(row[f"expert_accuracy_{n}"]) for n in names] == pytest.approx(list(accuracy), abs=1e-5)
    # The run's own predictions.csv (saved costs: zero) follows the same rule with c = 0.
    with open(out / "predictions.csv", newline="") as handle:
        saved = list(csv.DictReader(handle))
    assert [row["expert"] for row in saved] == [names[j] for j in np.where(a[:, 1] - a[:, 0] > threshold, 1, 0)]
    assert all(float(row["cost"]) == 0.0 for row in saved)
    capsys.readouterr()

    # hf-defer evaluate on the validation prompts scores the chosen model's correctness (columns matched by name, in
    # any order): the error and coverage of the rule argmax_j (a_j - c_j) with the saved costs (zero) and threshold.
    chosen = np.where(dev_a[:, 1] - dev_a[:, 0] > threshold, 1, 0)
    correct = dev[["small_llm", "large_llm"]].to_numpy(dtype=float)
    code = hf_defer_main(["evaluate", "--model", str(out), "--input", str(project / "dev.csv"), "--text_column_names",
                          "prompt", "--expert_correct_columns", "large_llm,small_llm"])
    assert code == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["system_error"] == pytest.approx(1 - correct[np.arange(len(dev)), chosen].mean())
    assert metrics["coverage"] == pytest.approx(np.mean(chosen == 0))
    assert hf_defer_main(["evaluate", "--model", str(out), "--input", str(project / "dev.csv"),
                          "--text_column_names", "prompt", "--expert_column_names", "small_llm,large_llm"]) == 2
    assert "--expert_correct_columns" in capsys.readouterr().err
    assert hf_defer_main(["evaluate", "--model", str(out), "--input", str(project / "dev.csv"),
                          "--text_column_names", "prompt", "--expert_correct_columns", "small_llm,medium"]) == 2
    assert "--expert_correct_columns must name one column per expert" in capsys.readouterr().err


# ------------------------------------------------------------------ a head-only router on its sentence encoder
def test_a_head_only_router_with_side_features_goes_onto_its_sentence_encoder(tmp_path):
    """`head_on_sentence_encoder` (hf-defer train --freeze_encoder, hf-defer serve --encoder) of a router: the text
    model's logits are the head's on the encoder's mean-pooled last hidden state, pooled here by hand."""
    from transformers import AutoModel

    from hf_defer import DeferralConfig, EncoderForRouting
    from hf_defer.commands.run import head_on_sentence_encoder
    from hf_defer.modeling.side_features import side_feature_tensors

    save_tiny_bert(tmp_path / "enc", WORDS)
    specs = [{"name": "tier", "kind": "categorical", "categories": ["free", "pro"], "dim": 2}]
    torch.manual_seed(3)
    head = EncoderForRouting(DeferralConfig(feature_size=16, route_only=True, num_experts=2, side_features=specs,
                                            expert_names=["weak", "strong"], default_expert="weak")).eval()
    torch.nn.init.normal_(head.side.embeddings[0].weight)
    text_model = head_on_sentence_encoder(head, str(tmp_path / "enc")).eval()
    assert type(text_model) is EncoderForRouting and text_model.config.default_expert == "weak"
    tokens = BertTokenizer.from_pretrained(tmp_path / "enc")(["add two numbers", "prove the theorem"],
                                                              return_tensors="pt", padding=True)
    ids, _ = side_feature_tensors(specs, [{"tier": "pro"}, {"tier": "free"}])
    with torch.no_grad():
        last = AutoModel.from_pretrained(tmp_path / "enc")(**tokens).last_hidden_state
        mask = tokens["attention_mask"].unsqueeze(-1).float()
        pooled = (last * mask).sum(1) / mask.sum(1)
        expected = head(features=pooled, side_categorical=ids).logits
        got = text_model(**tokens, side_categorical=ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

