"""Tests of research (the HateSpeech protocol, runs, statistics, reports) on tiny synthetic data (no
embeddings, no network), and of scripts/reproduce_hatespeech.py run as a program on the committed results."""

from __future__ import annotations

import doctest
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from research import reporting, runs, statistics, table2_hatespeech as hatespeech

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "reproduce_hatespeech.py"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _toy_splits(n_train: int = 300, n_test: int = 150, seed: int = 0) -> datasets.DatasetDict:
    """Three well separated classes in 8-d; the expert is right 1/3 of the time (uniform guesses)."""
    rng = np.random.default_rng(seed)

    def part(n: int) -> datasets.Dataset:
        labels = rng.integers(0, 3, n)
        features = np.zeros((n, 8), dtype=np.float32)
        features[np.arange(n), labels] = 3.0
        features += rng.normal(scale=0.3, size=features.shape).astype(np.float32)
        counts = np.zeros((n, 3), dtype=np.int64)
        counts[np.arange(n), labels] = 3
        return datasets.Dataset.from_dict({
            "text": ["he finna go" if i % 2 else "the store" for i in range(n)], "features": features, "labels": labels,
            "expert_labels": rng.integers(0, 3, n), "count": counts.sum(1), "hate_speech": counts[:, 0],
            "offensive_language": counts[:, 1], "neither": counts[:, 2]})

    return datasets.DatasetDict({"train": part(n_train), "validation": part(30), "test": part(n_test)})


# ------------------------------------------------------------------------------------------------ statistics
def test_mean_and_standard_error_by_hand():
    mean, error = statistics.mean_and_standard_error([2.0, 4.0, 6.0, 8.0])
    # sample sd = sqrt(((3^2 + 1 + 1 + 3^2)) / 3) = sqrt(20/3); / sqrt(4)
    assert mean == 5.0 and error == pytest.approx(math.sqrt(20 / 3) / 2)
    assert math.isnan(statistics.mean_and_standard_error([1.5])[1])
    with pytest.raises(ValueError, match="at least one"):
        statistics.mean_and_standard_error([])


def test_comparable_methods_paired_t_test_by_hand():
    # Differences to the best ("a"): b - a = [0.1, -0.1, 0.2, -0.2, 0.1] -> t = 0.02 / (0.164 / sqrt 5) = 0.27,
    # far below the 5 % two-sided critical value 2.776 (4 df): comparable.
    # c - a = [1.0, 1.1, 0.9, 1.0, 1.05] -> t ≈ 29: different.
    a = [1.0, 2.0, 3.0, 4.0, 5.0]
    values = {"a": a, "b": [1.1, 1.9, 3.2, 3.8, 5.1], "c": [2.0, 3.1, 3.9, 5.0, 6.05]}
    assert statistics.comparable_methods(values) == {"a", "b"}
    # Coverage-like: the largest mean is best; "c" is now the best and the others differ from it.
    assert statistics.comparable_methods(values, higher_is_better=True) == {"c"}


def test_comparable_methods_edge_cases():
    assert statistics.comparable_methods({"a": [1.0, 2.0], "b": [1.0, 2.0]}) == {"a", "b"}  # identical runs
    assert statistics.comparable_methods({"a": [1.0, 2.0], "b": [1.5, 2.5]}) == {"a"}  # constant non-zero gap
    assert statistics.comparable_methods({"a": [3.0], "b": [1.0]}) == {"b"}  # one run: no test
    with pytest.raises(ValueError, match="same positive number of runs"):
        statistics.comparable_methods({"a": [1.0, 2.0], "b": [1.0]})


