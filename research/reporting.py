"""The HateSpeech reports: markdown rendered from the saved JSON through the templates in `research/templates/`.

Every number in a report comes from the JSON record of its experiment ([`~research.runs`] writes them),
so `reproduce_hatespeech.py --render-only` rewrites the reports without training.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from hf_defer.evaluation.plotting import plot_pooled_reliability
from hf_defer.modeling.surrogates import surrogate_class
from .table2_hatespeech import EXPERT_COLUMNS, TABLE2_SURROGATES
from .statistics import comparable_methods, mean_and_standard_error

METRICS = ("system_error", "coverage", "expert_ece", "budgeted_error_10", "budgeted_error_20", "budgeted_error_30")
"""The metrics of the paper's Table 2, in its column order."""
METRIC_HEADERS = ("Error", "Coverage", "ECE", "Budgeted 10%", "Budgeted 20%", "Budgeted 30%")
"""The column headers of the paper's Table 2."""
HIGHER_IS_BETTER = {"coverage"}

# Cao et al. (2023), Table 2, HateSpeech rows: mean (standard error) in percent over 5 trials, in METRICS order.
PAPER_TABLE2: dict[str, tuple[tuple[str, str], ...]] = {
    "ssm": (("8.65", "0.14"), ("70.19", "1.50"), ("3.95", "0.48"), ("25.48", "0.49"), ("16.80", "0.44"), ("8.97", "0.33")),
    "sova": (("8.65", "0.14"), ("69.90", "0.53"), ("1.77", "0.07"), ("24.19", "0.25"), ("15.89", "0.34"), ("8.78", "0.31")),
    "aova": (("9.64", "0.32"), ("77.20", "0.42"), ("1.73", "0.26"), ("16.525", "0.28"), ("8.80", "0.25"), ("8.56", "0.29")),
    "asm": (("8.06", "0.40"), ("81.98", "0.58"), ("1.53", "0.26"), ("15.07", "0.35"), ("8.06", "0.40"), ("8.06", "0.40")),
}
PAPER_BOLD = {"aova": {"expert_ece"}, "asm": set(METRICS)}  # boldface in the paper


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table (no trailing newline).

    Example:

    ```python
    >>> print(markdown_table(["Method", "Error"], [["A-SM", "7.57"]]))
    | Method | Error |
    |---|---|
    | A-SM | 7.57 |

    ```
    """
    if any(len(row) != len(header) for row in rows):
        raise ValueError(f"every row must have {len(header)} cells, got rows of {sorted({len(r) for r in rows})}.")
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)])


def render_template(name: str, **context: Any) -> str:
    """Renders the report template `research/templates/<name>` with `context` (undefined names are errors)."""
    import jinja2

    folder = Path(__file__).resolve().parent / "templates"
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), keep_trailing_newline=True,
                                     trim_blocks=True, undefined=jinja2.StrictUndefined, autoescape=False)
    return environment.get_template(name).render(**context)


def display_name(surrogate: str) -> str:
    """How reports write a surrogate ("A-SM", ...), from its class in `hf_defer.modeling.surrogates`."""
    return surrogate_class(surrogate).display_name


def _cell(mean: float, error: float, bold: bool = False) -> str:
    text = f"{mean:.2f} ({error:.2f})" if math.isfinite(error) else f"{mean:.2f}"
    return f"**{text}**" if bold else text


def _percent_cell(values: Sequence[float]) -> str:
    """Mean (standard error) in percent of fractions."""
    return _cell(*mean_and_standard_error([100.0 * v for v in values]))


class _Seeds:
    """The runs of a Table 2 record by `(surrogate, seed)`, with per-seed values in percent."""

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self.seeds = sorted({run["seed"] for run in runs})
        self.by = {(run["surrogate"], run["seed"]): run["metrics"] for run in runs}

    def percent(self, surrogate: str, key: str) -> list[float]:
        return [100.0 * self.by[surrogate, seed][key] for seed in self.seeds]

    def mean(self, surrogate: str, key: str) -> float:
        return float(np.mean(self.percent(surrogate, key)))

    def cell(self, surrogate: str, key: str) -> str:
        return _cell(*mean_and_standard_error(self.percent(surrogate, key)))


def results_table(runs: list[dict[str, Any]], surrogates: Sequence[str], with_paper: bool = True,
                  paper: dict[str, tuple[tuple[str, str], ...]] | None = None,
                  paper_bold: dict[str, set[str]] | None = None) -> str:
    """Markdown table in the paper's format: mean (standard error) in percent, best and comparable in bold.

    Args:
        runs (`list[dict]`): per-run records with `surrogate`, `seed` and the metric fractions in `metrics`.
        surrogates (`Sequence[str]`): the methods, in row order.
        with_paper (`bool`, *optional*, defaults to True): add the paper's row under each method.
        paper (`dict`, *optional*): the paper's (mean, error) strings per surrogate in `METRICS` order; defaults to
            its HateSpeech rows, `PAPER_TABLE2`.
        paper_bold (`dict[str, set[str]]`, *optional*): the metrics the paper prints in bold, per surrogate
            (defaults to `PAPER_BOLD`, with `paper` left out; none otherwise).

    Returns:
        `str`: the table.
    """
    if paper is None:
        paper = PAPER_TABLE2
        paper_bold = PAPER_BOLD if paper_bold is None else paper_bold
    paper_bold = paper_bold or {}
    by = _Seeds(runs)
    missing = [(s, seed) for s in surrogates for seed in by.seeds if (s, seed) not in by.by]
    if missing:
        raise ValueError(f"runs must hold every surrogate for every seed; missing (surrogate, seed) pairs {missing}.")
    values = {key: {s: by.percent(s, key) for s in surrogates} for key in METRICS}
    bold = {key: comparable_methods(values[key], key in HIGHER_IS_BETTER) for key in METRICS}
    rows = []
    for s in surrogates:
        rows.append([f"{display_name(s)} (ours, {len(by.seeds)} seeds)",
                     *(_cell(*mean_and_standard_error(values[key][s]), s in bold[key]) for key in METRICS)])
        if with_paper and s in paper:
            rows.append([f"{display_name(s)} (paper)", *(f"**{m} ({e})**" if key in paper_bold.get(s, set()) else
                                                         f"{m} ({e})" for key, (m, e) in zip(METRICS, paper[s]))])
    return markdown_table(["Method", *METRIC_HEADERS], rows)


def _expert_error(run: dict[str, Any]) -> float:
    """Error of the expert on a run's test tweets, from its reliability data (counts and accuracy per bin)."""
    counts = np.asarray(run["reliability"]["counts"], dtype=np.float64)
    accuracy = np.nan_to_num(np.asarray(run["reliability"]["accuracy"], dtype=np.float64))
    return 1.0 - float((counts * accuracy).sum() / counts.sum())


