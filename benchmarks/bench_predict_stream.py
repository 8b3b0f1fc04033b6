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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--features-rows", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--text-rows", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--old-checkout", default=None, help="a checkout whose hf_defer to run as well (text model)")
    parser.add_argument("--speed", type=int, default=0, help="texts for the rows/s comparison (0: skip)")
    parser.add_argument("--workdir", default="bench_predict_stream")
    args = parser.parse_args()
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