def test_results_table_marks_best_and_copies_paper():
    runs = []
    for seed, (asm, ssm) in enumerate([(0.08, 0.11), (0.09, 0.121), (0.07, 0.099)]):
        for name, error in (("asm", asm), ("ssm", ssm)):
            metrics = {key: 0.5 for key in reporting.METRICS} | {"system_error": error}
            runs.append({"surrogate": name, "seed": seed, "metrics": metrics})
    table = reporting.results_table(runs, ["ssm", "asm"])
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    # A-SM: mean 8.00, se = sd([8, 9, 7]) / sqrt 3 = 1 / sqrt 3 = 0.58. S-SM: mean 11.00, se = 1.1 / sqrt 3 = 0.64;
    # paired differences [3, 3.1, 2.9]: t = 3 / (0.1 / sqrt 3) = 52 > 4.303 (2 df), significantly worse.
    assert "**8.00 (0.58)**" in rows["A-SM (ours, 3 seeds)"]
    assert "| 11.00 (0.64) |" in rows["S-SM (ours, 3 seeds)"]
    assert "**50.00 (0.00)**" in rows["S-SM (ours, 3 seeds)"]  # tie on the other metrics: both bold
    assert "**8.06 (0.40)**" in rows["A-SM (paper)"] and "| 8.65 (0.14) |" in rows["S-SM (paper)"]
    with pytest.raises(ValueError, match="missing"):
        reporting.results_table(runs[:-1], ["ssm", "asm"])


def test_estimate_errors_by_hand():
    # Swapped values: each tweet is off by 0.5, yet the two distributions are identical.
    assert hatespeech.estimate_errors(np.array([0.5, 1.0]), np.array([1.0, 0.5])) == {"mae": 0.5, "wasserstein": 0.0}
    # 1.2 is clipped to 1: per tweet |1 - 1| and |0.2 - 0.6|; sorted samples [0.2, 1] vs [0.6, 1] differ by 0.4, 0.
    errors = hatespeech.estimate_errors(np.array([1.2, 0.2]), np.array([1.0, 0.6]))
    assert errors["mae"] == pytest.approx(0.2) and errors["wasserstein"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="one shape"):
        hatespeech.estimate_errors(np.array([0.5]), np.array([0.5, 0.5]))


# ------------------------------------------------------------------------------------------------ training
def test_training_arguments_give_sgd_momentum_and_cosine(tmp_path):
    from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral

    args = hatespeech.training_arguments(str(tmp_path), 0, hatespeech.Protocol(epochs=1))
    assert args.weight_decay == 0.0 and args.warmup_steps == 0 and args.eval_strategy == "no"
    model = EncoderForDeferral(DeferralConfig(feature_size=8, num_labels=3))
    trainer = DeferralTrainer(model=model, args=args, train_dataset=_toy_splits()["train"])
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    assert isinstance(optimizer, torch.optim.SGD)
    assert all(group["momentum"] == 0.9 and group["weight_decay"] == 0.0 for group in optimizer.param_groups)
    lrs = []
    for _ in range(10):
        lrs.append(trainer.lr_scheduler.get_last_lr()[0])
        optimizer.step()
        trainer.lr_scheduler.step()
    # cosine annealing from 0.1 to 0 over 10 steps: 0.1 * (1 + cos(pi * t / 10)) / 2
    np.testing.assert_allclose(lrs, [0.05 * (1 + math.cos(math.pi * t / 10)) for t in range(10)], atol=1e-9)


def test_train_head_learns_a_separable_problem():
    splits = _toy_splits()
    result = hatespeech.train_head(splits, "asm", seed=0, protocol=hatespeech.Protocol(epochs=20, batch_size=32))
    # Classes are separable and the expert guesses: the classifier should answer nearly everything, correctly.
    assert result.metrics["classifier_error"] < 0.05
    assert result.metrics["coverage"] > 0.9
    assert result.expert_accuracy.shape == (150, 1) and result.experts_right.shape == (150, 1)
    truth = np.asarray(splits["test"]["expert_labels"]) == np.asarray(splits["test"]["labels"])
    np.testing.assert_array_equal(result.experts_right[:, 0], truth)
    assert set(result.metrics["reliability"]) == {"bin_edges", "counts", "mean_confidence", "accuracy"}
    assert result.train_seconds > 0


