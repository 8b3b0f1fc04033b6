"""The FastAPI app of `hf-defer serve --router`: an OpenAI-compatible endpoint that routes each chat completion to the
model the router picks.

- `POST /v1/chat/completions`: the request's `model` is the router's name (`hf-defer-router` by default; routed on
  the last user message) or one of the upstream models' names (sent there, not routed; not with `pinning=False`).
  The answer is the upstream's, with the field `hf_defer` (`model`: who answered, `routed_to`: the router's pick
  before the strong-call cap, `capped`: whether the cap (`max_strong_rate`) sent it elsewhere, `margin`,
  `fallback_from`) and the headers `x-hf-defer-model`, `x-hf-defer-routed-to`, `x-hf-defer-capped` (`true` /
  `false`), `x-hf-defer-routing-ms`.
  `"stream": true` streams the upstream's server-sent events through unchanged (the headers say who answers).
- `GET /v1/models`: the router and the upstream models.
- `GET /metrics`: the counters of [`RouterMetrics`], Prometheus text (`?format=json` for JSON), and the monitor's
  gauges.
- `GET /monitor`: the router model's promises (its `config.deferral_guarantee`, e.g. a budget on the strong models'
  share) watched on its decisions ([`DeferralMonitor`]: rates, the label-free error estimate, their anytime-valid
  bounds and the alarm), as JSON. The monitor is fed the route-only model's decision on every routed request (not
  the pinned ones), before the strong-call cap (`max_strong_rate`): it watches the model's promise, not the cap. An
  uncalibrated router gets a monitor without targets (rates and estimate, no alarm).
- `GET /health`: `{"status": "ok"}`, the one path open without a client key.

Every request passes the [`AccessGuard`] of `access` first (client keys, rate, size). A malformed request (the body's
fields checked against OpenAI's chat completion schema, as far as routing reads it) is 400 in OpenAI's error shape.

An upstream error gives the client HTTP 502 (504 for a timeout) with a message naming the model, in OpenAI's error
shape; only with `fallback=True` is the request tried on the next model of the router's ranking first.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..monitoring import DeferralMonitor, monitor_for, register_monitor_metrics
from .access import HEALTH_PATH, AccessGuard, AccessPolicy
from .errors import RequestError, install_error_handlers, openai_error, read_json_object
from .metrics import RouterMetrics, metrics_response
from .routing import PromptRouter, RoutingDecision
from .upstream import Upstream, UpstreamError, complete, open_stream, relay

__all__ = ["DEFAULT_ROUTER_NAME", "build_router_app", "check_chat_request", "last_user_message"]

DEFAULT_ROUTER_NAME = "hf-defer-router"
_METADATA_VALUES = (str, int, float, bool)


def last_user_message(messages: Any) -> str:
    """The text of the last `user` message of a chat request (text parts of a multi-part content joined by new lines).

    Example:

    ```python
    >>> from hf_defer.serving.router_app import last_user_message
    >>> last_user_message([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"},
    ...                    {"role": "assistant", "content": "4"},
    ...                    {"role": "user", "content": [{"type": "text", "text": "And 3 + 3?"}]}])
    'And 3 + 3?'

    ```
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"messages must be a non-empty list of chat messages, got {type(messages).__name__}.")
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                texts = [part.get("text", "") for part in content if isinstance(part, dict)
                         and part.get("type") == "text"]
                if not all(isinstance(text, str) for text in texts):
                    raise ValueError("a text part of the last user message has a `text` that is not a string.")
                content = "\n".join(texts)
            if isinstance(content, str) and content.strip():
                return content
            raise ValueError("the last user message has no text to route on (content must be a string or text parts).")
    raise ValueError("messages has no user message: the router routes on the last one.")


