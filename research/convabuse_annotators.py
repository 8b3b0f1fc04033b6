"""ConvAbuse: learning whom to defer to among 8 expert annotators who each labelled a part of the data.

The protocol of `scripts/convabuse.py` (`make convabuse`, results/convabuse.md): the authors' train/validation/test
splits ([`hf_defer.data.load_convabuse`], binary task: abusive or not); the user turn and, apart, its three preceding
turns are embedded with all-MiniLM-L6-v2 and concatenated (768-d, frozen); linear heads are trained with
[`DeferralTrainer`] on the HateSpeech protocol (SGD, momentum 0.9, learning rate 0.1, cosine, batch 128, 50 epochs).
The splits are fixed, so a seed drives only the initialisation and the data order.

There is no gold label. The classifier is trained and scored against the majority of all annotators of the item (a
tied item has no target and is left out); annotator j is trained and scored against the majority of the *other*
annotators of the item (leave-one-out), so nobody is graded against their own vote; where the others tie, the answer
counts 1/2. An annotator is available exactly where they answered (and has a target): a missing answer masks their
terms in the loss, and the decision defers only to those available. [`scoring_targets`] builds both targets, and the
two alternatives the report compares (everyone against the full majority, own vote included, or against
Dawid–Skene).
"""

from __future__ import annotations

import datetime
import itertools
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pandas as pd
import torch
import transformers
from transformers import PrinterCallback

from hf_defer.data.annotations import aggregate_labels
from hf_defer.data.convabuse import CONVABUSE_ANNOTATORS, CONVABUSE_BINARY_NAMES, load_convabuse
from hf_defer.evaluation.metrics import deferral_metrics
from hf_defer.experts.embeddings import DEFAULT_SENTENCE_ENCODER, embed_texts
from hf_defer.modeling.configuration_deferral import DeferralConfig
from hf_defer.modeling.modeling_deferral import EncoderForDeferral
from hf_defer.modeling.surrogate_base import IGNORE_INDEX
from hf_defer.modeling.surrogates import get_surrogate
from hf_defer.training.trainer import DeferralTrainer
from .table2_hatespeech import Protocol, training_arguments
from .runs import write_json

TARGETS = {"leave_one_out": "others' majority (main)", "majority": "full majority, own vote included",
           "dawid_skene": "Dawid–Skene, own vote included"}
"""How an annotator's answer is scored (the classifier: against the full majority, or Dawid–Skene for the last)."""
METHODS = {"masked_asm": "A-SM, 8 annotators masked", "masked_ssm": "S-SM, 8 annotators masked",
           "masked_aova": "A-OvA, 8 annotators masked", "drop": "(a) A-SM, drop incomplete rows",
           "pooled": "(b) A-SM, one pooled expert", "best_single": "(c) A-SM, best single annotator",
           "classifier": "(d) classifier alone"}
"""The compared models, in report order: key -> row name."""
SURROGATE_OF = {"masked_ssm": "ssm", "masked_aova": "aova"}  # every other model is A-SM
POOLED_EXPERT = "whoever_answered"


@dataclass
class ConvAbuseArguments:
    """Options of `scripts/convabuse.py` (parsed with `transformers.HfArgumentParser`).

    Example:

    ```python
    >>> ConvAbuseArguments(quick=True).seeds, ConvAbuseArguments(quick=True).epochs
    ([0], 2.0)

    ```
    """

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4], metadata={"help": "one run per seed"})
    epochs: float = field(default=50.0, metadata={"help": "training epochs of the linear heads"})
    context: bool = field(default=True, metadata={"help": "also embed the three turns before the user turn"})
    encoder: str = field(default=DEFAULT_SENTENCE_ENCODER, metadata={"help": "sentence encoder"})
    cache_dir: str | None = field(default=None, metadata={"help": "embedding cache (default ~/.cache/huggingface)"})
    output_dir: str = field(default="results", metadata={"help": "where convabuse.md/.json are written"})
    max_rows: int | None = field(default=None, metadata={"help": "only the first rows of each split (tests)"})
    quick: bool = field(default=False, metadata={"help": "tiny settings for a smoke run"})
    overwrite: bool = field(default=False, metadata={"help": "replace existing result files without asking"})
    render_only: bool = field(default=False, metadata={"help": "only rewrite convabuse.md from convabuse.json"})
    threads: int = field(default=1, metadata={"help": "torch threads while training a linear head"})
    verbose: bool = field(default=False, metadata={"help": "Trainer progress bars and logs"})

    def __post_init__(self) -> None:
        if self.quick:
            self.seeds = self.seeds if self.seeds != [0, 1, 2, 3, 4] else [0]
            self.epochs = min(self.epochs, 2.0)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"seeds must be distinct non-negative integers, got {self.seeds}.")
        if self.epochs <= 0:
            raise ValueError(f"epochs must be positive, got {self.epochs}.")
        if self.max_rows is not None and self.max_rows < 10:
            raise ValueError(f"max_rows must be at least 10, got {self.max_rows}.")

    def protocol(self) -> Protocol:
        return Protocol(epochs=self.epochs, verbose=self.verbose, threads=self.threads)


