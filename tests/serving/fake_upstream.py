"""Servers for the serving tests, on 127.0.0.1 and a free port, each in a thread with uvicorn: a fake OpenAI-compatible
upstream model ([`fake_upstream_app`]) and [`serve_in_thread`] for any ASGI app (the router's too)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


@dataclass
class UpstreamBehaviour:
    """What the fake upstream does; tests change it between calls. `mode`: `ok`, `error` (HTTP 500 in OpenAI's
    error shape), `slow` (sleeps `delay` seconds before answering), `break` (a stream cut after its first chunk) or
    `echo_key` (HTTP 401 whose message repeats the Authorization header it got, as a careless server might) or
    `nan` (an answer with a NaN, which Python's json writes and JSON has not).
    `headers` keeps the headers of each request."""

    name: str
    mode: str = "ok"
    delay: float = 0.0
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


def answer_text(name: str, prompt: str) -> str:
    return f"{name} answers: {prompt}"


def fake_upstream_app(behaviour: UpstreamBehaviour) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        behaviour.received.append(body)
        behaviour.headers.append(dict(request.headers))
        if behaviour.mode == "echo_key":
            return JSONResponse({"error": {"message": f"bad credentials {request.headers.get('authorization')}",
                                           "type": "invalid_request_error"}}, status_code=401)
        if behaviour.mode == "error":
            return JSONResponse({"error": {"message": f"{behaviour.name} is overloaded", "type": "server_error"}},
                                status_code=500)
        if behaviour.mode == "nan":
            return Response(b'{"id": "x", "object": "chat.completion", "choices": [], "score": NaN}',
                            media_type="application/json")
        if behaviour.mode == "slow" or behaviour.delay:
            await asyncio.sleep(behaviour.delay)
        prompt = body["messages"][-1]["content"]
        text = answer_text(behaviour.name, prompt)
        if body.get("stream"):
            words = text.split(" ")

            async def events() -> Any:
                for index, word in enumerate(words):
                    chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                             "model": body["model"], "choices": [{"index": 0, "delta": {
                                 "content": word if index == 0 else " " + word}, "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk)}\n\n"
                    if behaviour.mode == "break":
                        raise RuntimeError("the fake upstream breaks its stream")
                done = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                yield f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    return app


@contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Runs `app` with uvicorn on 127.0.0.1 and a free port in a daemon thread; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
