"""The ConvAbuse report, results/convabuse.md: rendered from the JSON record of [`run_convabuse`] through
`research/templates/report_convabuse.md`, so `scripts/convabuse.py --render-only` rewrites it without training.

Cells are mean (standard error) over seeds, bold for the best method and those a paired t-test over seeds does not
tell apart ([`comparable_methods`], as in results/hatespeech.md). The splits are fixed, so those errors measure the
training's randomness only; the differences between methods also get a 95 % bootstrap interval over the test items
([`item_difference`]), which measures how much another test set of the same size could move them.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from hf_defer.data.convabuse import CONVABUSE_ANNOTATORS
from hf_defer.evaluation.metrics import expert_keys
from .convabuse_annotators import METHODS, TARGETS
from .reporting import _cell, markdown_table, render_template
from .statistics import comparable_methods, mean_and_standard_error

MAIN = "leave_one_out"
COLUMNS = {"system_error": "Error", "coverage": "Coverage", "expert_ece": "mean ECE",
           "classifier_error": "Classifier error", "budgeted_error_20": "Budgeted 20% (accuracy)",
           "margin_budgeted_error_20": "Budgeted 20% (margin)"}
"""The metrics of the main table and their headers."""
MASKED = ("masked_asm", "masked_ssm", "masked_aova")


class _Runs:
    """The runs of a record by (method, seed), values in percent."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.seeds = sorted({run["seed"] for run in record["runs"]})
        self.by = {(run["method"], run["seed"]): run for run in record["runs"]}
        self.methods = [m for m in METHODS if all((m, seed) in self.by for seed in self.seeds)]

    def has(self, method: str, key: str, target: str = MAIN) -> bool:
        return all(key in self.by[method, seed]["metrics"][target] for seed in self.seeds)

    def percent(self, method: str, key: str, target: str = MAIN) -> list[float]:
        return [100.0 * self.by[method, seed]["metrics"][target][key] for seed in self.seeds]

    def mean(self, method: str, key: str, target: str = MAIN) -> float:
        return float(np.mean(self.percent(method, key, target)))

    def cell(self, method: str, key: str, target: str = MAIN, bold: bool = False) -> str:
        return _cell(*mean_and_standard_error(self.percent(method, key, target)), bold) if self.has(
            method, key, target) else "–"

    def routing(self, method: str, key: str) -> float:
        return float(np.mean([self.by[method, seed]["routing"].get(key, math.nan) for seed in self.seeds]))


def item_difference(errors: Sequence[float], baseline: Sequence[float], seed: int = 0) -> dict[str, float]:
    """Mean difference of two methods' errors on the same test items, in percentage points, with a 95 % percentile
    bootstrap interval over the items (10,000 resamples, `scipy.stats.bootstrap`).

    Example:

    ```python
    >>> difference = item_difference([0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0])
    >>> difference["mean"], difference["low"] <= difference["mean"] <= difference["high"]
    (-50.0, True)

    ```
    """
    difference = 100.0 * (np.asarray(errors, dtype=np.float64) - np.asarray(baseline, dtype=np.float64))
    if difference.ndim != 1 or difference.size < 2:
        raise ValueError(f"errors and baseline must be two equally long 1-d sequences of 2 or more items, got "
                         f"{np.shape(errors)} and {np.shape(baseline)}.")
    mean = float(difference.mean())
    if np.allclose(difference, difference[0]):
        return {"mean": mean, "low": mean, "high": mean}
    result = stats.bootstrap((difference,), np.mean, n_resamples=10_000, method="percentile",
                             rng=np.random.default_rng(seed))
    return {"mean": mean, "low": float(result.confidence_interval.low), "high": float(result.confidence_interval.high)}


def verdict(difference: dict[str, float]) -> str:
    """`"lower"` / `"higher"` where the interval of [`item_difference`] excludes 0, else `"not told apart"`.

    Example:

    ```python
    >>> verdict({"mean": -1.0, "low": -1.5, "high": -0.5}), verdict({"mean": -1.0, "low": -2.0, "high": 0.1})
    ('lower', 'not told apart')

    ```
    """
    return "lower" if difference["high"] < 0 else "higher" if difference["low"] > 0 else "not told apart"


