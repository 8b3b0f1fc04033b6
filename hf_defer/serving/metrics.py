"""The counters of `/metrics`, in a registry of the app's own (prometheus-client): Prometheus text, or JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "ClientMetrics", "DecisionMetrics", "RouterMetrics", "metrics_response",
           "registry_as_json"]

ROUTING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def registry_as_json(registry: CollectorRegistry) -> dict[str, Any]:
    """The counters of `registry` as nested dicts, by family name without `hf_defer_` and then by label values in
    their declared order: `{"requests": {...}, "routed": {model: n}, "upstream_calls": {model: {outcome: n}}, ...,
    "routing_seconds": {"count": n, "sum": s}}`."""
    out: dict[str, Any] = {}
    for family in registry.collect():
        name = family.name.removeprefix("hf_defer_")
        if family.type == "histogram":
            out[name] = {s.name.rsplit("_", 1)[-1]: s.value for s in family.samples
                         if s.name.endswith(("_count", "_sum"))}
            continue
        table: dict[str, Any] = {}
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            keys = list(sample.labels.values())
            node = table
            for key in keys[:-1]:
                node = node.setdefault(key, {})
            node[keys[-1]] = sample.value
        out[name] = dict(sorted(table.items()))
    return out


class _Exposed:
    """A registry of the app's own and its two expositions; subclasses add their counters to `self.registry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def as_text(self) -> bytes:
        """The Prometheus text exposition format."""
        return generate_latest(self.registry)

    def as_json(self) -> dict[str, Any]:
        """The counters as nested dicts (see [`registry_as_json`])."""
        return registry_as_json(self.registry)


class ClientMetrics:
    """What the access guard and the apps count by client: the id of its key (a name, or `key-` and 8 hex digits of
    the key's SHA-256; `anonymous` without keys), never the key.

    - `hf_defer_client_requests_total{client}`: requests let through.
    - `hf_defer_rejected_total{reason,client}`: requests refused before the app: `unauthorized` (401, client `-`),
      `rate_limited` (429), `too_large` (413), `bad_request` (400).
    - `hf_defer_client_tokens_total{client}` / `hf_defer_client_cost_total{client}`: tokens of the client's
      non-streamed answers and their price (the router's `--price`).

    Example:

    ```python
    >>> from prometheus_client import CollectorRegistry
    >>> from hf_defer.serving.metrics import ClientMetrics, registry_as_json
    >>> registry = CollectorRegistry()
    >>> clients = ClientMetrics(registry, ["team-a"])
    >>> clients.rejected.labels(reason="unauthorized", client="-").inc()
    >>> registry_as_json(registry)["rejected"]
    {'unauthorized': {'-': 1.0}}

    ```
    """

    def __init__(self, registry: CollectorRegistry, client_names: Sequence[str]) -> None:
        self.registry = registry
        self.requests = Counter("hf_defer_client_requests", "Requests let through, by client key id.", ["client"],
                                registry=registry)
        self.rejected = Counter("hf_defer_rejected", "Requests refused before the app, by reason and client key id.",
                                ["reason", "client"], registry=registry)
        self.tokens = Counter("hf_defer_client_tokens", "Tokens of non-streamed answers, by client key id.",
                              ["client"], registry=registry)
        self.cost = Counter("hf_defer_client_cost", "Price of those tokens (--price), by client key id.", ["client"],
                            registry=registry)
        for name in client_names:
            self.requests.labels(client=name)
            self.cost.labels(client=name)