def _spans_and_orders(value: dict[str, dict[str, float]]) -> dict[str, str]:
    """Range and ranking of each metric over the methods (`value[key][surrogate]`, percent)."""
    def span(values: dict[str, float]) -> str:
        return f"{min(values.values()):.1f}–{max(values.values()):.1f} %"

    def order(values: dict[str, float], descending: bool) -> str:
        ranked = sorted(values, key=values.get, reverse=descending)
        return (" > " if descending else " < ").join(display_name(s) for s in ranked)

    return {"error_span": span(value["system_error"]), "error_order": order(value["system_error"], False),
            "coverage_span": span(value["coverage"]), "coverage_order": order(value["coverage"], True),
            "ece_order": order(value["expert_ece"], False), "budget_span": span(value["budgeted_error_10"])}


def _cores(machine: str) -> int | None:
    found = re.search(r"(\d+) CPU cores", machine)
    return int(found.group(1)) if found else os.cpu_count()


def table2_markdown(record: dict[str, Any]) -> str:
    """The text of results/hatespeech.md from the JSON record of the Table 2 runs (`hatespeech_runs.json`)."""
    settings, runs = record["settings"], record["runs"]
    surrogates = [s for s in TABLE2_SURROGATES if s in settings["surrogates"]]
    by = _Seeds(runs)
    keys = ("system_error", "coverage", "expert_ece", "budgeted_error_10")
    ours = {key: {s: by.mean(s, key) for s in surrogates} for key in keys}
    paper = {key: {s: float(PAPER_TABLE2[s][METRICS.index(key)][0]) for s in surrogates} for key in keys}
    comparisons = [[display_name(s), *(f"{ours[k][s]:.2f} vs {paper[k][s]:.2f} ({ours[k][s] - paper[k][s]:+.2f})"
                                       for k in keys[:3]), by.cell(s, "classifier_error")] for s in surrogates]
    estimates = [[display_name(s), by.cell(s, "expert_accuracy_mae"), by.cell(s, "expert_accuracy_wasserstein")]
                 for s in surrogates]

    def closest(key: str) -> str:
        return display_name(min(surrogates, key=lambda s: by.mean(s, key)))

    ece = ours["expert_ece"], paper["expert_ece"]
    return render_template(
        "report_hatespeech.md", quick=settings["quick"], date=settings["date"][:10], seeds=by.seeds,
        epochs=f"{settings['epochs']:g}", seconds=np.mean([r["train_seconds"] for r in runs]),
        cores=_cores(settings["machine"]), momentum=settings["momentum"], learning_rate=settings["learning_rate"],
        batch_size=settings["batch_size"], table=results_table(runs, surrogates),
        estimate_table=markdown_table(["Method", "mean absolute error per tweet",
                                       "Wasserstein distance of the distributions"], estimates),
        closest_mae=closest("expert_accuracy_mae"), closest_wasserstein=closest("expert_accuracy_wasserstein"),
        comparison_table=markdown_table(["Method", "Error: ours vs paper", "Coverage: ours vs paper",
                                         "ECE: ours vs paper", "our classifier error"], comparisons),
        ours=_spans_and_orders(ours), paper=_spans_and_orders(paper),
        classifier_error=float(np.mean([by.mean(s, "classifier_error") for s in surrogates])),
        expert_error=100.0 * float(np.mean([_expert_error(r) for r in runs])),
        ssm_least_calibrated="ssm" in surrogates and max(ece[0], key=ece[0].get) == "ssm" == max(ece[1], key=ece[1].get),
        lower_coverage=all(ours["coverage"][s] < paper["coverage"][s] for s in surrogates))


