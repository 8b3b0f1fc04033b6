"""`hf-defer predict --backend onnx` against `--backend torch` on HateSpeech tweets, rows per second, in one run.

The same all-MiniLM-L6-v2 deferral model (`bench_onnx_agreement.py`'s: 3 classes, one expert, a head trained
head-only on 2,000 training tweets' embeddings, put on the encoder; trained, because the int8 export re-scores in
float32 the tweets whose decision lies near the boundary, so its speed depends on how many do), saved as PyTorch and
exported with `hf-defer export --onnx` (float32), `--quantize int8` (with its float32 fallback) and `--quantize int8
--fallback_tolerance 0` (int8 alone). The tweets (the shipped HateSpeech's test, validation and then the training
tweets after the 2,000 the head saw, the first `--rows`) are cut into `--rounds` files; each round runs
`predict_file` (what `hf-defer predict` calls: streaming in chunks of 4,096 rows, the same memory bound for every
backend) on that round's file with each backend in turn, model loading included. Rows per second are totals over the
rounds; the ratio is the median over rounds of torch's time over the backend's.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_onnx_predict.py --rows 20000 --output benchmarks/onnx_predict.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx_agreement import save_text_model, trained_models  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    import datasets
    import onnxruntime
    import pandas as pd
    import torch
    from transformers import AutoTokenizer

    from hf_defer import load_hatespeech
    from hf_defer.commands.predict import predict_file
    from hf_defer.onnx import ORTModelForDeferral, export_onnx

    torch.set_num_threads(1)
    splits = load_hatespeech(seed=0)
    train_rows = 2000
    tweets = datasets.concatenate_datasets([splits["test"], splits["validation"],
                                            splits["train"].select(range(train_rows, len(splits["train"])))])
    tweets = tweets["text"][:args.rows]
    head = trained_models(train_rows)["hatespeech"]["head"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_text_model(head, root / "torch")
        export_onnx(root / "torch", root / "onnx-float32")
        export_onnx(root / "torch", root / "onnx-int8", quantize="int8")
        export_onnx(root / "torch", root / "onnx-int8-alone", quantize="int8", fallback_tolerance=0)
        folders = {"torch": root / "torch", "onnx-float32": root / "onnx-float32", "onnx-int8": root / "onnx-int8",
                   "onnx-int8-alone": root / "onnx-int8-alone"}
        size = len(tweets) // args.rounds
        for index in range(args.rounds):
            part = root / f"part{index}.csv"
            pd.DataFrame({"text": tweets[index * size:(index + 1) * size]}).to_csv(part, index=False)
            row = {"rows": size}
            for name, folder in folders.items():
                start = time.perf_counter()
                count = predict_file(str(folder), str(part), str(root / f"{name}.csv"), batch_size=args.batch_size,
                                     overwrite=True, disable_progress_bar=True,
                                     backend="torch" if name == "torch" else "onnx")
                row[f"{name}_s"] = time.perf_counter() - start
                assert count == size
            rows.append(row)
            print(json.dumps(row), flush=True)
        exported = ORTModelForDeferral.from_pretrained(root / "onnx-int8")
        tokenizer = AutoTokenizer.from_pretrained(root / "onnx-int8")
        sample = tweets[:1000]
        rescored = torch.cat([exported(**tokenizer(sample[i:i + args.batch_size], padding=True, truncation=True,
                                                   return_tensors="pt")).rescored
                              for i in range(0, len(sample), args.batch_size)])
    total = size * args.rounds
    result = {
        "rows_per_s": {name: round(total / sum(row[f"{name}_s"] for row in rows), 1) for name in folders},
        "over_torch": {name: round(float(np.median([row["torch_s"] / row[f"{name}_s"] for row in rows])), 2)
                       for name in folders if name != "torch"},
        "share_rescored_in_float32": {"onnx-int8": round(float(rescored.float().mean()), 4),
                                      "measured_on": f"the first {len(sample)} tweets"},
        "rounds": rows,
        "settings": {"model": "all-MiniLM-L6-v2 deferral model of bench_onnx_agreement.py (3 classes, 1 expert, "
                              "head trained on 2,000 training tweets)",
                     "rows": total, "rounds": args.rounds, "batch_size": args.batch_size,
                     "input": "HateSpeech tweets (test, validation, then training tweets the head did not see), CSV",
                     "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
                                f"onnxruntime {onnxruntime.__version__}, 1 intra-op thread",
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}}
    print(json.dumps(result, indent=1))
    if args.output:
        args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