def main_table(runs: _Runs, target: str = MAIN, num_train: dict[str, int] | None = None) -> str:
    """Every method under one target: mean (s.e.) in percent over seeds, bold as in results/hatespeech.md."""
    bold = {}
    for key in COLUMNS:
        values = {m: runs.percent(m, key, target) for m in runs.methods if runs.has(m, key, target)}
        bold[key] = comparable_methods(values, key == "coverage") if values else set()
    rows = [[METHODS[m], (num_train or {}).get(m, ""), *(runs.cell(m, key, target, m in bold[key]) for key in COLUMNS)]
            for m in runs.methods]
    return markdown_table(["Model", "train rows", *COLUMNS.values()], rows)


def annotator_table(record: dict[str, Any]) -> str:
    """Coverage and accuracy of each annotator (test split unless said), under each target."""
    rows = []
    for name, row in record["data"]["annotators"].items():
        rows.append([name, f"{100 * row['coverage_train']:.1f}", f"{100 * row['coverage_test']:.1f}",
                     row["answers_test"], f"{100 * row['train_accuracy']:.1f}",
                     *(f"{100 * row[f'accuracy_{target}']:.1f}" for target in TARGETS)])
    return markdown_table(["Annotator", "labelled, train (%)", "labelled, test (%)", "test answers",
                           "accuracy, train (others' majority)",
                           *(f"accuracy, test: {description}" for description in TARGETS.values())], rows)


def expert_table(runs: _Runs, record: dict[str, Any]) -> str:
    """Per annotator: availability, and for each masked model the share routed to them and the ECE of their estimate."""
    keys = expert_keys(list(CONVABUSE_ANNOTATORS), len(CONVABUSE_ANNOTATORS))
    rows = [["labelled (test)", *(f"{100 * record['data']['annotators'][name]['coverage_test']:.1f}"
                                  for name in CONVABUSE_ANNOTATORS)]]
    for method in (m for m in MASKED if m in runs.methods):
        rows.append([f"{METHODS[method]}: routed", *(runs.cell(method, f"deferral_rate_{key}") for key in keys)])
        rows.append([f"{METHODS[method]}: ECE", *(runs.cell(method, f"expert_ece_{key}") for key in keys)])
    return markdown_table(["percent", *CONVABUSE_ANNOTATORS], rows)


def target_table(runs: _Runs) -> str:
    """System error and coverage of every method under each scoring target."""
    rows = [[METHODS[m], *(runs.cell(m, "system_error", target) for target in TARGETS),
             *(runs.cell(m, "coverage", target) for target in TARGETS)] for m in runs.methods]
    return markdown_table(["Model", *(f"Error: {d}" for d in TARGETS.values()),
                           *(f"Coverage: {d}" for d in TARGETS.values())], rows)


def _percent(value: float) -> str:
    return "–" if math.isnan(value) else f"{100 * value:.2f}"


def routing_table(runs: _Runs) -> str:
    """On the items each model defers: the error of whom it chose against a random or the best available annotator."""
    methods = [m for m in (*MASKED, "drop") if m in runs.methods]
    rows = [[METHODS[m], *(_percent(runs.routing(m, key)) for key in
                           ("deferred", "with_choice", "chosen", "random_available", "best_available", "classifier"))]
            for m in methods]
    return markdown_table(["Model", "deferred (%)", "of which with a choice (%)", "error of the chosen annotator",
                           "of a random available one",
                           "of the best available one (hindsight)", "of the model's classifier"], rows)