def test_train_head_subsamples_with_max_train(monkeypatch):
    seen = {}
    original = hatespeech.DeferralTrainer.__init__

    def spy(self, *args, **kwargs):
        seen["rows"] = len(kwargs["train_dataset"])
        seen["columns"] = list(kwargs["train_dataset"][0])
        original(self, *args, **kwargs)

    monkeypatch.setattr(hatespeech.DeferralTrainer, "__init__", spy)
    hatespeech.train_head(_toy_splits(), "ssm", seed=1, protocol=hatespeech.Protocol(epochs=1, max_train=50))
    assert seen == {"rows": 50, "columns": ["features", "labels", "expert_labels"]}


def test_render_only_rewrites_markdown_from_json(toy_loader, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    runs.run_table2(runs.ReproductionArguments(quick=True, surrogates=["asm", "ssm"], output_dir=str(out)), out)
    (out / "hatespeech.md").write_text("edited by hand")
    render_only = runs.ReproductionArguments(render_only=True, output_dir=str(out))
    with pytest.raises(SystemExit, match="--overwrite"):
        runs.confirm_overwrite(out, render_only.planned_outputs(), overwrite=False)
    assert (out / "hatespeech.md").read_text() == "edited by hand"
    reporting.render_reports(out)
    assert "| A-SM (ours, 2 seeds) |" in (out / "hatespeech.md").read_text()


# ------------------------------------------------------------------------------------------------ multi-expert
def test_add_three_experts():
    splits = _toy_splits(n_train=60, n_test=30)
    aae_of = {"he finna go": True, "the store": False}
    out = hatespeech.add_three_experts(splits, aae_of, seed=0, p_aae=0.0, p_other=1.0, specialist_p=1.0)
    test = out["test"]
    labels = np.asarray(test["labels"])
    experts = np.asarray(test["expert_labels"])
    assert experts.shape == (30, 3)
    np.testing.assert_array_equal(experts[:, 0], splits["test"]["expert_labels"])  # the annotator is kept
    flags = np.asarray(test["aae"])
    np.testing.assert_array_equal(flags, [t == "he finna go" for t in test["text"]])
    np.testing.assert_array_equal(experts[~flags, 1], labels[~flags])  # p_other = 1
    np.testing.assert_array_equal(experts[labels == 0, 2], 0)  # the specialist knows class 0


def test_multi_expert_markdown_reports_routing():
    settings = {"p_aae": 0.5, "p_other": 0.9, "specialist_p": 0.9, "quick": False, "date": "2026-01-02T00:00:00",
                "aae_share_all_tweets": 0.54}
    multi = {"system_error": 0.05, "coverage": 0.7, "expert_ece": 0.02}
    multi |= {f"deferral_rate_{j}": 0.1 for j in range(3)} | {f"expert_ece_{j}": 0.02 for j in range(3)}
    single = {"system_error": 0.08, "coverage": 0.8, "expert_ece": 0.03}
    record = {"multi": multi, "single": {c: single for c in hatespeech.EXPERT_COLUMNS},
              "dialect_routing_on_aae": 0.01, "dialect_routing_on_other": 0.2, "test_aae_share": 0.5,
              "expert_accuracy_on_test": {c: 0.9 for c in hatespeech.EXPERT_COLUMNS}}
    text = reporting.multi_expert_markdown({"settings": settings, "runs": [record, record]})
    assert "| A-SM, three experts | 5.00 (0.00) | – | – | 70.00 (0.00) |" in text
    assert "1.0 % of AAE test tweets vs 20.0 %" in text and "54.0 % of the tweets as AAE" in text
    assert "right with probability 0.5 on tweets" in text and "2026-01-02 (2 seeds" in text


# ------------------------------------------------------------------------------------------------ fine-tuning
@pytest.fixture
def tiny_encoder_dir(tmp_path):
    from transformers import BertConfig, BertModel, BertTokenizer

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "tweet", *map(str, range(10))]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(words) + "\n")
    folder = tmp_path / "tiny-bert"
    BertTokenizer(str(vocab)).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                        vocab_size=len(words))
    BertModel(config).save_pretrained(folder)
    return str(folder)