def multi_expert_markdown(payload: dict[str, Any]) -> str:
    """The text of results/hatespeech_multi_expert.md from its JSON payload (`hatespeech_multi_expert.json`)."""
    settings, records = payload["settings"], payload["runs"]

    def errors(models: list[dict[str, float]]) -> list[str]:
        by_dialect = [_percent_cell([m[key] for m in models]) if all(key in m for m in models) else "–"
                      for key in ("system_error_aae", "system_error_other")]
        return [_percent_cell([m["system_error"] for m in models]), *by_dialect]

    multi = [r["multi"] for r in records]
    rows = [["A-SM, three experts", *errors(multi), _percent_cell([m["coverage"] for m in multi]),
             _percent_cell([m["expert_ece"] for m in multi]),
             *(_percent_cell([m[f"deferral_rate_{j}"] for m in multi]) for j in range(3)),
             *(_percent_cell([m[f"expert_ece_{j}"] for m in multi]) for j in range(3))]]
    single_errors = {}
    for j, column in enumerate(EXPERT_COLUMNS):
        single = [r["single"][column] for r in records]
        single_errors[column] = [m["system_error"] for m in single]
        routed, eces = ["–"] * 3, ["–"] * 3
        routed[j] = _percent_cell([1.0 - m["coverage"] for m in single])
        eces[j] = _percent_cell([m["expert_ece"] for m in single])
        rows.append([f"A-SM, {column} only", *errors(single), _percent_cell([m["coverage"] for m in single]),
                     _percent_cell([m["expert_ece"] for m in single]), *routed, *eces])
    header = ["Model", "Error", "Error on AAE tweets", "Error on other tweets", "Coverage", "mean ECE",
              "routed to annotator", "routed to dialect-biased", "routed to specialist", "ECE annotator",
              "ECE dialect-biased", "ECE specialist"]
    best = min(single_errors, key=lambda c: np.mean(single_errors[c]))
    multi_errors, best_errors = np.array([m["system_error"] for m in multi]), np.array(single_errors[best])
    difference = multi_errors - best_errors
    if len(records) < 2:
        test = "one seed, no test"
    elif np.allclose(difference, difference[0]):
        test = "the same difference on every seed"
    else:
        test = f"paired t-test over seeds: p = {float(stats.ttest_rel(multi_errors, best_errors).pvalue):.3g}"
    by_dialect = None
    if all("system_error_aae" in r["multi"] for r in records):
        def mean_of(key: str, column: str | None = None) -> str:
            return f"{100.0 * float(np.mean([(r['single'][column] if column else r['multi'])[key] for r in records])):.2f}"

        by_dialect = {f"{name}_{part}": mean_of(f"system_error_{part}", column) for part in ("aae", "other")
                      for name, column in (("multi", None), ("dialect", "dialect_biased"), ("annotator", "annotator"))}
    return render_template(
        "report_hatespeech_multi_expert.md", quick=settings["quick"], date=settings["date"][:10],
        num_seeds=len(records), p_aae=settings["p_aae"], p_other=settings["p_other"],
        specialist_p=settings["specialist_p"], aae_share=settings["aae_share_all_tweets"],
        accuracy={c: np.mean([r["expert_accuracy_on_test"][c] for r in records]) for c in EXPERT_COLUMNS},
        table=markdown_table(header, rows), best=best, best_error=np.mean(best_errors) * 100,
        multi_error=np.mean(multi_errors) * 100, test=test, by_dialect=by_dialect,
        on_aae=np.mean([r["dialect_routing_on_aae"] for r in records]),
        on_other=np.mean([r["dialect_routing_on_other"] for r in records]))