def convabuse_markdown(record: dict[str, Any]) -> str:
    """The text of results/convabuse.md from the JSON record of [`run_convabuse`] (`convabuse.json`)."""
    if not record.get("complete"):
        raise ValueError("the ConvAbuse record is from an unfinished run (complete = false); run it again.")
    runs, settings, data, choice = _Runs(record), record["settings"], record["data"], record["choice"]
    annotators = data["annotators"]
    num_train = {run["method"]: run["num_train"] for run in record["runs"] if run["seed"] == runs.seeds[0]}

    # A-SM masked against every other model, item by item (errors averaged over seeds), with a bootstrap interval.
    differences = {m: item_difference(record["item_errors"]["masked_asm"], record["item_errors"][m])
                   for m in runs.methods if m != "masked_asm"}
    for difference in differences.values():
        difference["verdict"] = verdict(difference)
    difference_rows = [[METHODS[m], f"{d['mean']:+.2f}", f"[{d['low']:+.2f}, {d['high']:+.2f}]", d["verdict"]]
                       for m, d in differences.items()]

    # How the target moves the numbers.
    by_target = {target: {m: runs.mean(m, "system_error", target) for m in runs.methods} for target in TARGETS}
    order = {target: " < ".join(METHODS[m] for m in sorted(runs.methods, key=by_target[target].get))
             for target in TARGETS}
    coverage_shift = max(abs(runs.mean(m, "coverage", target) - runs.mean(m, "coverage")) for m in runs.methods
                         for target in TARGETS)
    accuracy = {target: [100 * row[f"accuracy_{target}"] for row in annotators.values()] for target in TARGETS}
    coverage = [100 * row["coverage_test"] for row in annotators.values()]

    # Whom A-SM masked defers to.
    keys = dict(zip(CONVABUSE_ANNOTATORS, expert_keys(list(CONVABUSE_ANNOTATORS), len(CONVABUSE_ANNOTATORS))))
    avoided = [name for name in CONVABUSE_ANNOTATORS if runs.mean("masked_asm", f"deferral_rate_{keys[name]}") < 0.1]
    least_accurate = sorted(choice["train_accuracy"], key=choice["train_accuracy"].get)[:len(avoided)]
    mean = {m: {key: runs.mean(m, key) for key in ("system_error", "coverage", "classifier_error", "expert_ece",
                                                   "budgeted_error_20", "margin_budgeted_error_20")
                if runs.has(m, key)} for m in runs.methods}
    cores = re.search(r"(\d+) CPU cores", settings["machine"])
    return render_template(
        "report_convabuse.md", quick=settings["quick"], date=settings["date"][:10], seeds=runs.seeds,
        epochs=f"{settings['epochs']:g}", seconds=np.mean([run["train_seconds"] for run in record["runs"]]),
        cores=cores.group(1) if cores else os.cpu_count(), context=settings["context"], encoder=settings["encoder"],
        data=data, choice=choice, annotator_table=annotator_table(record), main_table=main_table(runs, MAIN, num_train),
        expert_table=expert_table(runs, record), target_table=target_table(runs), routing_table=routing_table(runs),
        difference_table=markdown_table(["A-SM masked minus", "error difference (points)", "95 % interval (items)",
                                         "A-SM masked is"], difference_rows),
        differences=differences, mean=mean, budget=mean, targets=TARGETS, by_target=by_target,
        errors_by_target={target: by_target[target]["masked_asm"] for target in TARGETS}, order=order,
        same_order={target: order[target] == order[MAIN] for target in TARGETS}, coverage_shift=coverage_shift,
        accuracy_span={target: (min(values), max(values)) for target, values in accuracy.items()},
        coverage_span=(min(coverage), max(coverage)),
        flattered=all(row["accuracy_majority"] > row["accuracy_leave_one_out"] < row["accuracy_dawid_skene"]
                      for row in annotators.values()),
        routed={key: 100 * runs.routing("masked_asm", key) for key in
                ("deferred", "with_choice", "chosen", "random_available", "best_available", "classifier")},
        avoided=avoided, avoided_are_least_accurate=bool(avoided) and set(avoided) == set(least_accurate),
        answer_rate=float(np.mean([row["coverage_train"] for row in annotators.values()])))