def test_finetune_encoder_runs_on_a_tiny_model(tiny_encoder_dir):
    splits = _toy_splits(n_train=40, n_test=20)
    result = hatespeech.finetune_encoder(splits, tiny_encoder_dir, seed=0, train_size=24, max_length=8,
                                    learning_rate=1e-3, batch_size=8, test_size=16)
    assert len(result.extra["train"]) == 24 and len(result.extra["test"]) == 16
    assert 0.0 <= result.metrics["system_error"] <= 1.0
    assert result.expert_accuracy.shape == (16, 1)


# ------------------------------------------------------------------------------------------------ CLI
def test_parse_args_quick_and_errors():
    args = runs.ReproductionArguments(quick=True)
    assert args.seeds == [0, 1] and args.epochs == 1.0 and args.finetune_train_size == 64
    with pytest.raises(ValueError):
        runs.ReproductionArguments(seeds=[1, 1])
    with pytest.raises(ValueError):
        runs.ReproductionArguments(skip_main=True)
    with pytest.raises(ValueError):
        runs.ReproductionArguments(p_aae=1.5)


def test_existing_results_are_not_overwritten_without_asking(tmp_path, monkeypatch):
    (tmp_path / "hatespeech.md").write_text("my notes")
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(SystemExit, match="--overwrite"):
        runs.confirm_overwrite(tmp_path, ["hatespeech.md", "hatespeech_runs.json"], overwrite=False)
    runs.confirm_overwrite(tmp_path, ["hatespeech.md"], overwrite=True)  # explicit consent: no question
    runs.confirm_overwrite(tmp_path, ["other.md"], overwrite=False)  # nothing to overwrite
    assert (tmp_path / "hatespeech.md").read_text() == "my notes"


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture
def tiny_twitteraae_dir(tmp_path):
    folder = tmp_path / "twitteraae"
    folder.mkdir()
    words = ["finna", "go", "he", "the", "store"]
    counts = [[50, 1, 1, 1], [5, 5, 5, 5], [5, 5, 5, 5], [5, 5, 5, 40], [1, 5, 5, 40]]
    (folder / "model_vocab.txt").write_text("".join(f"{i}\t{w}\n" for i, w in enumerate(words)))
    (folder / "model_count_table.txt").write_text("".join(" ".join(map(str, row)) + "\n" for row in counts))
    return str(folder)


@pytest.fixture
def toy_loader(monkeypatch):
    calls = []

    def load_splits(seed, data=None, encoder=None, cache_dir=None, show_progress=True):
        calls.append(seed)
        return _toy_splits(seed=seed)

    monkeypatch.setattr(runs, "load_splits", load_splits)
    return calls