class RouterMetrics(_Exposed):
    """What the routing server counts, by model (the router's expert names).

    - `hf_defer_requests_total{endpoint}`: requests received (`chat_completions`), whatever became of them.
    - `hf_defer_routed_total{model}`: the router's decisions (after the strong-call cap).
    - `hf_defer_capped_total{wanted}`: decisions the strong-call cap sent to the default model instead.
    - `hf_defer_pinned_total{model}`: requests that named a model themselves (not routed).
    - `hf_defer_upstream_calls_total{model,outcome}`: calls to each upstream: `ok`, `error` (an error status or no
      connection) or `timeout`; a streamed answer counts when it ends (`error` / `timeout` when cut mid-way).
    - `hf_defer_fallbacks_total{from_model,to_model}`: calls retried on another model (`--fallback` only).
    - `hf_defer_tokens_total{model}` / `hf_defer_cost_total{model}`: tokens of non-streamed answers (their `usage`) and
      their price (`--price`, per million tokens).
    - the counters by client of [`ClientMetrics`] (`self.clients`).
    - `hf_defer_routing_seconds`: time from a request's arrival at the router to its decision (histogram).

    Example:

    ```python
    >>> from hf_defer.serving.metrics import RouterMetrics
    >>> metrics = RouterMetrics(["weak", "strong"])
    >>> metrics.routed.labels(model="strong").inc()
    >>> metrics.as_json()["routed"]
    {'strong': 1.0, 'weak': 0.0}

    ```
    """

    def __init__(self, model_names: Sequence[str], client_names: Sequence[str] = ("anonymous",)) -> None:
        super().__init__()
        r = self.registry
        self.requests = Counter("hf_defer_requests", "Requests received.", ["endpoint"], registry=r)
        self.routed = Counter("hf_defer_routed", "Routing decisions, by model.", ["model"], registry=r)
        self.capped = Counter("hf_defer_capped", "Decisions the strong-call cap sent to the default model.",
                              ["wanted"], registry=r)
        self.pinned = Counter("hf_defer_pinned", "Requests that named their model (not routed).", ["model"], registry=r)
        self.calls = Counter("hf_defer_upstream_calls", "Calls to each upstream model, by outcome.",
                             ["model", "outcome"], registry=r)
        self.fallbacks = Counter("hf_defer_fallbacks", "Calls retried on another model (--fallback).",
                                 ["from_model", "to_model"], registry=r)
        self.tokens = Counter("hf_defer_tokens", "Tokens of non-streamed answers (usage.total_tokens).", ["model"],
                              registry=r)
        self.cost = Counter("hf_defer_cost", "Price of those tokens (--price, per million tokens).", ["model"],
                            registry=r)
        self.routing_seconds = Histogram("hf_defer_routing_seconds", "Arrival at the router to its decision.",
                                         buckets=ROUTING_BUCKETS, registry=r)
        self.requests.labels(endpoint="chat_completions")
        for name in model_names:  # every series exists from the start, at 0
            self.routed.labels(model=name)
            self.tokens.labels(model=name)
            for outcome in ("ok", "error", "timeout"):
                self.calls.labels(model=name, outcome=outcome)
        self.clients = ClientMetrics(r, client_names)


class DecisionMetrics(_Exposed):
    """What the decision server counts: `hf_defer_decisions_total{status}` (`answered`, `deferred`,
    `pending_review`: decisions made, a repeated id not counted again) and the counters by client of
    [`ClientMetrics`] (`self.clients`).

    Example:

    ```python
    >>> from hf_defer.serving.metrics import DecisionMetrics
    >>> metrics = DecisionMetrics(["team-a"])
    >>> metrics.decisions.labels(status="deferred").inc()
    >>> metrics.as_json()["decisions"]
    {'answered': 0.0, 'deferred': 1.0, 'pending_review': 0.0}

    ```
    """

    def __init__(self, client_names: Sequence[str] = ("anonymous",)) -> None:
        super().__init__()
        self.decisions = Counter("hf_defer_decisions", "Decisions made, by status.", ["status"],
                                 registry=self.registry)
        for status in ("answered", "deferred", "pending_review"):
            self.decisions.labels(status=status)
        self.clients = ClientMetrics(self.registry, client_names)



def metrics_response(metrics: _Exposed, format: str) -> Any:
    """The answer of `GET /metrics?format=...`: Prometheus text (`prometheus`, the default) or JSON (`json`)."""
    from fastapi.responses import JSONResponse, Response

    from .errors import RequestError

    if format == "json":
        return JSONResponse(metrics.as_json())
    if format != "prometheus":
        raise RequestError(f"format must be 'prometheus' or 'json', got {format!r:.40}.", "format")
    return Response(metrics.as_text(), media_type=CONTENT_TYPE_LATEST)