def _ids(values: Sequence[Any]) -> np.ndarray:
    """Class ids as int64, -100 where a value is missing (None or NaN)."""
    return np.array([IGNORE_INDEX if value is None or pd.isna(value) else int(value) for value in values],
                    dtype=np.int64)


def scoring_targets(answers: pd.DataFrame, target: str = "leave_one_out",
                    reference: Sequence[Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The classifier's target and each annotator's correctness, under one choice of target.

    - `"leave_one_out"` (the main rule): the classifier against the majority of all annotators of the item; annotator
      j against the majority of the others ([`aggregate_labels`] `method="leave_one_out"`). Where the others tie, j's
      answer scores 1/2, its expected correctness under a coin flip between the two tied classes (binary answers
      only), so availability stays "answered"; an answer with no other answer on its item has no target.
    - `"majority"`: everyone against the majority of all annotators (j's own vote counts: it flatters j).
    - `"dawid_skene"`: everyone against `reference`, e.g. Dawid–Skene labels (j's own vote counts there too).

    An item whose target ties has no label (-100); an answer without a target has correctness -100.

    Args:
        answers (`pandas.DataFrame`): one column per annotator, class ids, `None` or NaN where no answer.
        target (`str`, *optional*, defaults to `"leave_one_out"`): one of [`TARGETS`].
        reference (`Sequence`, *optional*): the labels of `"dawid_skene"` (`None` where tied).

    Returns:
        `(labels, correct)`: int64 `[N]` and float32 `[N, M]` (1.0 right, 0.0 wrong, 0.5 the others tie, -100 no
        answer or no target).

    Raises:
        ValueError: an unknown `target`, a missing or mis-sized `reference`, or a tie among the others of a
            non-binary answer.

    Example:

    ```python
    >>> import pandas as pd
    >>> answers = pd.DataFrame({"a": [1, 1, 0], "b": [1, 0, None], "c": [0, 0, 0]})
    >>> labels, correct = scoring_targets(answers)
    >>> labels.tolist(), correct.tolist()  # row 0: a's others (b, c) tie, c's others (a, b) say 1
    ([1, 0, 0], [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [1.0, -100.0, 1.0]])

    ```
    """
    if target not in TARGETS:
        raise ValueError(f"`target` must be one of {tuple(TARGETS)}, got {target!r}.")
    annotators = [str(column) for column in answers.columns]
    answers = answers.astype(object).where(answers.notna(), None)
    if target == "dawid_skene":
        if reference is None or len(reference) != len(answers):
            raise ValueError(f"target='dawid_skene' needs `reference`, one label per row ({len(answers)}), got "
                             f"{None if reference is None else len(reference)}.")
        labels = _ids(reference)
    else:
        labels = _ids(aggregate_labels(answers, annotators, output_column="_target")["_target"])
    if target == "leave_one_out":
        others = aggregate_labels(answers, annotators, "leave_one_out")
        against = np.column_stack([_ids(others[f"{name}_loo_target"]) for name in annotators])
        tied = np.column_stack([others[f"{name}_loo_tied"].to_numpy(dtype=bool) for name in annotators])
    else:
        against = np.repeat(labels[:, None], len(annotators), axis=1)
        tied = np.zeros(against.shape, dtype=bool)
    given = np.column_stack([_ids(answers[name]) for name in annotators])
    tied &= given != IGNORE_INDEX
    if tied.any() and not np.isin(given[given != IGNORE_INDEX], (0, 1)).all():
        raise ValueError("scoring_targets scores a tie among the others as 1/2, which holds for binary answers (0/1) "
                         f"only; got the answers {sorted(set(given[given != IGNORE_INDEX].tolist()))}.")
    scored = (given != IGNORE_INDEX) & (against != IGNORE_INDEX)
    correct = np.where(scored, (given == against).astype(np.float32), np.float32(IGNORE_INDEX))
    return labels, np.where(tied, np.float32(0.5), correct).astype(np.float32)


def pooled_expert(correct: np.ndarray) -> np.ndarray:
    """One expert, "whoever answered": the mean correctness of the annotators with a scored answer, -100 where none.

    That is the expected correctness of a random one of them, a soft target (the loss is minimised at its mean).

    Example:

    ```python
    >>> pooled_expert(np.array([[1.0, 0.0, -100.0], [-100.0, -100.0, -100.0]])).tolist()
    [[0.5], [-100.0]]

    ```
    """
    observed = correct != IGNORE_INDEX
    count = observed.sum(axis=1)
    mean = np.where(observed, correct, 0.0).sum(axis=1) / np.maximum(count, 1)
    return np.where(count > 0, mean, IGNORE_INDEX).astype(np.float32)[:, None]


def experts_of(method: str, correct: np.ndarray, choice: dict[str, Any], training: bool = False,
               annotators: Sequence[str] = CONVABUSE_ANNOTATORS) -> tuple[list[str], np.ndarray]:
    """The expert names and targets `[N, M]` a method trains (`training`) or is scored with, from the correctness of
    every annotator (`correct`, columns in `annotators` order) and the choices of [`choose_baselines`]."""
    names = list(annotators)
    if method.startswith("masked"):
        return names, correct
    if method == "drop":
        return list(choice["drop"]), correct[:, [names.index(name) for name in choice["drop"]]]
    if method == "best_single":
        return [choice["best_single"]], correct[:, [names.index(choice["best_single"])]]
    if method == "pooled":
        return [POOLED_EXPERT], pooled_expert(correct)
    if method == "classifier":  # trained with an expert who is never right, and who is never there to be asked
        return ["nobody"], np.full((len(correct), 1), 0.0 if training else IGNORE_INDEX, dtype=np.float32)
    raise ValueError(f"`method` must be one of {tuple(METHODS)}, got {method!r}.")


@dataclass
class ConvAbuseData:
    """Features, answers and the targets of every split: `targets[target][split] = (labels, correct)`."""

    features: dict[str, np.ndarray]
    answers: dict[str, pd.DataFrame]
    targets: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]


def load_data(encoder: str = DEFAULT_SENTENCE_ENCODER, context: bool = True, cache_dir: str | None = None,
              show_progress: bool = True, max_rows: int | None = None) -> ConvAbuseData:
    """ConvAbuse's splits (with `max_rows`, the first rows of each) embedded (the user turn, and with `context` its
    three preceding turns, concatenated) with the targets of every rule in [`TARGETS`]; Dawid–Skene is fitted once on
    the annotations of all splits."""
    splits = load_convabuse("binary")
    if max_rows is not None:
        splits = datasets.DatasetDict({name: split.select(range(min(max_rows, len(split))))
                                       for name, split in splits.items()})
    names, sizes = list(splits), [len(split) for split in splits.values()]
    columns = ["text", "context"] if context else ["text"]
    blocks = [embed_texts([text for split in splits.values() for text in split[column]], encoder,
                          cache_dir=cache_dir, show_progress_bar=show_progress) for column in columns]
    features = np.split(np.concatenate(blocks, axis=1), np.cumsum(sizes)[:-1])
    answers = {name: split.select_columns(list(CONVABUSE_ANNOTATORS)).to_pandas() for name, split in splits.items()}
    everyone = pd.concat(answers.values(), ignore_index=True)
    fitted = aggregate_labels(everyone.astype(object).where(everyone.notna(), None), list(CONVABUSE_ANNOTATORS),
                              "dawid_skene", output_column="_ds")["_ds"].tolist()
    reference = dict(zip(names, np.split(np.array(fitted, dtype=object), np.cumsum(sizes)[:-1])))
    targets = {target: {name: scoring_targets(answers[name], target, list(reference[name]))
                        for name in names} for target in TARGETS}
    return ConvAbuseData(dict(zip(names, features)), answers, targets)


def choose_baselines(data: ConvAbuseData) -> dict[str, Any]:
    """From the training split (main target): the best single annotator (accuracy against the others), how many rows
    every annotator answered (none: then no row survives dropping), and the pair of annotators with the most rows
    both answered, which is what dropping incomplete rows can still train on."""
    labels, correct = data.targets["leave_one_out"]["train"]
    scored = (correct != IGNORE_INDEX) & (labels != IGNORE_INDEX)[:, None]
    accuracy = {name: float(correct[scored[:, j], j].mean()) for j, name in enumerate(CONVABUSE_ANNOTATORS)}
    pairs = {pair: int(scored[:, list(pair)].all(axis=1).sum()) for pair in itertools.combinations(range(8), 2)}
    best_pair = max(pairs, key=pairs.get)
    return {"best_single": max(accuracy, key=accuracy.get), "train_accuracy": accuracy,
            "complete_rows": int(scored.all(axis=1).sum()),
            "drop": [CONVABUSE_ANNOTATORS[j] for j in best_pair], "drop_rows": pairs[best_pair]}


def train_head(features: np.ndarray, labels: np.ndarray, targets: np.ndarray, surrogate: str, names: list[str],
               seed: int, protocol: Protocol, test_features: np.ndarray,
               drop: bool = False) -> tuple[np.ndarray, float, int]:
    """Train a linear head on the rows with a label (with `drop`, only rows where every expert has a target) and
    return its test logits, the training seconds and the number of training rows."""
    keep = labels != IGNORE_INDEX
    if drop:
        keep &= (targets != IGNORE_INDEX).all(axis=1)
    rows = np.flatnonzero(keep)
    train = datasets.Dataset.from_dict({"features": features[rows], "labels": labels[rows],
                                        "expert_correct": targets[rows]})
    transformers.set_seed(seed)
    config = DeferralConfig(feature_size=features.shape[1], num_labels=len(CONVABUSE_BINARY_NAMES),
                            num_experts=len(names), surrogate=surrogate, expert_names=names,
                            id2label=dict(enumerate(CONVABUSE_BINARY_NAMES)))
    model, threads = EncoderForDeferral(config), torch.get_num_threads()
    with tempfile.TemporaryDirectory() as workdir:
        torch.set_num_threads(protocol.threads or threads)
        trainer = DeferralTrainer(model=model, args=training_arguments(workdir, seed, protocol), train_dataset=train)
        if not protocol.verbose:
            trainer.remove_callback(PrinterCallback)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        torch.set_num_threads(threads)
    model.eval()
    with torch.no_grad():
        logits = model(features=torch.as_tensor(test_features, dtype=torch.float32)).logits
    return logits.float().numpy(), seconds, len(rows)


def _assigned(scored: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Who may be deferred to on each item: the annotators assigned to it (those who answered it). This experiment
    decides among the annotators of each item, so it passes that availability to `deferral_metrics` explicitly (which,
    since issue 41, no longer infers it from the answers)."""
    return np.asarray(scored).reshape(len(labels), -1) != IGNORE_INDEX


def item_errors(logits: np.ndarray, labels: np.ndarray, targets: np.ndarray, surrogate: str) -> dict[str, np.ndarray]:
    """Per test item with a label: the system's error, whether it deferred, to whom, and the errors of the available
    experts (NaN where unavailable), under the decision of [`deferral_metrics`] (availability = a scored answer)."""
    keep = labels != IGNORE_INDEX
    logits, labels, targets = logits[keep], labels[keep], targets[keep]
    available = targets != IGNORE_INDEX
    scorer = get_surrogate(surrogate, logits.shape[1] - targets.shape[1], targets.shape[1])
    defer, prediction, expert = (t.numpy() for t in scorer.decide(torch.as_tensor(logits), available=available))
    expert_error = np.where(available, 1.0 - targets, np.nan)
    rows = np.arange(len(labels))
    error = np.where(defer, expert_error[rows, expert], (prediction != labels).astype(np.float64))
    return {"error": error, "defer": defer, "expert": expert, "expert_error": expert_error,
            "classifier_error": (prediction != labels).astype(np.float64)}


def routing(decisions: dict[str, np.ndarray]) -> dict[str, float]:
    """On the deferred items: the share with more than one available expert (a choice to make), the error of the
    chosen annotator, of a random available one, of the best available one in hindsight, and of the model's own
    classifier; 'whom' pays where the chosen one errs less than a random one."""
    deferred = decisions["defer"]
    if not deferred.any():
        return {"deferred": 0.0}
    errors = decisions["expert_error"][deferred]
    return {"deferred": float(deferred.mean()), "with_choice": float((np.isfinite(errors).sum(axis=1) > 1).mean()),
            "chosen": float(decisions["error"][deferred].mean()),
            "random_available": float(np.nanmean(errors, axis=1).mean()),
            "best_available": float(np.nanmin(errors, axis=1).mean()),
            "classifier": float(decisions["classifier_error"][deferred].mean())}


def _settings(arguments: ConvAbuseArguments) -> dict[str, Any]:
    return {**asdict(arguments), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.platform()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
                       f"transformers {transformers.__version__}"}


def describe_annotators(data: ConvAbuseData, choice: dict[str, Any]) -> dict[str, Any]:
    """Coverage and accuracy of every annotator on the test split under each target, and what is available."""
    test_labels, test_correct = data.targets["leave_one_out"]["test"]
    answered = data.answers["test"].notna().to_numpy()
    annotators = {}
    for j, name in enumerate(CONVABUSE_ANNOTATORS):
        row = {"coverage_train": float(data.answers["train"][name].notna().mean()),
               "coverage_test": float(answered[:, j].mean()), "answers_test": int(answered[:, j].sum()),
               "scored_test": int((test_correct[:, j] != IGNORE_INDEX).sum()),
               "train_accuracy": choice["train_accuracy"][name]}
        for target in TARGETS:
            correct = data.targets[target]["test"][1][:, j]
            row[f"accuracy_{target}"] = float(correct[correct != IGNORE_INDEX].mean())
        annotators[name] = row
    with_label = test_labels != IGNORE_INDEX
    return {"annotators": annotators, "num_rows": {split: len(a) for split, a in data.answers.items()},
            "labelled": {split: int((data.targets["leave_one_out"][split][0] != IGNORE_INDEX).sum())
                         for split in data.answers},
            "abusive_share_test": float((test_labels[with_label] == 1).mean()),
            "available_test": float((test_correct[with_label] != IGNORE_INDEX).sum(axis=1).mean()),
            "answered_test": float(answered[with_label].sum(axis=1).mean())}


def run_convabuse(arguments: ConvAbuseArguments, output: Path) -> dict[str, Any]:
    """Every method x every seed, scored under every target; writes convabuse.json (rewritten after every seed,
    `"complete": false` until the end) and returns its record (`convabuse_report.convabuse_markdown` renders it)."""
    data = load_data(arguments.encoder, arguments.context, arguments.cache_dir, arguments.verbose, arguments.max_rows)
    choice, protocol = choose_baselines(data), arguments.protocol()
    runs: list[dict[str, Any]] = []
    errors: dict[str, list[np.ndarray]] = {method: [] for method in METHODS}
    record = {"experiment": "convabuse", "settings": _settings(arguments), "complete": False,
              "choice": choice, "data": describe_annotators(data, choice), "runs": runs}
    train_labels, train_correct = data.targets["leave_one_out"]["train"]
    for seed in arguments.seeds:
        for method in METHODS:
            surrogate = SURROGATE_OF.get(method, "asm")
            names, targets = experts_of(method, train_correct, choice, training=True)
            logits, seconds, num_train = train_head(data.features["train"], train_labels, targets, surrogate, names,
                                                    seed, protocol, data.features["test"], drop=method == "drop")
            run = {"method": method, "seed": seed, "train_seconds": seconds, "num_train": num_train, "metrics": {}}
            for target in TARGETS:
                labels, correct = data.targets[target]["test"]
                _, scored = experts_of(method, correct, choice)
                run["metrics"][target] = deferral_metrics(logits, labels, surrogate=surrogate, num_experts=len(names),
                                                          expert_correct=scored, expert_names=names,
                                                          available=_assigned(scored, labels))
            labels, correct = data.targets["leave_one_out"]["test"]
            _, scored = experts_of(method, correct, choice)
            run["metrics"]["leave_one_out"] |= {f"margin_{key}": value for key, value in deferral_metrics(
                logits, labels, surrogate=surrogate, num_experts=len(names), expert_correct=scored,
                expert_names=names, budget_ranking="margin", available=_assigned(scored, labels)).items()
                if key.startswith("budgeted_error")}
            decisions = item_errors(logits, labels, scored, surrogate)
            run["routing"] = routing(decisions)
            errors[method].append(decisions["error"])
            runs.append(run)
        write_json(output / "convabuse.json", record)
    record["item_errors"] = {method: np.round(np.mean(values, axis=0), 4).tolist() for method, values in errors.items()}
    record["complete"] = True
    write_json(output / "convabuse.json", record)
    return record