def test_main_writes_table_json_and_figures(toy_loader, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    arguments = runs.ReproductionArguments(quick=True, surrogates=["asm", "ssm"], output_dir=str(out))
    runs.run_table2(arguments, out)
    assert toy_loader == [0, 1]
    text = (out / "hatespeech.md").read_text()
    assert "| A-SM (ours, 2 seeds) |" in text and "| S-OvA (paper) |" not in text and "Quick smoke run" in text
    record = json.loads((out / "hatespeech_runs.json").read_text())
    assert sorted((r["surrogate"], r["seed"]) for r in record["runs"]) == [("asm", 0), ("asm", 1), ("ssm", 0), ("ssm", 1)]
    assert record["complete"] and 0 <= record["runs"][0]["metrics"]["expert_accuracy_mae"] <= 1
    for name in ("hatespeech_expert_accuracy.png", "hatespeech_reliability.png"):
        assert (out / name).stat().st_size > 0
    with pytest.raises(SystemExit, match="--overwrite"):  # a second run does not silently replace them
        runs.confirm_overwrite(out, arguments.planned_outputs(), arguments.overwrite)


def test_multi_expert_and_finetune_end_to_end(toy_loader, tmp_path, tiny_twitteraae_dir, tiny_encoder_dir):
    out = tmp_path / "results"
    out.mkdir()
    arguments = runs.ReproductionArguments(quick=True, skip_main=True, multi_expert=True, finetune=True, seeds=[3],
                                           twitteraae=tiny_twitteraae_dir, finetune_encoder=tiny_encoder_dir,
                                           output_dir=str(out))
    runs.run_multi_expert(arguments, out)
    runs.run_finetune(arguments, out)
    multi = json.loads((out / "hatespeech_multi_expert.json").read_text())
    assert multi["settings"]["aae_share_all_tweets"] == pytest.approx(0.5)  # "he finna go" vs "the store"
    run = multi["runs"][0]
    assert set(run["single"]) == set(hatespeech.EXPERT_COLUMNS)
    assert 0 <= run["multi"]["system_error_aae"] <= 1 and 0 <= run["single"]["annotator"]["system_error_other"] <= 1
    assert sum(run["multi"][f"deferral_rate_{j}"] for j in range(3)) == pytest.approx(1 - run["multi"]["coverage"])
    assert "| A-SM, three experts |" in (out / "hatespeech_multi_expert.md").read_text()
    finetune = (out / "hatespeech_finetune.md").read_text()
    assert "| A-SM, fine-tuned encoder | 64 |" in finetune


# ------------------------------------------------------------------------------------------------ the script
def _script(*args: str) -> subprocess.CompletedProcess:
    """Runs scripts/reproduce_hatespeech.py as a program, importing hf_defer from this checkout."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow  # make test-slow (CI): the quick suite stays under 3 minutes on 2 cores
def test_script_render_only_rewrites_the_committed_results_byte_for_byte(tmp_path):
    names = ["hatespeech_runs.json", "hatespeech_multi_expert.json", "hatespeech_finetune.json"]
    for name in names:
        shutil.copy(ROOT / "results" / name, tmp_path / name)
    (tmp_path / "hatespeech.md").write_text("edited by hand")
    done = _script("--render-only", "--overwrite", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    for name in ("hatespeech.md", "hatespeech_multi_expert.md", "hatespeech_finetune.md"):
        assert (tmp_path / name).read_bytes() == (ROOT / "results" / name).read_bytes(), name
    # The PNG carries the matplotlib version that drew it: byte for byte with the pinned one (constraints.txt), the
    # same image size with another (make test-latest / test-oldest).
    import matplotlib

    png = (tmp_path / "hatespeech_reliability.png").read_bytes()
    committed = (ROOT / "results" / "hatespeech_reliability.png").read_bytes()
    if f"matplotlib=={matplotlib.__version__}\n" in (ROOT / "constraints.txt").read_text():
        assert png == committed
    else:
        assert png[:24] == committed[:24]  # PNG signature and IHDR: width and height


@pytest.mark.slow
def test_script_refuses_to_overwrite_and_reports_bad_options(tmp_path):
    (tmp_path / "hatespeech.md").write_text("edited by hand")
    refused = _script("--render-only", "--output-dir", str(tmp_path))
    assert refused.returncode != 0 and "--overwrite" in refused.stderr
    assert (tmp_path / "hatespeech.md").read_text() == "edited by hand"
    wrong = _script("--seeds", "1", "1", "--output-dir", str(tmp_path / "other"))
    assert wrong.returncode == 2 and "seeds must be distinct" in wrong.stderr


@pytest.mark.parametrize("module", [hatespeech, reporting, runs, statistics])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_markdown_table_checks_its_rows():
    assert reporting.markdown_table(["a", "b"], [[1, "x"]]) == "| a | b |\n|---|---|\n| 1 | x |"
    with pytest.raises(ValueError, match="every row must have 2 cells"):
        reporting.markdown_table(["a", "b"], [[1]])


def test_display_names_come_from_the_surrogate_classes():
    assert [reporting.display_name(s) for s in hatespeech.TABLE2_SURROGATES] == ["S-SM", "S-OvA", "A-OvA", "A-SM"]

