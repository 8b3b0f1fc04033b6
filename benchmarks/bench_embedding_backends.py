#!/usr/bin/env python
"""Embedding HateSpeech on CPU: the sentence-transformers PyTorch path against ONNX Runtime and OpenVINO.

`make demo` spends most of a cold run embedding 24,783 tweets with all-MiniLM-L6-v2. sentence-transformers offers
ONNX and OpenVINO backends (`SentenceTransformer(path, backend="onnx" | "openvino")`), but both go through `optimum`:
`sentence-transformers[onnx]` needs `optimum-onnx`, whose only release (0.1.0) requires `transformers<4.58`, and
`sentence-transformers[openvino]` needs `optimum-intel`, whose newest release (2.2.0) requires `transformers<5.6`
(and pulls a CUDA torch 2.14); hf_defer pins transformers 5.23. So this benchmark measures what those backends
would run, without optimum: the encoder exported once with `torch.onnx.export`, run by ONNX Runtime (float32, and
int8 with its dynamic quantization) and by OpenVINO (the same ONNX file), with sentence-transformers' own
tokenization, batches (sorted by length, 64 texts) and pooling (mean over the attention mask, L2 normalisation).
Each backend embeds the same texts; the script prints texts per second, the ratio to the PyTorch path measured
in the same run, and how far each backend's embeddings lie from PyTorch's (largest absolute difference of a
coordinate, smallest cosine similarity), and writes the embeddings to `--output-dir` for downstream checks.

Needs, besides hf_defer's own environment: `pip install onnxruntime onnx onnxscript openvino` (none of them is a
dependency of hf_defer).

Example:

```
HF_HUB_OFFLINE=1 python benchmarks/bench_embedding_backends.py --max-texts 4000 --repeats 2
```
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from hf_defer.data import load_hatespeech
from hf_defer.experts.embeddings import DEFAULT_SENTENCE_ENCODER, resolve_sentence_encoder


def _batches(model: SentenceTransformer, texts: list[str], batch_size: int):
    """sentence-transformers' batching: texts sorted by decreasing length, each batch tokenized and padded alone."""
    order = np.argsort([-len(text) for text in texts], kind="stable")
    for start in range(0, len(texts), batch_size):
        rows = order[start:start + batch_size]
        yield rows, model.preprocess([texts[i] for i in rows])


def _pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over the attention mask, then L2 normalisation (the model's Pooling and Normalize modules)."""
    mask = mask[..., None].astype(np.float32)
    pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
    return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


def _export(model: SentenceTransformer, folder: Path) -> Path:
    encoder = model[0].auto_model.eval()
    example = model.preprocess(["an example", "a second, longer example text"])
    names = [name for name, value in example.items() if isinstance(value, torch.Tensor)]  # ids, types, mask
    file = folder / "model.onnx"
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.encoder(**dict(zip(names, inputs))).last_hidden_state

    with torch.no_grad():
        torch.onnx.export(Hidden(), tuple(example[name] for name in names), file, input_names=names,
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)
    return file


BACKENDS = ("onnxruntime fp32", "onnxruntime int8", "openvino fp32")


def _runner(kind: str, onnx_file: Path, threads: int) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    if kind.startswith("onnxruntime"):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        return lambda feed: session.run(["last_hidden_state"], feed)[0]
    import openvino

    core = openvino.Core()
    compiled = core.compile_model(str(onnx_file), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                          "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    return lambda feed: request.infer(feed)[compiled.output(0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_SENTENCE_ENCODER,
                        help="a sentence-transformers encoder that mean-pools and normalizes, as all-MiniLM-L6-v2 does")
    parser.add_argument("--max-texts", type=int, default=4000, help="the first N distinct tweets (0: all 24,783)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS),
                        help="which to run besides PyTorch, the reference")
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="write each backend's embeddings here (.npy, rows in sorted text order, as embed_texts caches)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    data = load_hatespeech()
    texts = sorted({text for split in data.values() for text in split["text"]})
    if args.max_texts:
        texts = texts[:args.max_texts]
    model = SentenceTransformer(resolve_sentence_encoder(args.model), device="cpu")

    def pytorch() -> np.ndarray:
        return model.encode(texts, batch_size=args.batch_size, convert_to_numpy=True, show_progress_bar=False)

    with tempfile.TemporaryDirectory() as folder:
        onnx_file = _export(model, Path(folder))
        int8_file = Path(folder) / "model_int8.onnx"
        if "onnxruntime int8" in args.backends:  # dynamic quantization: int8 weights, activations quantized per batch
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(str(onnx_file), str(int8_file), weight_type=QuantType.QInt8)
        backends: dict[str, Callable[[], np.ndarray]] = {"pytorch (sentence-transformers)": pytorch}
        for kind in args.backends:
            run = _runner(kind, int8_file if "int8" in kind else onnx_file, args.threads)

            def encode(run: Callable = run) -> np.ndarray:
                out = np.empty((len(texts), model.get_embedding_dimension()), dtype=np.float32)
                for rows, features in _batches(model, texts, args.batch_size):
                    feed = {name: value.numpy() for name, value in features.items()
                            if isinstance(value, torch.Tensor)}
                    out[rows] = _pool(run(feed), feed["attention_mask"])
                return out

            backends[kind] = encode

        seconds: dict[str, list[float]] = {name: [] for name in backends}
        embeddings: dict[str, np.ndarray] = {}
        for _ in range(args.repeats):  # the backends alternate, so load from other processes hits them alike
            for name, encode in backends.items():
                start = time.perf_counter()
                embeddings[name] = encode()
                seconds[name].append(time.perf_counter() - start)

    reference = embeddings["pytorch (sentence-transformers)"]
    print(f"{platform.platform()}; torch {torch.__version__}, {args.threads} thread(s); {len(texts)} distinct "
          f"HateSpeech tweets, batch {args.batch_size}, median of {args.repeats} alternating repeats")
    print("| backend | seconds | texts/s | speed vs PyTorch | max abs diff | min cosine |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(seconds["pytorch (sentence-transformers)"])
    for name, values in seconds.items():
        median = statistics.median(values)
        diff = float(np.abs(embeddings[name] - reference).max())
        cosine = float((embeddings[name] * reference).sum(axis=1).min())
        print(f"| {name} | {median:.2f} | {len(texts) / median:.0f} | {base / median:.2f}x | {diff:.2e} | {cosine:.6f} |")
    if args.output_dir is not None:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        for name, values in embeddings.items():
            np.save(args.output_dir / f"{name.split(' (')[0].replace(' ', '_')}.npy", values)


if __name__ == "__main__":
    main()
