#!/usr/bin/env python
"""Peak memory and speed of `hf-defer predict` as the input grows, and its rows/s beside `pipeline(...)`.

Memory: each size runs `python -m hf_defer predict` in a fresh process on a generated file and reads that process's
peak resident memory (`os.wait4`'s `ru_maxrss`): a head-only model over 32 features (a Parquet list column) and a
1-layer, 32-wide BERT over short texts (CSV). `--old-checkout DIR` also runs the text model with the `hf_defer` of
another checkout (e.g. `git archive b4902af | tar -x -C DIR`: the `predict` that read everything first).

Speed (`--speed N`): in one process, on the same tiny BERT and the same N texts, `pipeline("text-classification")`
(the encoder under `AutoModelForSequenceClassification`), `pipeline("deferral")` on a list, and `predict_file` from a
CSV to a CSV, each run twice, alternating, the faster kept; then a profile of `predict_file` by where the time goes.

Example:

```
HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/bench_predict_stream.py --features-rows 10000 100000 1000000 \
    --text-rows 10000 100000 --speed 5000 --workdir /tmp/bench_predict
```

Rows/s on a GPU (issue 32, item 4; `--device` selects this mode): the MiniLM of `--backbone` (a local folder) with a
random deferral head (3 classes, 2 experts, mean pooling), saved with `save_for_hub`, over a generated CSV of
`--text-rows` short texts, and the head-only model over a Parquet file of `--features-rows` 32-float vectors. Each
is decided by `predict_file` (what `hf-defer predict` runs: load the pipeline, stream the file in chunks, write a
CSV) twice in this process (the first run also warms the GPU up), the text model also by `pipeline("deferral")` on
a list of the same texts (what streaming adds), and once by `python -m hf_defer predict` in a fresh process (start-up
included). The pipeline takes the first GPU, as `hf-defer predict` does; `--device cpu` hides the GPUs. The JSON
`--output` is rewritten after each measurement.

```
python benchmarks/bench_predict_stream.py --device cuda --backbone /models/minilm --text-rows 20000 \
    --features-rows 200000 --batch-size 256 --workdir /tmp/bench_predict_gpu --output out/predict_stream.json
```
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORDS = "good bad great awful fine movie plot actor boring fun slow fast story ending music cast".split()


def make_models(workdir: Path) -> tuple[Path, Path, Path]:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizer

    from hf_defer import DeferralConfig, EncoderForDeferral, save_for_hub

    features, text, classifier = workdir / "feature-model", workdir / "text-model", workdir / "text-classifier"
    labels = {"id2label": {0: "neg", 1: "neu", 2: "pos"}, "label2id": {"neg": 0, "neu": 1, "pos": 2}}
    if not features.exists():
        torch.manual_seed(0)
        save_for_hub(EncoderForDeferral(DeferralConfig(feature_size=32, num_labels=3, num_experts=2,
                                                       expert_names=["alice", "bob"], **labels)), features)
    if not text.exists():
        encoder = workdir / "encoder"
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
        tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}, model_max_length=64)
        tokenizer.save_pretrained(encoder)
        torch.manual_seed(0)
        bert = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=64)
        BertModel(bert).save_pretrained(encoder)
        model = EncoderForDeferral.from_encoder_pretrained(str(encoder), num_labels=3, num_experts=2,
                                                           expert_names=["alice", "bob"], **labels)
        save_for_hub(model, text, processing_class=tokenizer)
        torch.manual_seed(0)
        sequence = BertForSequenceClassification(BertConfig(**{**bert.to_dict(), **labels}))
        sequence.bert.load_state_dict(BertModel.from_pretrained(str(encoder)).state_dict())
        sequence.save_pretrained(classifier)
        tokenizer.save_pretrained(classifier)
    return features, text, classifier


def make_inputs(workdir: Path, kind: str, rows: int) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = workdir / (f"features-{rows}.parquet" if kind == "features" else f"texts-{rows}.csv")
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    step = 100_000
    if kind == "features":
        writer = None
        for start in range(0, rows, step):
            n = min(step, rows - start)
            values = rng.normal(size=(n, 32)).astype(np.float32)
            table = pa.table({"id": pa.array([f"item-{i}" for i in range(start, start + n)]),
                              "features": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 32)})
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
        writer.close()
    else:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("id,text\n")
            for start in range(0, rows, step):
                n = min(step, rows - start)
                lengths = rng.integers(3, 12, size=n)
                words = rng.choice(WORDS, size=int(lengths.sum()))
                cuts = np.cumsum(lengths)[:-1]
                handle.writelines(f"item-{start + i},{' '.join(text)}\n"
                                  for i, text in enumerate(np.split(words, cuts)))
    return path


def peak_rss(model: Path, source: Path, output: Path, pythonpath: str | None = None) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of `python -m hf_defer predict` in a fresh process."""
    output.unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    command = [sys.executable, "-m", "hf_defer", "predict", "--model", str(model), "--input", str(source),
               "--output", str(output), "--batch_size", "64"]
    if "text" in source.name:
        command += ["--text_column_names", "text"]
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    error = process.stderr.read().decode()[-2000:]
    if status != 0:
        raise RuntimeError(f"{command} failed: {error}")
    return usage.ru_maxrss / 1024, seconds


