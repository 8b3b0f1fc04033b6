"""The ImageNet-16H half of Table 2 of Cao et al. (NeurIPS 2023), as `DeferralTrainer` runs, and its report.

Protocol: at each noise level, each seed re-splits the 1,200 images 70/10/20, redraws the expert (one participant per
image) and re-initialises a linear head with K + 1 = 17 outputs over the 80 log-probabilities of the study's five
fine-tuned CNNs ([`~hf_defer.data.load_imagenet16h`]); the head is trained with Adam (learning rate 1e-3, cosine
annealing, batch 128, 100 epochs, no weight decay) for each surrogate and evaluated once on the test split. The paper
embeds the images with a pre-trained DenseNet instead (not reachable offline); the report says what that changes.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from scipy import stats
from tqdm.auto import tqdm
from transformers import PrinterCallback

from hf_defer.data.imagenet16h import IMAGENET16H_LABELS, IMAGENET16H_MODELS, load_imagenet16h
from hf_defer.experts.simulated import annotator_accuracy
from hf_defer.modeling.configuration_deferral import DeferralConfig
from hf_defer.modeling.modeling_deferral import EncoderForDeferral
from hf_defer.training.trainer import DeferralTrainer
from .table2_hatespeech import TABLE2_SURROGATES, Protocol, RunResult, _fit_and_predict, estimate_errors, evaluate_logits, \
    training_arguments
from .reporting import METRICS, _percent_cell, display_name, markdown_table, render_template, results_table
from .runs import ReproductionArguments, write_json

__all__ = ["PAPER_IMAGENET16H", "imagenet16h_markdown", "imagenet16h_protocol", "render_imagenet16h",
           "run_imagenet16h", "train_imagenet16h_head"]

# Cao et al. (2023): Table 2 (noise "095") and the appendix table (noise "080"), ImageNet-16H rows, mean (standard
# error) in percent over 5 trials, in METRICS order, as printed. Only A-SM is bold in both.
PAPER_IMAGENET16H: dict[int, dict[str, tuple[tuple[str, str], ...]]] = {
    95: {
        "ssm": (("15.08", "1.19"), ("26.41", "1.78"), ("22.92", "2.59"), ("68.58", "1.30"), ("60.33", "1.19"), ("51.27", "1.94")),
        "sova": (("15.15", "1.50"), ("23.08", "2.39"), ("11.68", "0.53"), ("68.91", "2.51"), ("60.08", "1.82"), ("51.50", "2.05")),
        "aova": (("14.17", "0.58"), ("21.56", "2.13"), ("11.57", "1.50"), ("71.14", "2.10"), ("62.39", "2.10"), ("53.95", "2.27")),
        "asm": (("12.59", "0.79"), ("39.48", "2.50"), ("8.13", "1.33"), ("57.75", "1.37"), ("49.66", "1.18"), ("40.85", "1.51")),
    },
    80: {
        "ssm": (("10.63", "1.34"), ("22.59", "1.59"), ("18.31", "3.22"), ("66.58", "3.91"), ("60.41", "2.98"), ("53.33", "2.79")),
        "sova": (("10.48", "0.64"), ("21.88", "2.75"), ("12.79", "0.33"), ("70.50", "3.78"), ("61.58", "4.64"), ("51.22", "3.37")),
        "aova": (("10.36", "1.09"), ("25.86", "3.56"), ("8.69", "0.63"), ("70.83", "1.25"), ("61.32", "1.70"), ("52.26", "0.95")),
        "asm": (("7.94", "0.85"), ("37.32", "2.72"), ("7.39", "0.23"), ("54.24", "2.89"), ("45.33", "2.91"), ("34.11", "1.65")),
    },
}
PAPER_IMAGENET16H_BOLD = {noise: {"asm": set(METRICS)} for noise in PAPER_IMAGENET16H}
"""The cells the paper prints in bold, by noise level and surrogate."""
LONGER_NOISE, LONGER_FACTOR = 95, 4
"""The convergence check: the noise-095 runs again with 4 times the epochs."""
PAPER_SOURCE = {95: "Table 2", 80: "appendix table, noise \"080\""}


def imagenet16h_protocol(epochs: float = 100.0, verbose: bool = False, threads: int | None = 1) -> Protocol:
    """The head's hyper-parameters: the paper's ImageNet-16H settings (Adam, learning rate 1e-3, 100 epochs).

    The paper prints the batch size as "1e-1"; we use 128, its HateSpeech batch size. Adam is `adamw_torch` with no
    weight decay (see [`train_imagenet16h_head`]); `Protocol.momentum` is unused.

    Example:

    ```python
    >>> protocol = imagenet16h_protocol()
    >>> protocol.learning_rate, protocol.batch_size, protocol.epochs
    (0.001, 128, 100.0)

    ```
    """
    return Protocol(epochs=epochs, batch_size=128, learning_rate=1e-3, verbose=verbose, threads=threads)


def train_imagenet16h_head(splits: datasets.DatasetDict, surrogate: str, seed: int, protocol: Protocol) -> RunResult:
    """Train a linear deferral head (16 classes, one expert) on `features` with [`DeferralTrainer`]; test it.

    Args:
        splits (`datasets.DatasetDict`): `train` and `test` from [`~hf_defer.data.load_imagenet16h`].
        surrogate (`str`): `"asm"`, `"ssm"`, `"sova"` or `"aova"`.
        seed (`int`): seed of the initialisation and the data order.
        protocol (`Protocol`): epochs, batch size, learning rate ([`imagenet16h_protocol`]).

    Returns:
        `RunResult`, its metrics from `hf_defer.deferral_metrics` on the test split.
    """
    columns = ["features", "labels", "expert_labels"]
    train, test = splits["train"].select_columns(columns), splits["test"].select_columns(columns)
    transformers.set_seed(seed)
    config = DeferralConfig(feature_size=len(train[0]["features"]), num_labels=len(IMAGENET16H_LABELS), num_experts=1,
                            surrogate=surrogate, id2label=dict(enumerate(IMAGENET16H_LABELS)),
                            expert_names=["participant"])
    model = EncoderForDeferral(config)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as workdir:
        torch.set_num_threads(protocol.threads or threads)
        args = training_arguments(workdir, seed, protocol, optim="adamw_torch", optim_args=None)
        trainer = DeferralTrainer(model=model, args=args, train_dataset=train.with_format("numpy"))
        if not protocol.verbose:
            trainer.remove_callback(PrinterCallback)
        logits, seconds = _fit_and_predict(trainer, test)
        torch.set_num_threads(threads)
    result = evaluate_logits(logits, test, surrogate)
    result.train_seconds = seconds
    return result


def _cnn_errors(test: datasets.Dataset) -> dict[str, float]:
    """Test error of each CNN's own argmax (the features, 16 per model), and of their summed log-probabilities."""
    table = test.with_format("numpy", columns=["features", "labels"])[:]
    scores = table["features"].reshape(len(test), len(IMAGENET16H_MODELS), len(IMAGENET16H_LABELS))
    errors = {model: float((scores[:, j].argmax(1) != table["labels"]).mean())
              for j, model in enumerate(IMAGENET16H_MODELS)}
    return errors | {"product_of_cnns": float((scores.sum(1).argmax(1) != table["labels"]).mean())}


