#!/usr/bin/env python
"""Reproduce the HateSpeech rows of Table 2 of Cao et al. (NeurIPS 2023) with hf_defer, and go a little further.

Protocol of the paper (and of human_ai_deferral, which it follows): the expert is one random annotator per tweet;
each run re-splits the data 70/10/20 at random; tweets are embedded once into 384-d sentence embeddings; a linear
head with K + 1 = 4 outputs is trained for 50 epochs with SGD (momentum 0.9, learning rate 0.1, cosine annealing,
batch 128, no weight decay) for each surrogate (A-SM, S-SM, S-OvA, A-OvA) and evaluated on the test split. Here the
seed of a run drives the split, the expert draw and the initialisation, and the embeddings come from
all-MiniLM-L6-v2 (the paper used paraphrase-multilingual-MiniLM-L12-v2, which is not available offline).

Outputs (in --output-dir, default results/):

* hatespeech.md: the table in the paper's format (mean (standard error) in percent over seeds, best and
  statistically comparable methods in bold), the paper's numbers beside it, and the discussion of differences;
* hatespeech_runs.json: every run's metrics;
* hatespeech_expert_accuracy.png, hatespeech_reliability.png: Figure 3-style histograms of the estimated against the
  true expert accuracy, and reliability diagrams of the expert-accuracy estimates;
* with --multi-expert: hatespeech_multi_expert.md/.json (three experts, one of them biased against African-American
  English as flagged by TwitterAAE);
* with --finetune: hatespeech_finetune.md/.json (end-to-end fine-tuning of the encoder against the frozen protocol).

Example:

```
HF_HUB_OFFLINE=1 python scripts/reproduce_hatespeech.py --multi-expert   # ~25 min on 2 idle CPU cores, + embeddings once
HF_HUB_OFFLINE=1 python scripts/reproduce_hatespeech.py --quick --output-dir /tmp/q   # smoke run
HF_HUB_OFFLINE=1 python scripts/reproduce_hatespeech.py --render-only --overwrite     # re-write the markdown
```
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from scipy import stats
from tqdm.auto import tqdm
from transformers import PrinterCallback, TrainingArguments

import hf_defer
from hf_defer import DeferralConfig, DeferralTrainer, EncoderForDeferral, deferral_metrics
from hf_defer.data import HATESPEECH_LABELS, default_hatespeech_source, load_hatespeech
from hf_defer.embeddings import add_embeddings, resolve_sentence_encoder
from hf_defer.trainer import check_deferral_dataset

REPO_ROOT = Path(__file__).resolve().parents[1]
SURROGATE_ORDER = ("ssm", "sova", "aova", "asm")  # the row order of the paper's Table 2
DISPLAY_NAMES = {"ssm": "S-SM", "sova": "S-OvA", "aova": "A-OvA", "asm": "A-SM"}
METRICS = ("system_error", "coverage", "expert_ece", "budgeted_error_10", "budgeted_error_20", "budgeted_error_30")
METRIC_HEADERS = ("Error", "Coverage", "ECE", "Budgeted 10%", "Budgeted 20%", "Budgeted 30%")
HIGHER_IS_BETTER = {"coverage"}

# Cao et al. (2023), Table 2, HateSpeech rows: mean (standard error) in percent over 5 trials, in METRICS order.
PAPER_TABLE2: dict[str, tuple[tuple[str, str], ...]] = {
    "ssm": (("8.65", "0.14"), ("70.19", "1.50"), ("3.95", "0.48"), ("25.48", "0.49"), ("16.80", "0.44"), ("8.97", "0.33")),
    "sova": (("8.65", "0.14"), ("69.90", "0.53"), ("1.77", "0.07"), ("24.19", "0.25"), ("15.89", "0.34"), ("8.78", "0.31")),
    "aova": (("9.64", "0.32"), ("77.20", "0.42"), ("1.73", "0.26"), ("16.525", "0.28"), ("8.80", "0.25"), ("8.56", "0.29")),
    "asm": (("8.06", "0.40"), ("81.98", "0.58"), ("1.53", "0.26"), ("15.07", "0.35"), ("8.06", "0.40"), ("8.06", "0.40")),
}
PAPER_BOLD = {"aova": {"expert_ece"}, "asm": set(METRICS)}  # boldface in the paper


# ----------------------------------------------------------------------------------------------------- settings
@dataclass
class Protocol:
    """Hyper-parameters of the linear-head protocol (the paper's appendix, "Details of Model and Optimizer")."""

    epochs: float = 50
    batch_size: int = 128
    learning_rate: float = 0.1
    momentum: float = 0.9
    max_train: int | None = None  # subsample the training split (for --quick)
    verbose: bool = False
    threads: int | None = 1  # torch threads while training a head: its ops are tiny, more threads only add waiting
    in_memory: bool = True  # feed the Trainer InMemoryRows instead of the (slower per batch) datasets.Dataset


@dataclass
class RunResult:
    """Outcome of one training run evaluated on a test split."""

    metrics: dict[str, Any]
    expert_accuracy: np.ndarray  # [N, M] estimated
    experts_right: np.ndarray  # [N, M] bool
    defer: np.ndarray  # [N] bool
    expert: np.ndarray  # [N] chosen expert
    system_right: np.ndarray  # [N] bool: the deferral system's answer (classifier or chosen expert) is right
    train_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def training_arguments(output_dir: str, seed: int, protocol: Protocol, **overrides: Any) -> TrainingArguments:
    """TrainingArguments of the paper's protocol, tuned for speed on CPU.

    SGD with momentum (`optim="sgd"`, `optim_args="momentum=0.9"`), cosine annealing to zero over all steps without
    warm-up, no weight decay; no evaluation, checkpoint or logging during training; single-process data loading.

    Args:
        output_dir (`str`): Trainer output folder (nothing is saved there with these settings).
        seed (`int`): seed of the data order.
        protocol (`Protocol`): epochs, batch size, learning rate, momentum, verbosity.
        overrides: any other `TrainingArguments` field.

    Returns:
        `TrainingArguments`.

    Example:

    ```python
    >>> args = training_arguments("/tmp/out", 0, Protocol(epochs=1))
    >>> args.optim.value, args.lr_scheduler_type.value, args.per_device_train_batch_size
    ('sgd', 'cosine', 128)

    ```
    """
    settings: dict[str, Any] = dict(
        output_dir=output_dir,
        seed=seed,
        num_train_epochs=protocol.epochs,
        per_device_train_batch_size=protocol.batch_size,
        per_device_eval_batch_size=1024,
        learning_rate=protocol.learning_rate,
        optim="sgd",
        optim_args=f"momentum={protocol.momentum}",
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=0.0,  # the paper's plain SGD loop does not clip gradients
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no" if not protocol.verbose else "epoch",
        report_to="none",
        use_cpu=True,
        disable_tqdm=not protocol.verbose,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )
    settings.update(overrides)
    return TrainingArguments(**settings)


# --------------------------------------------------------------------------------------------------------- data
def load_splits(
    seed: int,
    data: str | None = None,
    encoder: str = "sentence-transformers/all-MiniLM-L6-v2",
    cache_dir: str | None = None,
    show_progress: bool = True,
) -> datasets.DatasetDict:
    """HateSpeech split by `seed`, with the random-annotator expert and a `features` column of sentence embeddings.

    Args:
        seed (`int`): seed of the 70/10/20 split and of the expert draw.
        data (`str`, *optional*): the Davidson CSV or a folder holding it; defaults to the copy shipped in hf_defer.
        encoder (`str`, *optional*): sentence encoder (name or folder).
        cache_dir (`str`, *optional*): embedding cache folder (default: `~/.cache/hf_defer/embeddings`).
        show_progress (`bool`, *optional*, defaults to True): progress bar while embedding (first run only).

    Returns:
        `datasets.DatasetDict` with `train`, `validation`, `test`.
    """
    splits = load_hatespeech(data, seed=seed)
    return add_embeddings(splits, encoder, cache_dir=cache_dir, show_progress_bar=show_progress)


def true_expert_accuracy(split: datasets.Dataset) -> np.ndarray:
    """Probability that a random annotator of each tweet gives its (majority) label: `counts[label] / count`.

    Args:
        split (`datasets.Dataset`): with `labels`, `count` and the per-class count columns of HateSpeech.

    Returns:
        `np.ndarray` of shape `[N]`.

    Example:

    ```python
    >>> import datasets
    >>> ds = datasets.Dataset.from_dict({"labels": [1, 2], "count": [3, 4], "hate_speech": [0, 1],
    ...                                  "offensive_language": [3, 1], "neither": [0, 2]})
    >>> true_expert_accuracy(ds).tolist()
    [1.0, 0.5]

    ```
    """
    table = split.with_format("numpy", columns=["labels", "count", *HATESPEECH_LABELS])[:]
    counts = np.stack([table[name] for name in HATESPEECH_LABELS], axis=1)
    return counts[np.arange(len(counts)), table["labels"]] / table["count"]


def _training_view(split: datasets.Dataset, protocol: Protocol, seed: int) -> datasets.Dataset:
    """Only the columns the head-only model reads, optionally subsampled."""
    if protocol.max_train is not None and len(split) > protocol.max_train:
        split = split.shuffle(seed=seed).select(range(protocol.max_train))
    return split.select_columns(["features", "labels", "expert_labels"])


class InMemoryRows(torch.utils.data.Dataset):
    """The rows of a small `datasets.Dataset`, held as numpy columns in memory.

    `datasets` converts every batch from Arrow; for 128 rows of 384 floats that takes about 4.7 ms on a 2-core CPU,
    more than a training step of a linear head. Indexing in-memory numpy columns takes about 0.1 ms, and the
    `DataLoader` fetches a whole batch with one `__getitems__` call. Rows are dicts, as `datasets` gives them, so
    the default [`DataCollatorForDeferral`] collates them.

    Args:
        dataset (`datasets.Dataset`): the rows (every column must be numeric).

    Example:

    ```python
    >>> rows = InMemoryRows(datasets.Dataset.from_dict({"features": [[0.5, 1.0], [2.0, 3.0]], "labels": [0, 1]}))
    >>> len(rows), rows[1]["labels"], rows.__getitems__([1, 0])[0]["features"].tolist()
    (2, np.int64(1), [2.0, 3.0])

    ```
    """

    def __init__(self, dataset: datasets.Dataset) -> None:
        self.columns = {name: np.asarray(values) for name, values in dataset.with_format("numpy")[:].items()}
        self.num_rows = len(dataset)

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {name: column[index] for name, column in self.columns.items()}

    def __getitems__(self, indices: list[int]) -> list[dict[str, np.ndarray]]:
        batch = {name: column[np.asarray(indices)] for name, column in self.columns.items()}
        return [{name: values[row] for name, values in batch.items()} for row in range(len(indices))]


# ------------------------------------------------------------------------------------------------ training runs
def evaluate_logits(logits: np.ndarray, test: datasets.Dataset, surrogate: str, num_experts: int = 1) -> RunResult:
    """Metrics, reliability data and per-example decisions from test logits (`train_seconds` is left at 0)."""
    table = test.with_format("numpy", columns=["labels", "expert_labels"])[:]
    labels, expert_labels = table["labels"], np.asarray(table["expert_labels"])
    metrics = deferral_metrics(logits, labels, expert_labels, surrogate, num_experts, return_reliability=True)
    scorer = hf_defer.get_surrogate(surrogate, logits.shape[1] - num_experts, num_experts)
    logits_t = torch.as_tensor(logits, dtype=torch.float32)
    _, accuracy = scorer.probabilities(logits_t)
    defer, prediction, expert = (t.numpy() for t in scorer.decide(logits_t))
    right = expert_labels.reshape(len(labels), num_experts) == labels[:, None]
    system_right = np.where(defer, right[np.arange(len(labels)), expert], prediction == labels)
    return RunResult(metrics, accuracy.numpy(), right, defer, expert, system_right, 0.0)


def train_head(
    splits: datasets.DatasetDict,
    surrogate: str,
    seed: int,
    protocol: Protocol,
    num_experts: int = 1,
    expert_names: list[str] | None = None,
) -> RunResult:
    """Train a linear deferral head on `features` with [`DeferralTrainer`] and evaluate it on `splits["test"]`.

    Args:
        splits (`datasets.DatasetDict`): `train` and `test` with `features`, `labels`, `expert_labels`.
        surrogate (`str`): `"asm"`, `"ssm"`, `"sova"` or `"aova"`.
        seed (`int`): seed of the initialisation and the data order.
        protocol (`Protocol`): hyper-parameters.
        num_experts (`int`, *optional*, defaults to 1): number of experts M.
        expert_names (`list[str]`, *optional*): names of the experts.

    Returns:
        `RunResult`.
    """
    train = _training_view(splits["train"], protocol, seed)
    test = splits["test"].select_columns(["features", "labels", "expert_labels"])
    feature_size = len(train[0]["features"])
    transformers.set_seed(seed)
    config = DeferralConfig(feature_size=feature_size, num_labels=len(HATESPEECH_LABELS), num_experts=num_experts,
                            surrogate=surrogate, id2label=dict(enumerate(HATESPEECH_LABELS)), expert_names=expert_names)
    model = EncoderForDeferral(config)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as workdir:
        torch.set_num_threads(protocol.threads or threads)
        check_deferral_dataset(train, model, "train_dataset")  # DeferralTrainer checks only datasets.Dataset
        trainer = DeferralTrainer(model=model, args=training_arguments(workdir, seed, protocol),
                                  train_dataset=InMemoryRows(train) if protocol.in_memory else train.with_format("numpy"))
        if not protocol.verbose:
            trainer.remove_callback(PrinterCallback)  # it prints the final training summary even with logging off
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        logits = trainer.predict(test).predictions
        torch.set_num_threads(threads)
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    result = evaluate_logits(np.asarray(logits), test, surrogate, num_experts)
    result.train_seconds = seconds
    return result


# --------------------------------------------------------------------------------------------------- statistics
def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (sample standard deviation / sqrt(n)); the error is NaN for one value.

    Example:

    ```python
    >>> mean_and_standard_error([1.0, 2.0, 3.0])
    (2.0, 0.5773502691896258)

    ```
    """
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ValueError("values must hold at least one number, got none.")
    error = float(array.std(ddof=1) / math.sqrt(array.size)) if array.size > 1 else float("nan")
    return float(array.mean()), error


def comparable_methods(values: dict[str, Sequence[float]], higher_is_better: bool = False,
                       alpha: float = 0.05) -> set[str]:
    """The best method by mean and every method not significantly different from it.

    The methods' runs are paired (run i of every method uses the same split and expert draw), so the test is a
    two-sided paired t-test (`scipy.stats.ttest_rel`) at level `alpha`. With fewer than two runs only the best
    is returned. Identical paired values count as comparable; a constant non-zero difference as different.

    Args:
        values (`dict[str, Sequence[float]]`): one value per run for each method, runs in the same order.
        higher_is_better (`bool`, *optional*, defaults to False): coverage-like metrics.
        alpha (`float`, *optional*, defaults to 0.05): significance level.

    Returns:
        `set[str]`: the methods to highlight.

    Example:

    ```python
    >>> sorted(comparable_methods({"a": [1.0, 1.1, 0.9], "b": [1.05, 1.0, 1.0], "c": [5.0, 5.2, 5.1]}))
    ['a', 'b']

    ```
    """
    if not values:
        raise ValueError("values must name at least one method, got none.")
    arrays = {name: np.asarray(v, dtype=np.float64) for name, v in values.items()}
    lengths = {a.size for a in arrays.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every method needs the same positive number of runs, got {sorted(lengths)}.")
    sign = -1.0 if higher_is_better else 1.0
    best = min(arrays, key=lambda name: sign * arrays[name].mean())
    chosen = {best}
    if lengths.pop() < 2:
        return chosen
    for name, array in arrays.items():
        if name == best:
            continue
        difference = array - arrays[best]
        if np.allclose(difference, difference[0]):  # the t statistic is undefined for a constant difference
            if np.isclose(difference[0], 0.0):
                chosen.add(name)
            continue
        if stats.ttest_rel(array, arrays[best]).pvalue >= alpha:
            chosen.add(name)
    return chosen


def _cell(mean: float, error: float, bold: bool = False) -> str:
    text = f"{mean:.2f} ({error:.2f})" if math.isfinite(error) else f"{mean:.2f}"
    return f"**{text}**" if bold else text


def _runs_by_seed(runs: list[dict[str, Any]]) -> tuple[list[int], dict, Callable[[str, str], list[float]]]:
    """The seeds of `runs`, their metrics by `(surrogate, seed)`, and `percent(surrogate, key)`: one value per seed."""
    seeds = sorted({run["seed"] for run in runs})
    by = {(run["surrogate"], run["seed"]): run["metrics"] for run in runs}

    def percent(surrogate: str, key: str) -> list[float]:
        return [100.0 * by[surrogate, seed][key] for seed in seeds]

    return seeds, by, percent


def results_table(runs: list[dict[str, Any]], surrogates: Sequence[str], with_paper: bool = True) -> str:
    """Markdown table in the paper's format: mean (standard error) in percent, best and comparable in bold.

    Args:
        runs (`list[dict]`): per-run records with `surrogate`, `seed` and the metric fractions in `metrics`.
        surrogates (`Sequence[str]`): the methods, in row order.
        with_paper (`bool`, *optional*, defaults to True): add the paper's row under each method.

    Returns:
        `str`: the table.
    """
    seeds, by, percent = _runs_by_seed(runs)
    missing = [(s, seed) for s in surrogates for seed in seeds if (s, seed) not in by]
    if missing:
        raise ValueError(f"runs must hold every surrogate for every seed; missing (surrogate, seed) pairs {missing}.")
    values = {key: {s: percent(s, key) for s in surrogates} for key in METRICS}
    bold = {key: comparable_methods(values[key], key in HIGHER_IS_BETTER) for key in METRICS}
    lines = ["| Method | " + " | ".join(METRIC_HEADERS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for s in surrogates:
        cells = [_cell(*mean_and_standard_error(values[key][s]), s in bold[key]) for key in METRICS]
        lines.append(f"| {DISPLAY_NAMES[s]} (ours, {len(seeds)} seeds) | " + " | ".join(cells) + " |")
        if with_paper and s in PAPER_TABLE2:
            paper = [f"**{m} ({e})**" if key in PAPER_BOLD.get(s, set()) else f"{m} ({e})"
                     for key, (m, e) in zip(METRICS, PAPER_TABLE2[s])]
            lines.append(f"| {DISPLAY_NAMES[s]} (paper) | " + " | ".join(paper) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ figures
def plot_expert_accuracy(estimates: dict[str, np.ndarray], true: np.ndarray, path: Path) -> None:
    """Figure 3 of the paper for HateSpeech: histograms of the estimated and the true expert accuracy per method.

    Args:
        estimates (`dict[str, np.ndarray]`): estimated accuracy of the expert on the test tweets, per surrogate.
        true (`np.ndarray`): the true accuracy of the same tweets (`counts[label] / count`), in the same order.
        path (`Path`): PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(estimates)
    figure, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2), sharey=True, squeeze=False)
    bins = np.linspace(0.0, 1.0, 26)
    for axis, name in zip(axes[0], names):
        axis.hist(true, bins=bins, density=True, alpha=0.5, color="tab:gray", label="true")
        axis.hist(np.clip(estimates[name], 0.0, 1.0), bins=bins, density=True, alpha=0.6, color="tab:blue",
                  label="estimated")
        axis.set_title(DISPLAY_NAMES.get(name, name))
        axis.set_xlabel("expert accuracy Pr(M = Y | x)")
    axes[0][0].set_ylabel("density")
    axes[0][0].legend(loc="upper left")
    figure.suptitle("HateSpeech test tweets: estimated vs. true accuracy of a random annotator")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def pool_reliability(diagrams: Sequence[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Merge reliability-diagram data of several runs (same bins): counts add, means are count-weighted.

    Example:

    ```python
    >>> a = {"bin_edges": [0, 0.5, 1], "counts": [1, 1], "mean_confidence": [0.2, 0.9], "accuracy": [0.0, 1.0]}
    >>> b = {"bin_edges": [0, 0.5, 1], "counts": [0, 3], "mean_confidence": [float("nan"), 0.7], "accuracy": [float("nan"), 0.5]}
    >>> pool_reliability([a, b])["accuracy"]
    [0.0, 0.625]

    ```
    """
    if not diagrams:
        raise ValueError("diagrams must hold at least one reliability diagram, got none.")
    edges = diagrams[0]["bin_edges"]
    if any(d["bin_edges"] != edges for d in diagrams):
        raise ValueError("diagrams must share their bin edges.")
    counts = np.sum([np.asarray(d["counts"], dtype=np.float64) for d in diagrams], axis=0)
    pooled = {"bin_edges": list(edges), "counts": counts.astype(int).tolist()}
    for key in ("mean_confidence", "accuracy"):
        weighted = np.sum([np.nan_to_num(np.asarray(d[key], dtype=np.float64)) * np.asarray(d["counts"]) for d in diagrams],
                          axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            pooled[key] = (weighted / counts).tolist()
    return pooled


def plot_reliability(diagrams: dict[str, Sequence[dict[str, list[float]]]], path: Path,
                     min_count: int = 30) -> dict[str, dict[str, list[float]]]:
    """Reliability diagrams of the expert-accuracy estimates, one panel per method, runs pooled.

    Args:
        diagrams (`dict[str, Sequence[dict]]`): per method, the `reliability` data of [`deferral_metrics`] of
            each run (bins of [`reliability_bins`]).
        path (`Path`): PNG to write.
        min_count (`int`, *optional*, defaults to 30): bins with fewer tweets are drawn pale.

    Returns:
        `dict`: the pooled reliability data drawn, per method.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(diagrams)
    figure, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.4), sharey=True, squeeze=False)
    drawn = {}
    for axis, name in zip(axes[0], names):
        bins = drawn[name] = pool_reliability(diagrams[name])
        edges = np.asarray(bins["bin_edges"])
        counts = np.asarray(bins["counts"])
        accuracy = np.nan_to_num(np.asarray(bins["accuracy"], dtype=np.float64))
        confidence = np.nan_to_num(np.asarray(bins["mean_confidence"], dtype=np.float64))
        colors = ["tab:blue" if count >= min_count else "lightsteelblue" for count in counts]
        axis.bar(edges[:-1], accuracy, width=np.diff(edges), align="edge", edgecolor="black", color=colors,
                 label="observed accuracy")
        axis.plot([0, 1], [0, 1], "--", color="tab:red", label="perfect calibration")
        ece = float(np.sum(counts * np.abs(confidence - accuracy)) / counts.sum())
        axis.set_title(f"{DISPLAY_NAMES.get(name, name)} (ECE {100 * ece:.2f} %)")
        axis.set_xlabel("estimated expert accuracy")
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1)
    axes[0][0].set_ylabel("share of tweets the expert got right")
    axes[0][-1].legend(loc="lower right", fontsize="small")
    figure.suptitle(f"Reliability of the expert-accuracy estimates (pale: bins with fewer than {min_count} tweets)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return drawn


# ------------------------------------------------------------------------------------------------ main experiment
def run_main(args: argparse.Namespace, protocol: Protocol, output: Path) -> dict[str, Any]:
    """The Table 2 reproduction: every surrogate x every seed. Writes the markdown, the JSON and the figures.

    The JSON is rewritten after every run (with `"complete": false` until the end), so an interrupted reproduction
    keeps the runs it finished.
    """
    runs: list[dict[str, Any]] = []
    pooled_estimates: dict[str, list[np.ndarray]] = {s: [] for s in args.surrogates}
    pooled_true: list[np.ndarray] = []
    record = {"experiment": "hatespeech_table2", "settings": _settings(args, protocol), "complete": False, "runs": runs}
    progress = tqdm(total=len(args.seeds) * len(args.surrogates), desc="HateSpeech runs", unit="run")
    for seed in args.seeds:
        splits = load_splits(seed, args.data, args.encoder, args.cache_dir, show_progress=True)
        true = true_expert_accuracy(splits["test"])
        pooled_true.append(true)
        for surrogate in args.surrogates:
            result = train_head(splits, surrogate, seed, protocol)
            metrics = {k: v for k, v in result.metrics.items() if k != "reliability"}
            metrics |= {f"expert_accuracy_{k}": v for k, v in estimate_errors(result.expert_accuracy[:, 0], true).items()}
            runs.append({"surrogate": surrogate, "seed": seed, "metrics": metrics,
                         "reliability": result.metrics["reliability"], "train_seconds": result.train_seconds,
                         "num_train": min(len(splits["train"]), protocol.max_train or len(splits["train"])),
                         "num_test": len(splits["test"])})
            _write_json(output / "hatespeech_runs.json", record)
            pooled_estimates[surrogate].append(result.expert_accuracy[:, 0])
            progress.update()
            progress.set_postfix(seed=seed, surrogate=surrogate, error=f"{metrics['system_error']:.4f}")
    progress.close()
    surrogates = [s for s in SURROGATE_ORDER if s in args.surrogates]
    estimates = {s: np.concatenate(pooled_estimates[s]) for s in surrogates}
    plot_expert_accuracy(estimates, np.concatenate(pooled_true), output / "hatespeech_expert_accuracy.png")
    plot_reliability({s: [r["reliability"] for r in runs if r["surrogate"] == s] for s in surrogates},
                     output / "hatespeech_reliability.png")
    record["complete"] = True
    _write_json(output / "hatespeech_runs.json", record)
    table = results_table(runs, surrogates)
    (output / "hatespeech.md").write_text(main_markdown(table, runs, surrogates, args, protocol))
    print(table)
    return record


def estimate_errors(estimate: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """How far estimated expert accuracies are from the true ones, per tweet and as distributions.

    Returns `mae`, the mean absolute error per tweet (the true accuracy of a random annotator is known on
    HateSpeech), and `wasserstein`, the 1-Wasserstein distance between the two distributions (what Figure 3 of the
    paper compares by eye). Estimates are clipped to [0, 1] first, as for the metrics.

    Example:

    ```python
    >>> estimate_errors(np.array([0.5, 1.0]), np.array([1.0, 0.5]))
    {'mae': 0.5, 'wasserstein': 0.0}

    ```
    """
    estimate = np.clip(np.asarray(estimate, dtype=np.float64), 0.0, 1.0)
    true = np.asarray(true, dtype=np.float64)
    if estimate.shape != true.shape or estimate.ndim != 1 or estimate.size == 0:
        raise ValueError(f"estimate and true must be non-empty 1-d arrays of one shape, got {estimate.shape} and {true.shape}.")
    return {"mae": float(np.mean(np.abs(estimate - true))),
            "wasserstein": float(stats.wasserstein_distance(estimate, true))}


def _settings(args: argparse.Namespace, protocol: Protocol) -> dict[str, Any]:
    return {
        "seeds": list(args.seeds), "surrogates": list(args.surrogates), "encoder": args.encoder,
        "data": args.data or default_hatespeech_source() or "the copy shipped in hf_defer", "epochs": protocol.epochs,
        "batch_size": protocol.batch_size, "learning_rate": protocol.learning_rate, "momentum": protocol.momentum,
        "optimizer": "SGD", "schedule": "cosine, no warm-up", "weight_decay": 0.0, "max_train": protocol.max_train,
        "quick": args.quick, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
                   f"({torch.get_num_threads()} threads, {protocol.threads or torch.get_num_threads()} for the linear heads), "
                   f"transformers {transformers.__version__}",
    }


def _write_json(path: Path, record: dict[str, Any]) -> None:
    path.write_text(json.dumps(record, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def main_markdown(table: str, runs: list[dict[str, Any]], surrogates: Sequence[str], args: argparse.Namespace,
                  protocol: Protocol, date: str | None = None) -> str:
    """The text of results/hatespeech.md around the table; every number in it comes from `runs`."""
    seeds, _, percent = _runs_by_seed(runs)

    def mean(s: str, key: str) -> float:
        return float(np.mean(percent(s, key)))

    def cell(s: str, key: str) -> str:
        return _cell(*mean_and_standard_error(percent(s, key)))

    comparisons = []
    for s in surrogates:
        ours = [mean(s, key) for key in ("system_error", "coverage", "expert_ece")]
        paper = [float(PAPER_TABLE2[s][i][0]) for i in range(3)]
        comparisons.append(
            f"| {DISPLAY_NAMES[s]} | " + " | ".join(f"{o:.2f} vs {p:.2f} ({o - p:+.2f})" for o, p in zip(ours, paper))
            + f" | {cell(s, 'classifier_error')} |")
    def closest(key: str) -> str:
        return min(surrogates, key=lambda s: mean(s, key))

    estimate_rows = [f"| {DISPLAY_NAMES[s]} | {cell(s, 'expert_accuracy_mae')} | {cell(s, 'expert_accuracy_wasserstein')} |"
                     for s in surrogates]
    seconds = np.mean([r["train_seconds"] for r in runs])
    quick = "\n> **Quick smoke run** (`--quick`): tiny settings, the numbers are not meaningful.\n" if args.quick else ""
    lines = [
        "# HateSpeech: reproduction of Table 2 (Cao et al., NeurIPS 2023) with hf_defer",
        quick,
        "Generated by `scripts/reproduce_hatespeech.py` on "
        f"{date or datetime.date.today().isoformat()} ({len(seeds)} seeds: {', '.join(map(str, seeds))}; "
        f"{protocol.epochs:g} epochs; mean training time {seconds:.1f} s per run on {os.cpu_count()} CPU cores).",
        "",
        "**Protocol.** Davidson et al. (2017) tweets (24,783; 3 classes: hate speech, offensive, neither). The expert "
        "is one random annotator per tweet, drawn from the annotator counts; its expected accuracy is 0.905. Each "
        "seed re-splits the data 70/10/20 (train/validation/test), redraws the expert and re-initialises the model. "
        "Tweets are embedded with all-MiniLM-L6-v2 (384-d, `hf_defer.embeddings`, cached on disk); a linear head "
        "`EncoderForDeferral(DeferralConfig(feature_size=384, num_labels=3, num_experts=1, surrogate=...))` is "
        f"trained with `DeferralTrainer`: SGD, momentum {protocol.momentum}, learning rate {protocol.learning_rate}, "
        f"cosine annealing without warm-up, batch {protocol.batch_size}, {protocol.epochs:g} epochs, no weight decay. "
        "The test split is evaluated once, at the end; the validation split is not used (no model selection). "
        "For speed the Trainer reads the rows from memory and torch uses one thread (see `benchmarks/README.md`).",
        "",
        "Metrics (percent): Error = system error (0-1 loss of the deferral system), Coverage = share of tweets "
        "not deferred, ECE = expected calibration error (15 bins) of the estimated expert accuracy, Budgeted x % = "
        "system error when at most x % of the test tweets may be deferred (the deferred tweets with the lowest "
        "estimated expert accuracy go back to the classifier). Cells are mean (standard error) over seeds. **Bold**: "
        "the best method and those not significantly different from it (two-sided paired t-test over seeds, 5 %; "
        "lower is better except for coverage). Rows marked *paper* are copied from Table 2 of the paper (5 trials, "
        "bold as printed there).",
        "",
        table,
        "",
        "## Figures",
        "",
        "![Estimated vs true expert accuracy](hatespeech_expert_accuracy.png)",
        "",
        "Distribution of the estimated accuracy of the expert on the test tweets (all seeds pooled) against the true "
        "one, `counts[label] / count`: the chance that a random annotator gives the majority label (like Figure 3 "
        "of the paper, which shows it for CIFAR-10H). The true accuracy takes few values (most tweets have 3 "
        "annotators: 1, 2/3 or 1/3). Distance of the estimates from the truth, in percentage points, mean "
        "(standard error) over seeds: per tweet (mean absolute error) and between the two distributions "
        "(1-Wasserstein distance):",
        "",
        "| Method | mean absolute error per tweet | Wasserstein distance of the distributions |",
        "|---|---|---|",
        *estimate_rows,
        "",
        f"Closest per tweet: {DISPLAY_NAMES[closest('expert_accuracy_mae')]}; closest distribution: "
        f"{DISPLAY_NAMES[closest('expert_accuracy_wasserstein')]}. A small distance between distributions with a "
        "large error per tweet means estimates in the right range but attached to the wrong tweets.",
        "",
        "![Reliability diagrams](hatespeech_reliability.png)",
        "",
        "Reliability diagrams of the same estimates (the 15 equal-width bins of the ECE, all seeds pooled; the "
        "ECE in each title is that of the pooled bins).",
        "",
        "## Where and why the numbers differ from the paper",
        "",
        "| Method | Error: ours vs paper | Coverage: ours vs paper | ECE: ours vs paper | our classifier error |",
        "|---|---|---|---|---|",
        *comparisons,
        "",
        "(Classifier error: argmax over the classes on all test tweets, no deferral; the paper does not report it.)",
        "",
        *differences(runs, surrogates),
        "",
        "Per-run metrics (fractions, not percent) are in `hatespeech_runs.json`.",
    ]
    lines += ["", "Further experiments, written by the same script: [three experts, one biased against African-American "
              "English](hatespeech_multi_expert.md) (`--multi-expert`) and [end-to-end fine-tuning of the encoder]"
              "(hatespeech_finetune.md) (`--finetune`)."]
    return "\n".join(lines) + "\n"


def _expert_error(run: dict[str, Any]) -> float:
    """Error of the expert on a run's test tweets, from its reliability data (counts and accuracy per bin)."""
    counts = np.asarray(run["reliability"]["counts"], dtype=np.float64)
    accuracy = np.nan_to_num(np.asarray(run["reliability"]["accuracy"], dtype=np.float64))
    return 1.0 - float((counts * accuracy).sum() / counts.sum())


def differences(runs: list[dict[str, Any]], surrogates: Sequence[str]) -> list[str]:
    """Bullet points on where our numbers differ from the paper's and why; the numbers come from `runs`."""
    percent = _runs_by_seed(runs)[2]

    def mean(s: str, key: str) -> float:
        return float(np.mean(percent(s, key)))

    def paper(s: str, key: str) -> float:
        return float(PAPER_TABLE2[s][METRICS.index(key)][0])

    def span(values: list[float]) -> str:
        return f"{min(values):.1f}–{max(values):.1f} %"

    def order(values: dict[str, float], descending: bool) -> str:
        ranked = sorted(values, key=values.get, reverse=descending)
        return " > ".join(DISPLAY_NAMES[s] for s in ranked) if descending else " < ".join(DISPLAY_NAMES[s] for s in ranked)

    classifier = float(np.mean([mean(s, "classifier_error") for s in surrogates]))
    expert = 100.0 * float(np.mean([_expert_error(r) for r in runs]))
    ours_cov = {s: mean(s, "coverage") for s in surrogates}
    paper_cov = {s: paper(s, "coverage") for s in surrogates}
    ours_ece = {s: mean(s, "expert_ece") for s in surrogates}
    paper_ece = {s: paper(s, "expert_ece") for s in surrogates}
    ours_err = {s: mean(s, "system_error") for s in surrogates}
    paper_err = {s: paper(s, "system_error") for s in surrogates}
    budget = [mean(s, "budgeted_error_10") for s in surrogates]
    paper_budget = [paper(s, "budgeted_error_10") for s in surrogates]
    weaker = "above" if classifier > expert else "below"
    return [
        f"* **Errors.** Our system errors span {span(list(ours_err.values()))}, the paper's "
        f"{span(list(paper_err.values()))}; ranked from best: ours {order(ours_err, False)}, paper "
        f"{order(paper_err, False)}.",
        f"* **Coverage**: ours {span(list(ours_cov.values()))}, the paper's "
        f"{span(list(paper_cov.values()))}. Our linear classifier's error (mean {classifier:.1f} % over methods) is "
        f"{weaker} the expert's ({expert:.1f} % on the same test tweets), so a deferral model that learns "
        "Pr(M = Y | x) well should send many tweets to the expert. The features set the classifier's error: the "
        "paper (following `human_ai_deferral`) embeds tweets with `paraphrase-multilingual-MiniLM-L12-v2`, which is "
        "not available offline; we use `all-MiniLM-L6-v2` (also 384-d, but 6 instead of 12 layers, different "
        "training data, unit-normalised outputs). A stronger classifier relative to the expert means higher "
        "coverage, which is the likely source of the gap. We could not test it with the paper's encoder, but a "
        "stronger classifier of our own, [MiniLM fine-tuned end to end](hatespeech_finetune.md), does raise A-SM's "
        "coverage. The "
        f"ranking by coverage is ours {order(ours_cov, True)}, paper {order(paper_cov, True)}.",
        f"* **Calibration.** ECE ranked from best: ours {order(ours_ece, False)}, paper {order(paper_ece, False)}."
        + (" The unbounded S-SM estimator (p_{K+1} / (1 - p_{K+1}), clipped to [0, 1]) is the least calibrated in "
           "both, as the paper argues for unbounded estimators."
           if "ssm" in surrogates and max(ours_ece, key=ours_ece.get) == "ssm" == max(paper_ece, key=paper_ece.get)
           else ""),
        f"* **Budgeted errors.** At a 10 % budget ours span {span(budget)} against the paper's {span(paper_budget)}. "
        "When the budget binds, the tweets sent back go to the deferral model's classifier, whose error there "
        "depends on how much the surrogate let it neglect deferred tweets; the paper's S-SM/S-OvA figures (about "
        "25 %) imply far worse classifiers on those tweets than we see."
        + (" Our coverage is lower, so the budget binds more often here (at 20 % and 30 % too)."
           if all(ours_cov[s] < paper_cov[s] for s in surrogates) else ""),
        "* **Splits and expert draws.** As in the paper, every run re-splits the data and redraws the annotator, "
        "but from our seeds (the paper's are unknown). With about 4,957 test tweets, one binomial standard error of "
        "an error rate near 8 % is about 0.4 points, the size of the paper's own standard errors.",
        "* **Statistics.** Bold uses a paired t-test, because our methods share splits and expert draws; the paper "
        "does not say which t-test it used.",
    ]


# ----------------------------------------------------------------------------------------------- multiple experts
EXPERT_COLUMNS = ("annotator", "dialect_biased", "hate_specialist")


def add_three_experts(splits: datasets.DatasetDict, aae_of: dict[str, bool], seed: int, p_aae: float,
                      p_other: float, specialist_p: float) -> datasets.DatasetDict:
    """Give every split the three experts of the multi-expert experiment, as `expert_labels` of width 3.

    Expert 0 is the random annotator already in `expert_labels`; expert 1 is right with probability `p_aae` on
    tweets TwitterAAE flags as African-American English and `p_other` elsewhere (uniformly random otherwise);
    expert 2 knows only the hate-speech class (right with probability `specialist_p` on it, random elsewhere).
    The original columns stay: `annotator`, `dialect_biased`, `hate_specialist` and the flag `aae`.

    Args:
        splits (`datasets.DatasetDict`): HateSpeech splits with `text`, `labels`, `expert_labels`.
        aae_of (`dict[str, bool]`): AAE flag of every tweet text.
        seed (`int`): seed of the simulated experts.
        p_aae, p_other (`float`): accuracy parameters of the dialect-biased expert.
        specialist_p (`float`): accuracy parameter of the hate-speech specialist.

    Returns:
        `datasets.DatasetDict`.
    """
    from hf_defer.aae import dialect_biased_expert
    from hf_defer.experts import class_subset_expert, stack_experts

    rng = np.random.default_rng([seed, 2023])
    out = {}
    for name, split in splits.items():
        split = split.rename_column("expert_labels", "annotator")
        split = split.add_column("aae", [aae_of[text] for text in split["text"]])
        split = dialect_biased_expert(split, "aae", len(HATESPEECH_LABELS), p_aae, p_other, seed=rng,
                                      column="dialect_biased")
        split = class_subset_expert(split, len(HATESPEECH_LABELS), k=1, p=specialist_p, seed=rng,
                                    column="hate_specialist")
        stacked = stack_experts(split, list(EXPERT_COLUMNS), remove_columns=False)
        out[name] = stacked
    return datasets.DatasetDict(out)


def run_multi_expert(args: argparse.Namespace, protocol: Protocol, output: Path) -> dict[str, Any]:
    """Three experts vs the best single expert, A-SM, every seed. Writes hatespeech_multi_expert.md/.json."""
    from hf_defer.aae import TwitterAAE

    twitteraae = args.twitteraae or os.environ.get("HF_DEFER_TWITTERAAE") or "the copy shipped in hf_defer"
    dialect = TwitterAAE(args.twitteraae)
    aae_of: dict[str, bool] = {}  # dialect flag of every tweet text seen so far
    records = []
    progress = tqdm(total=len(args.seeds) * (1 + len(EXPERT_COLUMNS)), desc="multi-expert runs", unit="run")
    for seed in args.seeds:
        splits = load_splits(seed, args.data, args.encoder, args.cache_dir)
        texts = sorted({text for split in splits.values() for text in split["text"]} - aae_of.keys())
        chunks = range(0, len(texts), 1000)
        for i in tqdm(chunks, desc="TwitterAAE dialect (x1000 tweets)", disable=not texts):
            aae_of.update(zip(texts[i:i + 1000], dialect.is_aae(texts[i:i + 1000]).tolist()))
        splits = add_three_experts(splits, aae_of, seed, args.p_aae, args.p_other, args.specialist_p)
        multi = train_head(splits, "asm", seed, protocol, num_experts=3, expert_names=list(EXPERT_COLUMNS))
        test_aae = np.asarray(splits["test"].with_format("numpy", columns=["aae"])[:]["aae"])
        to_dialect = multi.defer & (multi.expert == 1)
        def by_dialect(result: RunResult) -> dict[str, float]:
            return {"system_error_aae": float(1 - result.system_right[test_aae].mean()),
                    "system_error_other": float(1 - result.system_right[~test_aae].mean())}

        record = {"seed": seed, "multi": {k: v for k, v in multi.metrics.items() if k != "reliability"} | by_dialect(multi),
                  "dialect_routing_on_aae": float(to_dialect[test_aae].mean()),
                  "dialect_routing_on_other": float(to_dialect[~test_aae].mean()),
                  "test_aae_share": float(test_aae.mean()), "expert_accuracy_on_test": {}, "single": {}}
        for j, column in enumerate(EXPERT_COLUMNS):
            record["expert_accuracy_on_test"][column] = float(multi.experts_right[:, j].mean())
        progress.update()
        for column in EXPERT_COLUMNS:
            single = datasets.DatasetDict({n: s.remove_columns("expert_labels").rename_column(column, "expert_labels")
                                           for n, s in splits.items()})
            result = train_head(single, "asm", seed, protocol)
            record["single"][column] = {k: v for k, v in result.metrics.items() if k != "reliability"} | by_dialect(result)
            progress.update()
        records.append(record)
    progress.close()
    payload = {"experiment": "hatespeech_multi_expert", "settings": _settings(args, protocol) | {
        "p_aae": args.p_aae, "p_other": args.p_other, "specialist_p": args.specialist_p,
        "aae_share_all_tweets": float(np.mean(list(aae_of.values()))), "twitteraae": twitteraae}, "runs": records}
    _write_json(output / "hatespeech_multi_expert.json", payload)
    text = multi_expert_markdown(records, args, payload["settings"]["aae_share_all_tweets"])
    (output / "hatespeech_multi_expert.md").write_text(text)
    print(text)
    return payload


def multi_expert_markdown(records: list[dict[str, Any]], args: argparse.Namespace, aae_share: float,
                          date: str | None = None) -> str:
    """The text of results/hatespeech_multi_expert.md; every number comes from `records`."""
    def ms(values: Sequence[float]) -> str:
        return _cell(*mean_and_standard_error([100.0 * v for v in values]))

    def errors(models: list[dict[str, float]]) -> list[str]:
        by_dialect = [ms([m[key] for m in models]) if all(key in m for m in models) else "–"
                      for key in ("system_error_aae", "system_error_other")]
        return [ms([m["system_error"] for m in models]), *by_dialect]

    rows = ["| Model | Error | Error on AAE tweets | Error on other tweets | Coverage | mean ECE | routed to annotator "
            "| routed to dialect-biased | routed to specialist | ECE annotator | ECE dialect-biased | ECE specialist |",
            "|---" * 12 + "|"]
    multi = [r["multi"] for r in records]
    rows.append("| A-SM, three experts | " + " | ".join(
        errors(multi) + [ms([m["coverage"] for m in multi]), ms([m["expert_ece"] for m in multi])]
        + [ms([m[f"deferral_rate_{j}"] for m in multi]) for j in range(3)]
        + [ms([m[f"expert_ece_{j}"] for m in multi]) for j in range(3)]) + " |")
    single_errors = {}
    for j, column in enumerate(EXPERT_COLUMNS):
        single = [r["single"][column] for r in records]
        single_errors[column] = [m["system_error"] for m in single]
        routed = ["–"] * 3
        routed[j] = ms([1.0 - m["coverage"] for m in single])
        eces = ["–"] * 3
        eces[j] = ms([m["expert_ece"] for m in single])
        rows.append(f"| A-SM, {column} only | " + " | ".join(
            errors(single) + [ms([m["coverage"] for m in single]), ms([m["expert_ece"] for m in single])]
            + routed + eces) + " |")
    best = min(single_errors, key=lambda c: np.mean(single_errors[c]))
    multi_errors = np.array([m["system_error"] for m in multi])
    best_errors = np.array(single_errors[best])
    difference = multi_errors - best_errors
    if len(records) < 2:
        test = "one seed, no test"
    elif np.allclose(difference, difference[0]):
        test = "the same difference on every seed"
    else:
        test = f"paired t-test over seeds: p = {float(stats.ttest_rel(multi_errors, best_errors).pvalue):.3g}"
    dialect_note = ""
    if all("system_error_aae" in r["multi"] for r in records):
        def mean_of(key: str, column: str | None = None) -> float:
            return 100.0 * float(np.mean([(r["single"][column] if column else r["multi"])[key] for r in records]))

        dialect_note = (
            f" On AAE tweets the three-expert model errs on {mean_of('system_error_aae'):.2f} % against "
            f"{mean_of('system_error_aae', 'dialect_biased'):.2f} % for the dialect-biased expert alone and "
            f"{mean_of('system_error_aae', 'annotator'):.2f} % for the annotator alone; on the other tweets "
            f"{mean_of('system_error_other'):.2f} %, {mean_of('system_error_other', 'dialect_biased'):.2f} % and "
            f"{mean_of('system_error_other', 'annotator'):.2f} %.")
    accuracy = {c: np.mean([r["expert_accuracy_on_test"][c] for r in records]) for c in EXPERT_COLUMNS}
    on_aae = np.mean([r["dialect_routing_on_aae"] for r in records])
    on_other = np.mean([r["dialect_routing_on_other"] for r in records])
    quick = "\n> **Quick smoke run** (`--quick`): the numbers are not meaningful.\n" if args.quick else ""
    return "\n".join([
        "# HateSpeech with three experts",
        quick,
        f"Generated by `scripts/reproduce_hatespeech.py --multi-expert` on {date or datetime.date.today().isoformat()} "
        f"({len(records)} seeds; same linear-head protocol and embeddings as [the Table 2 reproduction](hatespeech.md)).",
        "",
        "Experts (labels drawn once per tweet, seeded):",
        f"* **annotator**: one random annotator, as in the paper (test accuracy {100 * accuracy['annotator']:.1f} %);",
        f"* **dialect_biased**: right with probability {args.p_aae} on tweets that the TwitterAAE model "
        f"(Blodgett et al., 2016; CVB0 inference in `hf_defer.aae`) flags as African-American English and "
        f"{args.p_other} on the others, a uniformly random label otherwise (test accuracy "
        f"{100 * accuracy['dialect_biased']:.1f} %). TwitterAAE flags {100 * aae_share:.1f} % of the tweets as AAE "
        "(dialect = argmax of the four demographic proportions; URLs and @mentions removed before inference);",
        f"* **hate_specialist**: `class_subset_expert(k=1, p={args.specialist_p})`: right with probability "
        f"{args.specialist_p} on hate speech (class 0), random elsewhere (test accuracy "
        f"{100 * accuracy['hate_specialist']:.1f} %).",
        "",
        "Multi-expert A-SM (`num_experts=3`) against A-SM trained with each expert alone; percent, mean (standard "
        "error) over seeds. *routed to j* is the share of test tweets deferred to expert j; ECE j is the calibration "
        "error of the estimated accuracy of expert j.",
        "",
        *rows,
        "",
        f"Best single expert: **{best}** ({np.mean(best_errors) * 100:.2f} % error); three experts: "
        f"{np.mean(multi_errors) * 100:.2f} % ({test}).",
        "",
        f"Routing to the dialect-biased expert: {100 * on_aae:.1f} % of AAE test tweets vs {100 * on_other:.1f} % "
        "of the other test tweets: the model learns from the expert's mistakes which tweets not to send it."
        + dialect_note,
        "",
    ])


# --------------------------------------------------------------------------------------------------- fine-tuning
def run_finetune(args: argparse.Namespace, protocol: Protocol, output: Path) -> dict[str, Any]:
    """End-to-end fine-tuning of the encoder with A-SM against the frozen protocol on the same split."""
    seed = args.seeds[0]
    splits = load_splits(seed, args.data, args.encoder, args.cache_dir)
    encoder_path = args.finetune_encoder or resolve_sentence_encoder(args.encoder)
    finetuned = finetune_encoder(splits, encoder_path, seed, train_size=args.finetune_train_size,
                                 max_length=args.finetune_max_length, epochs=args.finetune_epochs,
                                 learning_rate=args.finetune_lr, batch_size=args.finetune_batch_size,
                                 test_size=args.finetune_test_size, verbose=protocol.verbose)
    test = finetuned.extra["test"]
    subset = datasets.DatasetDict({"train": finetuned.extra["train"], "test": test})
    full = datasets.DatasetDict({"train": splits["train"], "test": test})
    frozen_full = train_head(full, "asm", seed, protocol)
    frozen_subset = train_head(subset, "asm", seed, protocol)
    rows = {"A-SM, fine-tuned encoder": finetuned, "A-SM, frozen encoder, same training subset": frozen_subset,
            "A-SM, frozen encoder, full training split": frozen_full}
    settings = _settings(args, protocol) | {
        "finetune_train_size": len(finetuned.extra["train"]), "finetune_test_size": len(test),
        "finetune_max_length": args.finetune_max_length, "finetune_epochs": args.finetune_epochs,
        "finetune_lr": args.finetune_lr, "finetune_batch_size": args.finetune_batch_size, "seed": seed,
        "finetune_encoder": str(encoder_path)}
    sizes = [len(finetuned.extra["train"]), len(finetuned.extra["train"]), len(splits["train"])]
    payload = {"experiment": "hatespeech_finetune", "settings": settings,
               "runs": {name: {"metrics": {k: v for k, v in r.metrics.items() if k != "reliability"},
                               "train_seconds": r.train_seconds, "train_tweets": size}
                        for (name, r), size in zip(rows.items(), sizes)}}
    _write_json(output / "hatespeech_finetune.json", payload)
    text = finetune_markdown(payload)
    (output / "hatespeech_finetune.md").write_text(text)
    print(text)
    return payload


def finetune_markdown(payload: dict[str, Any]) -> str:
    """The text of results/hatespeech_finetune.md; every number comes from the JSON `payload` of [`run_finetune`]."""
    settings, runs = payload["settings"], payload["runs"]
    lines = ["| Model | train tweets | train time | " + " | ".join(METRIC_HEADERS) + " |",
             "|---" * (len(METRICS) + 3) + "|"]
    for name, run in runs.items():
        cells = [f"{100 * run['metrics'][key]:.2f}" for key in METRICS]
        lines.append(f"| {name} | {run['train_tweets']} | {run['train_seconds']:.0f} s | " + " | ".join(cells) + " |")
    tuned, subset, full = (runs[name] for name in runs)
    split_size = full["train_tweets"]

    def pct(run: dict[str, Any], key: str) -> str:
        return f"{100 * run['metrics'][key]:.2f} %"

    quick = "\n> **Quick smoke run** (`--quick`): the numbers are not meaningful.\n" if settings["quick"] else ""
    return "\n".join([
        "# HateSpeech: fine-tuning the encoder end to end (A-SM)",
        quick,
        f"Generated by `scripts/reproduce_hatespeech.py --finetune` on {settings['date'][:10]}, seed {settings['seed']}.",
        "",
        f"The fine-tuned model is `EncoderForDeferral.from_encoder_pretrained(all-MiniLM-L6-v2, num_labels=3, "
        f"surrogate='asm', pooling='mean')`, trained with `DeferralTrainer` (AdamW, learning rate "
        f"{settings['finetune_lr']:g}, linear decay with 10 % warm-up, batch {settings['finetune_batch_size']}, "
        f"{settings['finetune_epochs']:g} epoch(s), tweets truncated to {settings['finetune_max_length']} tokens). "
        f"**Limited for a 2-core CPU** (the budget was about 30 minutes for the whole run): "
        f"{settings['finetune_train_size']} random training tweets of the {split_size} in the split, evaluated on "
        f"{settings['finetune_test_size']} test tweets. The frozen rows use the paper's linear-head protocol on the "
        "same split and the same test tweets: once on the same training subset, once on the whole training split. "
        "Percent; one run each, so differences under about one point are noise.",
        "",
        *lines,
        "",
        f"Fine-tuning on {tuned['train_tweets']} tweets gives a system error of {pct(tuned, 'system_error')} against "
        f"{pct(subset, 'system_error')} for the frozen encoder on the same tweets and {pct(full, 'system_error')} "
        f"on all {split_size}. Without deferral the fine-tuned classifier errs on {pct(tuned, 'classifier_error')} "
        f"of the test tweets against {pct(full, 'classifier_error')}, and the system answers "
        f"{pct(tuned, 'coverage')} of them itself against {pct(full, 'coverage')}: the better the classifier, the "
        f"fewer tweets are worth deferring. ECE of the expert-accuracy estimate: {pct(tuned, 'expert_ece')} against "
        f"{pct(full, 'expert_ece')}.",
        "",
    ])


def finetune_encoder(
    splits: datasets.DatasetDict,
    encoder_path: str,
    seed: int,
    train_size: int | None = 8000,
    max_length: int = 64,
    epochs: float = 1.0,
    learning_rate: float = 1e-4,
    batch_size: int = 32,
    test_size: int | None = None,
    verbose: bool = False,
) -> RunResult:
    """Fine-tune `encoder_path` end to end with A-SM on a subsample of `splits["train"]`; evaluate on the test split.

    Args:
        splits (`datasets.DatasetDict`): `train` and `test` with `text`, `labels`, `expert_labels`.
        encoder_path (`str`): a folder `AutoModel` and `AutoTokenizer` load.
        seed (`int`): seed of the subsample, the head initialisation and the data order.
        train_size (`int`, *optional*): training tweets to use (None: all).
        max_length (`int`, *optional*, defaults to 64): truncation length in tokens.
        epochs (`float`, *optional*, defaults to 1.0): training epochs.
        learning_rate (`float`, *optional*, defaults to 1e-4): AdamW learning rate.
        batch_size (`int`, *optional*, defaults to 32): training batch size.
        test_size (`int`, *optional*): test tweets to evaluate (None: all).
        verbose (`bool`, *optional*, defaults to False): Trainer progress bars and logs.

    Returns:
        `RunResult`, with the training and test subsets in `extra["train"]`, `extra["test"]`.
    """
    from transformers import AutoTokenizer

    train = splits["train"].shuffle(seed=seed)
    if train_size is not None:
        train = train.select(range(min(train_size, len(train))))
    test = splits["test"] if test_size is None else splits["test"].select(range(min(test_size, len(splits["test"]))))
    tokenizer = AutoTokenizer.from_pretrained(encoder_path)

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        return tokenizer(batch["text"], truncation=True, max_length=max_length)

    keep = ["input_ids", "attention_mask", "token_type_ids", "labels", "expert_labels"]
    train_tokens, test_tokens = (part.map(tokenize, batched=True) for part in (train, test))
    train_tokens, test_tokens = (part.select_columns([c for c in keep if c in part.column_names])
                                 for part in (train_tokens, test_tokens))
    transformers.set_seed(seed)
    model = EncoderForDeferral.from_encoder_pretrained(
        encoder_path, num_labels=len(HATESPEECH_LABELS), surrogate="asm", pooling="mean",
        id2label=dict(enumerate(HATESPEECH_LABELS)))
    with tempfile.TemporaryDirectory() as workdir:
        args = training_arguments(
            workdir, seed, Protocol(epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, verbose=verbose),
            optim="adamw_torch", optim_args=None, lr_scheduler_type="linear", warmup_steps=0.1, weight_decay=0.01,
            max_grad_norm=1.0, per_device_eval_batch_size=64)
        trainer = DeferralTrainer(model=model, args=args, train_dataset=train_tokens, processing_class=tokenizer)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        logits = trainer.predict(test_tokens).predictions
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    result = evaluate_logits(np.asarray(logits), test, "asm")
    result.train_seconds = seconds
    result.extra = {"train": train, "test": test}
    return result


# --------------------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (see `--help`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="one run per seed")
    parser.add_argument("--epochs", type=float, default=50.0, help="training epochs of the linear head")
    parser.add_argument("--surrogates", nargs="+", default=list(SURROGATE_ORDER), choices=list(SURROGATE_ORDER))
    parser.add_argument("--output-dir", default=str(REPO_ROOT / "results"), help="where results are written")
    parser.add_argument("--data", default=None, help="labeled_data.csv or its folder (default: the copy shipped in hf_defer)")
    parser.add_argument("--encoder", default="sentence-transformers/all-MiniLM-L6-v2", help="sentence encoder")
    parser.add_argument("--cache-dir", default=None, help="embedding cache (default ~/.cache/hf_defer/embeddings)")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke run")
    parser.add_argument("--skip-main", action="store_true", help="skip the Table 2 runs")
    parser.add_argument("--multi-expert", action="store_true", help="also run the three-expert experiment")
    parser.add_argument("--twitteraae", default=None, help="TwitterAAE model folder (default: the copy shipped in hf_defer)")
    parser.add_argument("--p-aae", type=float, default=0.6, help="dialect-biased expert: accuracy parameter on AAE")
    parser.add_argument("--p-other", type=float, default=0.9, help="dialect-biased expert: elsewhere")
    parser.add_argument("--specialist-p", type=float, default=0.9, help="hate-speech specialist: on class 0")
    parser.add_argument("--finetune", action="store_true", help="also fine-tune the encoder end to end (slow)")
    parser.add_argument("--finetune-encoder", default=None, help="encoder folder (default: --encoder resolved)")
    parser.add_argument("--finetune-train-size", type=int, default=8000)
    parser.add_argument("--finetune-test-size", type=int, default=None)
    parser.add_argument("--finetune-max-length", type=int, default=64)
    parser.add_argument("--finetune-epochs", type=float, default=1.0)
    parser.add_argument("--finetune-lr", type=float, default=1e-4)
    parser.add_argument("--finetune-batch-size", type=int, default=32)
    parser.add_argument("--overwrite", action="store_true", help="replace existing result files without asking")
    parser.add_argument("--render-only", action="store_true",
                        help="only rewrite the markdown and reliability diagrams from the saved JSON runs")
    parser.add_argument("--threads", type=int, default=1, help="torch threads while training a linear head")
    parser.add_argument("--verbose", action="store_true", help="Trainer progress bars and logs")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds = args.seeds if args.seeds != [0, 1, 2, 3, 4] else [0, 1]
        args.epochs = min(args.epochs, 1.0)
        args.finetune_train_size = min(args.finetune_train_size, 64)
        args.finetune_test_size = args.finetune_test_size or 128
        args.finetune_max_length = min(args.finetune_max_length, 32)
    if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
        parser.error(f"--seeds must be distinct non-negative integers, got {args.seeds}")
    if args.epochs <= 0:
        parser.error(f"--epochs must be positive, got {args.epochs}")
    for name in ("p_aae", "p_other", "specialist_p"):
        if not 0 <= getattr(args, name) <= 1:
            parser.error(f"--{name.replace('_', '-')} must be a probability in [0, 1], got {getattr(args, name)}")
    if args.skip_main and not (args.multi_expert or args.finetune):
        parser.error("--skip-main leaves nothing to run; add --multi-expert or --finetune")
    return args


def render_main(output: Path) -> str:
    """Rewrite hatespeech.md, the reliability diagrams and (where their JSON exists) hatespeech_multi_expert.md and
    hatespeech_finetune.md from the saved runs, without training.

    Returns:
        `str`: the markdown written.
    """
    record = json.loads((output / "hatespeech_runs.json").read_text())
    if not record.get("complete"):
        raise SystemExit(f"{output / 'hatespeech_runs.json'} is from an unfinished reproduction; run it again.")
    settings, runs = record["settings"], record["runs"]
    surrogates = [s for s in SURROGATE_ORDER if s in settings["surrogates"]]
    protocol = Protocol(epochs=settings["epochs"], batch_size=settings["batch_size"],
                        learning_rate=settings["learning_rate"], momentum=settings["momentum"])
    text = main_markdown(results_table(runs, surrogates), runs, surrogates, argparse.Namespace(quick=settings["quick"]),
                         protocol, date=settings["date"][:10])
    (output / "hatespeech.md").write_text(text)
    plot_reliability({s: [r["reliability"] for r in runs if r["surrogate"] == s] for s in surrogates},
                     output / "hatespeech_reliability.png")
    multi = output / "hatespeech_multi_expert.json"
    if multi.exists():
        payload = json.loads(multi.read_text())
        settings = payload["settings"]
        options = argparse.Namespace(**{k: settings[k] for k in ("p_aae", "p_other", "specialist_p", "quick")})
        (output / "hatespeech_multi_expert.md").write_text(
            multi_expert_markdown(payload["runs"], options, settings["aae_share_all_tweets"], settings["date"][:10]))
    finetune = output / "hatespeech_finetune.json"
    if finetune.exists():
        (output / "hatespeech_finetune.md").write_text(finetune_markdown(json.loads(finetune.read_text())))
    return text


def _planned_outputs(args: argparse.Namespace) -> list[str]:
    if args.render_only:
        return ["hatespeech.md", "hatespeech_reliability.png", "hatespeech_multi_expert.md", "hatespeech_finetune.md"]
    names = []
    if not args.skip_main:
        names += ["hatespeech.md", "hatespeech_runs.json", "hatespeech_expert_accuracy.png", "hatespeech_reliability.png"]
    if args.multi_expert:
        names += ["hatespeech_multi_expert.md", "hatespeech_multi_expert.json"]
    if args.finetune:
        names += ["hatespeech_finetune.md", "hatespeech_finetune.json"]
    return names


def confirm_overwrite(output: Path, names: Sequence[str], overwrite: bool) -> None:
    """Ask before replacing result files (or refuse when there is no terminal); `overwrite=True` skips the question."""
    existing = [name for name in names if (output / name).exists()]
    if not existing or overwrite:
        return
    question = f"{output} already holds {', '.join(existing)}. Overwrite? [y/N] "
    if sys.stdin is not None and sys.stdin.isatty():
        if input(question).strip().lower() in ("y", "yes"):
            return
        raise SystemExit("Nothing was run; pass --overwrite or another --output-dir.")
    raise SystemExit(f"{output} already holds {', '.join(existing)}; pass --overwrite to replace them or choose "
                     "another --output-dir.")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    confirm_overwrite(output, _planned_outputs(args), args.overwrite)
    protocol = Protocol(epochs=args.epochs, max_train=2000 if args.quick else None, verbose=args.verbose,
                        threads=args.threads)
    transformers.logging.set_verbosity_warning() if args.verbose else transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    start = time.perf_counter()
    if args.render_only:
        render_main(output)
        print(f"Rewrote the markdown and the reliability diagrams in {output} from the saved runs.")
        return 0
    if args.multi_expert:
        run_multi_expert(args, protocol, output)
    if args.finetune:
        run_finetune(args, protocol, output)
    if not args.skip_main:
        run_main(args, protocol, output)
    print(f"Done in {time.perf_counter() - start:.0f} s; results in {output}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
