"""Serving: a saved route-only model as an OpenAI-compatible routing endpoint, and a deferral model with people as
experts as a decision endpoint.

- `routing`: [`PromptRouter`], the router's decisions on prompts, micro-batched, with the cap on strong-model calls.
- `upstream`: forwarding a chat completion to the chosen OpenAI-compatible upstream (streaming too) with clear errors.
- `metrics`: the counters of `/metrics` (Prometheus text, or JSON), by model and by client.
- `access`: who may call an app and how much: [`AccessPolicy`] (client keys from [`parse_client_keys`], a per-key
  request rate, a request size limit), enforced by the `AccessGuard` middleware both apps run behind.
- `errors`: errors in OpenAI's shape, for every error an app can raise.
- `router_app`: [`build_router_app`], the FastAPI app of `hf-defer serve --router` (`/v1/chat/completions`,
  `/v1/models`, `/metrics`).
- `decision_app`: [`build_decision_app`], the FastAPI app of `hf-defer serve --model` (`/v1/decide`,
  `/v1/decisions/{id}`), optionally sending deferred inputs to a Label Studio review project.

It may import the subpackages below the commands (review included) and fastapi, uvicorn, httpx and
prometheus-client, never commands; only the `serve` command imports it, when it runs. Needs
`pip install 'hf-defer[serve]'`.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "AccessPolicy": "access",
    "PromptRouter": "routing",
    "RoutingDecision": "routing",
    "build_decision_app": "decision_app",
    "build_router_app": "router_app",
    "parse_client_keys": "access",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .access import AccessPolicy, parse_client_keys
    from .decision_app import build_decision_app
    from .router_app import build_router_app
    from .routing import PromptRouter, RoutingDecision