def finetune_markdown(payload: dict[str, Any]) -> str:
    """The text of results/hatespeech_finetune.md from its JSON payload (`hatespeech_finetune.json`)."""
    settings, runs = payload["settings"], payload["runs"]
    rows = [[name, run["train_tweets"], f"{run['train_seconds']:.0f} s",
             *(f"{100 * run['metrics'][key]:.2f}" for key in METRICS)] for name, run in runs.items()]
    tuned, subset, full = ({"train_tweets": run["train_tweets"]} | {key: f"{100 * value:.2f} %" for key, value
                                                                     in run["metrics"].items()} for run in runs.values())
    return render_template(
        "report_hatespeech_finetune.md", quick=settings["quick"], date=settings["date"][:10], seed=settings["seed"],
        learning_rate=settings["finetune_lr"], batch_size=settings["finetune_batch_size"],
        epochs=settings["finetune_epochs"], max_length=settings["finetune_max_length"],
        train_size=settings["finetune_train_size"], test_size=settings["finetune_test_size"],
        split_size=full["train_tweets"], tuned=tuned, subset=subset, full=full,
        table=markdown_table(["Model", "train tweets", "train time", *METRIC_HEADERS], rows))


def plot_table2_reliability(record: dict[str, Any], path: str | os.PathLike) -> dict[str, dict[str, list[float]]]:
    """The pooled reliability diagrams of the Table 2 runs, one panel per surrogate in the paper's order."""
    surrogates = [s for s in TABLE2_SURROGATES if s in record["settings"]["surrogates"]]
    return plot_pooled_reliability(
        {display_name(s): [r["reliability"] for r in record["runs"] if r["surrogate"] == s] for s in surrogates}, path)


def render_reports(output: str | os.PathLike) -> str:
    """Rewrites hatespeech.md, the reliability diagrams and (where their JSON exists) hatespeech_multi_expert.md and
    hatespeech_finetune.md in `output` from the saved runs, without training.

    Returns:
        `str`: the markdown of hatespeech.md.
    """
    output = Path(output)
    record = json.loads((output / "hatespeech_runs.json").read_text())
    if not record.get("complete"):
        raise SystemExit(f"{output / 'hatespeech_runs.json'} is from an unfinished reproduction; run it again.")
    text = table2_markdown(record)
    (output / "hatespeech.md").write_text(text)
    plot_table2_reliability(record, output / "hatespeech_reliability.png")
    for name, render in (("hatespeech_multi_expert", multi_expert_markdown), ("hatespeech_finetune", finetune_markdown)):
        if (output / f"{name}.json").exists():
            (output / f"{name}.md").write_text(render(json.loads((output / f"{name}.json").read_text())))
    return text