def check_chat_request(body: Mapping[str, Any]) -> None:
    """Checks the fields of a chat completion request that the router reads or passes on as they are, against
    OpenAI's schema: a [`RequestError`] (400) names the first field of a wrong type. Other fields go to the upstream
    unchecked (it knows its own).

    Example:

    ```python
    >>> from hf_defer.serving.router_app import check_chat_request
    >>> check_chat_request({"model": ["gpt-4o"], "messages": []})  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    RequestError: model must be a string (a model's name), got list.

    ```
    """
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"model must be a string (a model's name), got {type(model).__name__}.", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(f"messages must be a non-empty list of chat messages, got {type(messages).__name__}.",
                           "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object with a role and a content, got {type(message).__name__}.",
                               where)
        if not isinstance(message.get("role"), str):
            raise RequestError(f"{where}.role must be a string, got {type(message.get('role')).__name__}.",
                               f"{where}.role")
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise RequestError(f"{where}.content must be a string or a list of content parts, got "
                               f"{type(content).__name__}.", f"{where}.content")
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise RequestError(f"{at} must be an object with a string `type`.", at)
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise RequestError(f"{at}.text must be a string, got {type(part.get('text')).__name__}.",
                                   f"{at}.text")
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        raise RequestError(f"stream must be true or false, got {type(body['stream']).__name__}.", "stream")
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise RequestError(f"metadata must be an object of strings, got {type(metadata).__name__}.", "metadata")
        for key, value in metadata.items():
            if not isinstance(value, _METADATA_VALUES):
                raise RequestError(f"metadata[{key!r:.40}] must be a string (or a number), got "
                                   f"{type(value).__name__}.", f"metadata.{key:.40}")


def build_router_app(router: PromptRouter, upstreams: Mapping[str, Upstream], *, fallback: bool = False,
                     timeout: float = 60.0, router_name: str = DEFAULT_ROUTER_NAME,
                     max_connections: int = 1000, access: AccessPolicy | None = None,
                     pinning: bool = True) -> FastAPI:
    """The OpenAI-compatible routing app (see the module's docstring); run it with uvicorn.

    Args:
        router ([`PromptRouter`]): decides where each prompt goes; started and stopped with the app.
        upstreams (`dict[str, Upstream]`): one per expert of the router (see `parse_upstreams`).
        fallback (`bool`, *optional*, defaults to `False`): on an upstream error, try the next model of the router's
            ranking (best estimated gain first) instead of answering with the error.
        timeout (`float`, *optional*, defaults to 60): seconds an upstream may take (to connect, or between two
            bytes of its answer) before the client gets 504.
        router_name (`str`, *optional*): the `model` a client names to be routed.
        max_connections (`int`, *optional*, defaults to 1000): connections kept open to the upstreams.
        access ([`~hf_defer.serving.access.AccessPolicy`], *optional*): client keys, rate and size limits; defaults
            to no keys (keep such an app on a loopback address) and the default size limit.
        pinning (`bool`, *optional*, defaults to `True`): a request may name an upstream model and go there unrouted;
            with `False` every request is routed (and counted by the strong-call cap), and naming a model is 404.

    Example:

    ```python
    >>> from hf_defer.serving import build_router_app  # see tests/serving for an app on a tiny router
    >>> # uvicorn.run(build_router_app(router, upstreams), host="127.0.0.1", port=8000)

    ```
    """
    missing = sorted(set(router.expert_names) - set(upstreams))
    if missing:
        raise ValueError(f"upstreams has no URL for {missing}, which the router routes to.")
    if router_name in upstreams:
        raise ValueError(f"router_name {router_name!r} is also the name of an upstream model; pick another.")
    access = AccessPolicy() if access is None else access
    metrics = RouterMetrics(router.expert_names, access.client_names)
    config = router.pipeline.model.config
    monitor = monitor_for(config)  # the router model's promises, watched on its decisions before the cap
    register_monitor_metrics(metrics.registry, {str(getattr(config, "_name_or_path", "") or router_name): monitor})
    state: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        # idle connections are dropped after 2 s, before the upstream drops them (uvicorn after 5 s, many servers
        # after 5 to 60 s): a request sent on a connection the upstream is closing fails with a ReadError
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                              keepalive_expiry=2.0)
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
            state["client"] = client
            async with router:
                yield
        state.clear()

    app = FastAPI(title="hf_defer router", lifespan=lifespan)
    app.state.router, app.state.upstreams, app.state.metrics = router, dict(upstreams), metrics
    app.state.access, app.state.monitor = access, monitor
    install_error_handlers(app)
    app.add_middleware(AccessGuard, policy=access, metrics=metrics.clients)

    @app.get(HEALTH_PATH)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        names = [router_name, *upstreams] if pinning else [router_name]
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "hf_defer"}
                                           for name in names]}

    @app.get("/monitor")
    async def monitor_state() -> JSONResponse:
        return JSONResponse(monitor.state())

    @app.get("/metrics")
    async def metrics_endpoint(format: str = "prometheus") -> Response:
        return metrics_response(metrics, format)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        metrics.requests.labels(endpoint="chat_completions").inc()
        client = request.scope.get("hf_defer.client", "anonymous")
        body = await read_json_object(request, '{"model": ..., "messages": [...]}')
        check_chat_request(body)
        requested = body.get("model") or router_name
        if requested != router_name and (requested not in upstreams or not pinning):
            served = f"name {router_name!r} to be routed" + (f", or one of {list(upstreams)}" if pinning else
                                                             " (this server routes every request)")
            return openai_error(404, f"model {requested!r:.80} is not served here: {served}.", param="model")
        try:
            prompt = last_user_message(body.get("messages"))
        except ValueError as error:
            return openai_error(400, str(error), param="messages")
        if requested == router_name:
            routed = await _routed(router, prompt, body, metrics, monitor)
            if isinstance(routed, Response):
                return routed
            decision, order = routed
        else:
            decision, order = None, [requested, *(name for name in upstreams if name != requested)]
            metrics.pinned.labels(model=requested).inc()
        return await _answer(state["client"], upstreams, order if fallback else order[:1], body, decision, metrics,
                             client)

    return app