def speed(text_model: Path, classifier: Path, workdir: Path, rows: int) -> None:
    from transformers import pipeline

    import hf_defer  # noqa: F401
    from hf_defer.commands.predict import predict_file

    source = make_inputs(workdir, "text", rows)
    texts = [line.split(",", 1)[1].rstrip("\n") for line in open(source, encoding="utf-8").readlines()[1:]]
    classify = pipeline("text-classification", model=str(classifier))
    defer = pipeline("deferral", model=str(text_model))
    runs = {
        "pipeline('text-classification'), list": lambda: list(classify(texts, batch_size=64, truncation=True)),
        "pipeline('deferral'), list": lambda: list(defer(texts, batch_size=64, truncation=True)),
        "predict_file, CSV to CSV": lambda: predict_file(str(text_model), str(source), str(workdir / "speed.csv"),
                                                         batch_size=64, overwrite=True, disable_progress_bar=True),
    }
    best = {name: float("inf") for name in runs}
    for _ in range(2):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    print(f"\n| run ({rows} texts, batch 64) | s | rows/s |\n|---|---|---|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds:.2f} | {rows / seconds:.0f} |")
    profile = cProfile.Profile()
    profile.runcall(runs["predict_file, CSV to CSV"])
    stats = pstats.Stats(profile)
    total = stats.total_tt
    print(f"\nprofile of predict_file ({total:.2f} s under cProfile), cumulative time of:")
    wanted = {"_call_one": "tokenizer calls", "preprocess": "pipeline preprocess (tokenizing, per item)",
              "_forward": "model forward (per batch)", "postprocess": "pipeline postprocess (per item)",
              "write_rows": "writing the output", "_chunks": "reading the input (datasets streaming)",
              "pad_collate": "padding batches (collate)"}
    for (filename, _, function), row in stats.stats.items():
        if function in wanted and ("hf_defer" in filename or "transformers" in filename or "datasets" in filename):
            print(f"  {wanted[function]:45s} {row[3]:6.2f} s ({function} in {Path(filename).name})")


def make_minilm_model(workdir: Path, backbone: str) -> Path:
    """A deferral model over the encoder in `backbone` (float32, random head: 3 classes, experts alice and bob, mean
    pooling), saved with its tokenizer under `workdir`."""
    import torch
    from transformers import AutoTokenizer

    from hf_defer import EncoderForDeferral, save_for_hub

    folder = workdir / "minilm-deferral"
    if not folder.exists():
        torch.manual_seed(0)
        model = EncoderForDeferral.from_encoder_pretrained(
            backbone, num_labels=3, num_experts=2, expert_names=["alice", "bob"], pooling="mean", dtype=torch.float32,
            id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2})
        save_for_hub(model, folder, processing_class=AutoTokenizer.from_pretrained(backbone))
    return folder


