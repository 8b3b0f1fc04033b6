"""The counters of `/metrics`, in a registry of the app's own (prometheus-client): Prometheus text, or JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "RouterMetrics"]

ROUTING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class RouterMetrics:
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

    def __init__(self, model_names: Sequence[str]) -> None:
        self.registry = CollectorRegistry()
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

    def as_text(self) -> bytes:
        """The Prometheus text exposition format."""
        return generate_latest(self.registry)

    def as_json(self) -> dict[str, Any]:
        """The counters as nested dicts: `{"requests": {...}, "routed": {model: n}, "upstream_calls": {model:
        {outcome: n}}, ..., "routing_seconds": {"count": n, "sum": s}}`."""
        out: dict[str, Any] = {}
        for family in self.registry.collect():
            name = family.name.removeprefix("hf_defer_")
            if family.type == "histogram":
                values = {s.name.rsplit("_", 1)[-1]: s.value for s in family.samples
                          if s.name.endswith(("_count", "_sum"))}
                out[name] = values
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