async def _routed(router: PromptRouter, prompt: Any, body: Mapping[str, Any], metrics: RouterMetrics,
                  monitor: DeferralMonitor) -> tuple[RoutingDecision, list[str]] | Response:
    """The router's decision on the prompt (counted, and fed to the monitor as the model made it, before the cap) and
    the order to try the models in: its pick, then its ranking; an error response (400 for a side feature it cannot
    read, 500 when the router fails) instead."""
    try:
        decision = await router.route(prompt, _side_features(body.get("metadata"), router))
    except (ValueError, TypeError) as error:  # a side feature's value the router cannot read
        return openai_error(400, str(error), param="metadata" if router.side_features else "messages")
    except Exception as error:  # noqa: BLE001  (the client learns that the router, not its input, failed)
        return openai_error(500, f"the router failed on this prompt: {type(error).__name__}: {error}",
                            "router_error")
    metrics.routing_seconds.observe(decision.seconds)
    metrics.routed.labels(model=decision.model).inc()
    if decision.output is not None:  # a PromptRouter's decisions always carry it
        monitor.update([decision.output])
    if decision.model != decision.wanted:
        metrics.capped.labels(wanted=decision.wanted).inc()
    return decision, [decision.model, *(name for name in decision.ranking if name != decision.model)]


async def _answer(http: httpx.AsyncClient, upstreams: Mapping[str, Upstream], candidates: list[str],
                  body: Mapping[str, Any], decision: RoutingDecision | None, metrics: RouterMetrics,
                  client: str) -> Response:
    """The first candidate's answer that does not fail (streamed through, or with the ``hf_defer`` summary), each
    call and fallback counted; the last error (every message, where several failed) when all fail."""
    failures: list[UpstreamError] = []
    for name in candidates:
        upstream = upstreams[name]
        try:
            if body.get("stream"):
                response = await open_stream(http, upstream, body)
            else:
                answer = await complete(http, upstream, body)
        except UpstreamError as error:
            metrics.calls.labels(model=name, outcome="timeout" if error.status == 504 else "error").inc()
            failures.append(error)
            if name != candidates[-1]:
                metrics.fallbacks.labels(from_model=name, to_model=candidates[len(failures)]).inc()
            continue
        headers = _headers(name, decision, failures)
        if body.get("stream"):  # counted when the stream ends: whole (ok) or cut (error, timeout)
            def stream_ended(error: UpstreamError | None, name: str = name) -> None:
                outcome = "ok" if error is None else "timeout" if error.status == 504 else "error"
                metrics.calls.labels(model=name, outcome=outcome).inc()

            return StreamingResponse(relay(upstream, response, stream_ended), media_type="text/event-stream",
                                     headers=headers)
        metrics.calls.labels(model=name, outcome="ok").inc()
        _count_usage(metrics, upstream, answer, client)
        answer["hf_defer"] = _summary(name, decision, failures)
        return JSONResponse(answer, headers=headers)
    last = failures[-1]
    if len(failures) > 1:
        message = "; then ".join(failure.message for failure in failures)
        last = UpstreamError(last.model, last.status, f"every model failed: {message}", last.kind)
    return JSONResponse(last.body(), status_code=last.status, headers=_headers(last.model, decision, failures))