def rates(args: argparse.Namespace) -> dict[str, Any]:
    """Rows/s of `predict_file` (twice, in this process), of `pipeline("deferral")` on a list (text model) and of
    `python -m hf_defer predict` in a fresh process, for the MiniLM text model and the head-only model; the JSON
    `args.output` is rewritten after each measurement. Returns what it wrote."""
    # research/ is not installed: benchmarks/research links to it (this script's folder is on sys.path)
    from research.device_report import environment, resolve_device, write_json

    device = resolve_device(args.device)
    import hf_defer  # noqa: F401  (registers the "deferral" task)
    from hf_defer.commands.predict import load_pipeline, predict_file

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    features, _, _ = make_models(workdir)
    text = make_minilm_model(workdir, args.backbone)
    result: dict[str, Any] = {
        "benchmark": "hf-defer predict rows/s, streamed from a file to a CSV",
        "environment": environment(device), "backbone": args.backbone, "batch_size": args.batch_size, "runs": []}
    plans = [("MiniLM text model", text, "text", args.text_rows), ("head-only, 32 features", features, "features",
                                                                      args.features_rows)]
    for name, model, kind, rows in plans:
        if not rows:
            continue
        source = make_inputs(workdir, kind, rows)
        pipe = load_pipeline(str(model))
        if str(pipe.device).split(":")[0] != device.split(":")[0]:
            raise RuntimeError(f"the deferral pipeline went to {pipe.device}, not --device {device}.")
        extra = {"text_column_names": "text"} if kind == "text" else {}
        measured = []
        if kind == "text":
            texts = [line.split(",", 1)[1].rstrip("\n") for line in open(source, encoding="utf-8").readlines()[1:]]
            list(pipe(texts[: args.batch_size], batch_size=args.batch_size, truncation=True))  # warm-up
            start = time.perf_counter()
            outputs = list(pipe(texts, batch_size=args.batch_size, truncation=True))
            seconds = time.perf_counter() - start
            assert len(outputs) == rows
            measured.append(("pipeline('deferral') on a list (model loaded)", seconds))
        del pipe
        for attempt in ("first", "second"):
            start = time.perf_counter()
            written = predict_file(str(model), str(source), str(workdir / "out.csv"), batch_size=args.batch_size,
                                   overwrite=True, disable_progress_bar=True, **extra)
            seconds = time.perf_counter() - start
            if written != rows:
                raise RuntimeError(f"predict_file wrote {written} rows for {rows}.")
            measured.append((f"predict_file, {attempt} run in the process (loads the model)", seconds))
        for what, seconds in measured:
            result["runs"].append({"model": name, "input": source.suffix[1:], "rows": rows, "run": what,
                                   "seconds": seconds, "rows_per_s": rows / seconds, "device": str(device)})
            write_json(args.output, result)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        command = [sys.executable, "-m", "hf_defer", "predict", "--model", str(model), "--input", str(source),
                   "--output", str(workdir / "out.csv"), "--batch_size", str(args.batch_size), "--overwrite"]
        if kind == "text":
            command += ["--text_column_names", "text"]
        start = time.perf_counter()
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{command} failed: {done.stderr[-2000:]}")
        result["runs"].append({"model": name, "input": source.suffix[1:], "rows": rows,
                               "run": "python -m hf_defer predict, fresh process (start-up included)",
                               "seconds": seconds, "rows_per_s": rows / seconds, "device": str(device)})
        write_json(args.output, result)
        for run in result["runs"][-len(measured) - 1:]:
            print(f"| {run['model']} | {run['rows']:,} | {run['run']} | {run['seconds']:.2f} | "
                  f"{run['rows_per_s']:.0f} |", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--features-rows", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--text-rows", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--old-checkout", default=None, help="a checkout whose hf_defer to run as well (text model)")
    parser.add_argument("--speed", type=int, default=0, help="texts for the rows/s comparison (0: skip)")
    parser.add_argument("--workdir", default="bench_predict_stream")
    parser.add_argument("--device", default=None, choices=["auto", "cuda", "cpu"],
                        help="measure rows/s on this device ('auto': the first GPU when there is one; 'cpu' hides "
                             "the GPUs) instead of the memory table; needs --backbone and --output")
    parser.add_argument("--backbone", default=None, help="with --device: local folder of the MiniLM encoder")
    parser.add_argument("--batch-size", type=int, default=64, help="with --device: --batch_size of predict")
    parser.add_argument("--output", type=Path, default=None, help="with --device: JSON file of the rates")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = parser.parse_args()
    if args.device is not None:
        if not args.backbone or not Path(args.backbone).is_dir():
            parser.error(f"--device needs --backbone, a local model folder; got {args.backbone!r}.")
        if args.output is None or args.output.suffix != ".json":
            parser.error(f"--device writes JSON: give --output FILE.json, got {args.output}.")
        if args.output.exists() and not args.overwrite:
            parser.error(f"{args.output} exists; pass --overwrite to replace it or choose another --output.")
        if args.batch_size < 1 or any(rows < 0 for rows in args.text_rows + args.features_rows):
            parser.error("--batch-size must be >= 1 and the row counts >= 0.")
        if len(args.text_rows) > 1 or len(args.features_rows) > 1:
            parser.error("with --device give at most one --text-rows and one --features-rows count.")
        args.text_rows = args.text_rows[0] if args.text_rows else 0
        args.features_rows = args.features_rows[0] if args.features_rows else 0
        if args.device == "cpu":  # before torch is imported: the pipeline takes the first GPU it sees
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        rates(args)
        print(f"wrote {args.output}")
        return
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    features, text, classifier = make_models(workdir)
    print(f"{platform.platform()}; python {platform.python_version()}; {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| model | input | rows | code | peak RSS MiB | s | rows/s |\n|---|---|---|---|---|---|---|")
    plans = [("head-only, 32 features", features, "features", rows, None) for rows in args.features_rows]
    for rows in args.text_rows:
        plans.append(("BERT 1 layer, 32 wide", text, "text", rows, None))
        if args.old_checkout:
            plans.append(("BERT 1 layer, 32 wide", text, "text", rows, args.old_checkout))
    for name, model, kind, rows, checkout in plans:
        source = make_inputs(workdir, kind, rows)
        rss, seconds = peak_rss(model, source, workdir / "out.csv", checkout)
        code = f"old ({checkout})" if checkout else "streaming"
        print(f"| {name} | {source.suffix[1:]} | {rows:,} | {code} | {rss:.0f} | {seconds:.1f} | "
              f"{rows / seconds:.0f} |", flush=True)
    if args.speed:
        speed(text, classifier, workdir, args.speed)
    (workdir / "done.json").write_text(json.dumps({"finished": time.time()}))


if __name__ == "__main__":
    main()