def run_imagenet16h(arguments: ReproductionArguments, output: Path) -> dict[str, Any]:
    """Every noise level x every surrogate x every seed; writes `imagenet16h_runs.json` and `imagenet16h.md`.

    The JSON is rewritten after every run (`"complete": false` until the end), so an interrupted run keeps its runs.
    """
    protocol = imagenet16h_protocol(min(arguments.imagenet16h_epochs, 1.0) if arguments.quick else
                                    arguments.imagenet16h_epochs, arguments.verbose, arguments.threads)
    runs: list[dict[str, Any]] = []
    record = {"experiment": "imagenet16h_table2", "settings": {
        "data": Path(arguments.imagenet16h).name,  # the folder, not a local absolute path
        "noise_levels": list(arguments.imagenet16h_noise),
        "seeds": list(arguments.seeds), "surrogates": list(arguments.surrogates), "features": list(IMAGENET16H_MODELS),
        "epochs": protocol.epochs, "batch_size": protocol.batch_size, "learning_rate": protocol.learning_rate,
        "optimizer": "Adam", "schedule": "cosine, no warm-up", "weight_decay": 0.0, "quick": arguments.quick,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
                   f"({protocol.threads or torch.get_num_threads()} thread for the heads), "
                   f"transformers {transformers.__version__}"}, "complete": False, "runs": runs, "splits": []}
    total = len(arguments.imagenet16h_noise) * len(arguments.seeds) * len(arguments.surrogates)
    progress, start = tqdm(total=total, desc="ImageNet-16H runs", unit="run"), time.perf_counter()
    for noise in arguments.imagenet16h_noise:
        for seed in arguments.seeds:
            splits = load_imagenet16h(arguments.imagenet16h, noise=noise, seed=seed)
            true = annotator_accuracy(splits["test"], "answer_counts")
            test = splits["test"].with_format("numpy", columns=["labels", "expert_labels"])[:]
            record["splits"].append({"noise": noise, "seed": seed, "num_train": len(splits["train"]),
                                     "num_test": len(splits["test"]), "cnn_errors": _cnn_errors(splits["test"]),
                                     "expert_error": float((test["labels"] != test["expert_labels"]).mean())})
            for surrogate in arguments.surrogates:
                result = train_imagenet16h_head(splits, surrogate, seed, protocol)
                metrics = {k: v for k, v in result.metrics.items() if k != "reliability"} | {
                    f"expert_accuracy_{k}": v for k, v in estimate_errors(result.expert_accuracy[:, 0], true).items()}
                runs.append({"noise": noise, "surrogate": surrogate, "seed": seed, "metrics": metrics,
                             "reliability": result.metrics["reliability"], "train_seconds": result.train_seconds})
                write_json(output / "imagenet16h_runs.json", record)
                progress.update()
                progress.set_postfix(noise=noise, seed=seed, surrogate=surrogate,
                                     error=f"{metrics['system_error']:.4f}")
    if LONGER_NOISE in arguments.imagenet16h_noise:  # the same runs with LONGER_FACTOR times the epochs
        longer = imagenet16h_protocol(protocol.epochs * LONGER_FACTOR, protocol.verbose, protocol.threads)
        record["longer"] = {"noise": LONGER_NOISE, "epochs": longer.epochs, "runs": []}
        progress.reset(total=len(arguments.seeds) * len(arguments.surrogates))
        progress.set_description(f"ImageNet-16H, noise {LONGER_NOISE}, {longer.epochs:g} epochs")
        for seed in arguments.seeds:
            splits = load_imagenet16h(arguments.imagenet16h, noise=LONGER_NOISE, seed=seed)
            for surrogate in arguments.surrogates:
                result = train_imagenet16h_head(splits, surrogate, seed, longer)
                metrics = {k: v for k, v in result.metrics.items() if k != "reliability"}
                record["longer"]["runs"].append({"surrogate": surrogate, "seed": seed, "metrics": metrics,
                                                 "train_seconds": result.train_seconds})
                write_json(output / "imagenet16h_runs.json", record)
                progress.update()
    progress.close()
    record["complete"], record["wall_seconds"] = True, time.perf_counter() - start
    write_json(output / "imagenet16h_runs.json", record)
    return render_imagenet16h(output)