def _side_features(metadata: Any, router: PromptRouter) -> dict[str, Any]:
    """The router's side features from the request's `metadata`, as given: the model's one reader of side-feature
    values (`modeling.side_features.side_feature_value`, through the pipeline) reads a numeric feature given as
    "412" as the number."""
    specs = getattr(router.pipeline.model.config, "side_features", None) or []
    if not specs:
        return {}
    if not isinstance(metadata, dict):
        raise ValueError(f"this router routes on the side feature(s) {router.side_features} too: give them in the "
                         f"request's metadata, e.g. metadata={{{specs[0]['name']!r}: ...}}.")
    return {spec["name"]: metadata[spec["name"]] for spec in specs if spec["name"] in metadata}


def _summary(name: str, decision: RoutingDecision | None, failures: list[UpstreamError]) -> dict[str, Any]:
    return {"model": name, "routed_to": None if decision is None else decision.wanted,
            "capped": None if decision is None else decision.model != decision.wanted,
            "margin": None if decision is None else decision.margin,
            "fallback_from": [failure.model for failure in failures]}


def _headers(name: str, decision: RoutingDecision | None, failures: list[UpstreamError]) -> dict[str, str]:
    headers = {"x-hf-defer-model": name}
    if decision is not None:
        headers["x-hf-defer-routed-to"] = decision.wanted
        headers["x-hf-defer-capped"] = "true" if decision.model != decision.wanted else "false"
        headers["x-hf-defer-routing-ms"] = f"{decision.seconds * 1000:.3f}"
    if failures:
        headers["x-hf-defer-fallback-from"] = ",".join(failure.model for failure in failures)
    return headers


def _count_usage(metrics: RouterMetrics, upstream: Upstream, answer: Mapping[str, Any], client: str) -> None:
    usage = answer.get("usage")
    tokens = usage.get("total_tokens") if isinstance(usage, dict) else None
    if isinstance(tokens, (int, float)) and not isinstance(tokens, bool) and 0 <= tokens < float("inf"):
        metrics.tokens.labels(model=upstream.name).inc(tokens)
        metrics.clients.tokens.labels(client=client).inc(tokens)
        if upstream.price is not None:
            metrics.cost.labels(model=upstream.name).inc(tokens * upstream.price / 1e6)
            metrics.clients.cost.labels(client=client).inc(tokens * upstream.price / 1e6)