def _paired(runs: list[dict[str, Any]], key: str, first: str, second: str) -> dict[str, Any]:
    """Means (percent) of `first` and `second` and the two-sided paired t-test over seeds of their difference."""
    by = {(r["surrogate"], r["seed"]): 100.0 * r["metrics"][key] for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    a, b = np.array([by[first, s] for s in seeds]), np.array([by[second, s] for s in seeds])
    difference = a - b
    better = -difference if key != "coverage" else difference  # > 0 where `first` is better
    if len(seeds) < 2 or np.allclose(difference, difference[0]):
        p, verdict = "no test (one seed or a constant difference)", "untested"
    else:
        pvalue = float(stats.ttest_rel(a, b).pvalue)
        p = f"{pvalue:.2g}"
        verdict = "not significant" if pvalue >= 0.05 else "better" if better.mean() > 0 else "worse"
    return {"first": float(a.mean()), "second": float(b.mean()), "difference": float(difference.mean()), "p": p,
            "verdict": verdict, "wins": int((better > 0).sum()), "n": len(seeds)}


def _mean(values: list[float]) -> float:
    return 100.0 * float(np.mean(values))


def _means(runs: list[dict[str, Any]], surrogates: list[str]) -> dict[tuple[str, str], float]:
    keys = ("system_error", "coverage", "expert_ece", "classifier_error", "budgeted_error_10")
    return {(s, key): _mean([r["metrics"][key] for r in runs if r["surrogate"] == s])
            for s in surrogates for key in keys}


def _span(values: list[float]) -> tuple[float, float]:
    return min(values), max(values)


def _section(record: dict[str, Any], noise: int, surrogates: list[str]) -> dict[str, Any]:
    """What the report says about one noise level."""
    here = [r for r in record["runs"] if r["noise"] == noise]
    splits = [s for s in record["splits"] if s["noise"] == noise]
    paper, mean = PAPER_IMAGENET16H.get(noise), _means(here, surrogates)
    keys = ("system_error", "coverage", "expert_ece")
    return {
        "noise": noise, "label": f"{noise:03d}", "paper_source": PAPER_SOURCE.get(noise),
        "table": results_table(here, surrogates, with_paper=paper is not None, paper=paper,
                               paper_bold=PAPER_IMAGENET16H_BOLD.get(noise)),
        "comparison": markdown_table(
            ["Method", "Error: ours vs paper", "Coverage: ours vs paper", "ECE: ours vs paper"],
            [[display_name(s), *(f"{mean[s, k]:.2f} vs {paper[s][i][0]} ({mean[s, k] - float(paper[s][i][0]):+.2f})"
                                 for i, k in enumerate(keys))] for s in surrogates if s in paper]) if paper else None,
        "classifier_error": float(np.mean([mean[s, "classifier_error"] for s in surrogates])),
        "expert_error": _mean([s["expert_error"] for s in splits]),
        "cnn_alone": [_mean([s["cnn_errors"][m] for s in splits]) for m in IMAGENET16H_MODELS],
        "cnn_product": _mean([s["cnn_errors"]["product_of_cnns"] for s in splits]),
        "coverage_span": _span([mean[s, "coverage"] for s in surrogates]),
        "error_span": _span([mean[s, "system_error"] for s in surrogates]),
        "over_deferring": [display_name(s) for s in surrogates
                           if mean[s, "budgeted_error_10"] < mean[s, "system_error"]],
        "paper_coverage_span": _span([float(v[1][0]) for v in paper.values()]) if paper else None,
        "paper_error_span": _span([float(v[0][0]) for v in paper.values()]) if paper else None,
        "asm_vs_ssm": ({key: _paired(here, key, "asm", "ssm") for key in keys}
                       if {"asm", "ssm"} <= set(surrogates) else None),
    }


def _longer_section(record: dict[str, Any], surrogates: list[str]) -> dict[str, Any] | None:
    """The convergence check: the runs of one noise level with the usual and with LONGER_FACTOR times the epochs."""
    longer = record.get("longer")
    if not longer:
        return None
    usual = [r for r in record["runs"] if r["noise"] == longer["noise"]]
    keys = ("system_error", "coverage", "expert_ece", "budgeted_error_10", "classifier_error")
    groups = ((record["settings"]["epochs"], usual), (longer["epochs"], longer["runs"]))
    rows = [[f"{display_name(s)}, {epochs:g} epochs",
             *(_percent_cell([r["metrics"][key] for r in group if r["surrogate"] == s]) for key in keys)]
            for s in surrogates for epochs, group in groups]
    before, after = _means(usual, surrogates), _means(longer["runs"], surrogates)
    return {"epochs": f"{longer['epochs']:g}", "label": f"{longer['noise']:03d}",
            "table": markdown_table(["Method", "Error", "Coverage", "ECE", "Budgeted 10%", "classifier error"], rows),
            "coverage": {display_name(s): after[s, "coverage"] for s in surrogates},
            "moved": max(abs(after[s, "coverage"] - before[s, "coverage"]) for s in surrogates),
            "asm_vs_ssm": ({key: _paired(longer["runs"], key, "asm", "ssm") for key in ("system_error", "coverage",
                                                                                         "expert_ece")}
                           if {"asm", "ssm"} <= set(surrogates) else None)}


def imagenet16h_markdown(record: dict[str, Any]) -> str:
    """The text of results/imagenet16h.md from the JSON record of the runs (`imagenet16h_runs.json`)."""
    settings, runs = record["settings"], record["runs"]
    surrogates = [s for s in TABLE2_SURROGATES if s in settings["surrogates"]]
    sections = [_section(record, noise, surrogates) for noise in settings["noise_levels"]]
    with_paper = [s for s in sections if s["paper_source"]]
    return render_template(
        "report_imagenet16h.md", quick=settings["quick"], date=settings["date"][:10], seeds=settings["seeds"],
        epochs=f"{settings['epochs']:g}", batch_size=settings["batch_size"], learning_rate=settings["learning_rate"],
        seconds=float(np.mean([r["train_seconds"] for r in runs])), wall_seconds=record.get("wall_seconds"),
        num_train=record["splits"][0]["num_train"], num_test=record["splits"][0]["num_test"],
        models=", ".join(settings["features"]), sections=sections, by_noise={s["noise"]: s for s in sections},
        with_paper=with_paper, longer=_longer_section(record, surrogates),
        defer_most=bool(with_paper) and all(s["coverage_span"][1] < 50.0 for s in with_paper),
        over_deferring=bool(with_paper) and all(s["over_deferring"] for s in with_paper),
        classifier_better=bool(with_paper) and all(s["classifier_error"] < s["expert_error"] for s in with_paper))


def render_imagenet16h(output: str | os.PathLike) -> dict[str, Any]:
    """Rewrites `imagenet16h.md` in `output` from `imagenet16h_runs.json` (no training); returns the record."""
    output = Path(output)
    record = json.loads((output / "imagenet16h_runs.json").read_text())
    if not record.get("complete"):
        raise SystemExit(f"{output / 'imagenet16h_runs.json'} is from an unfinished reproduction; run it again.")
    (output / "imagenet16h.md").write_text(imagenet16h_markdown(record))
    return record
