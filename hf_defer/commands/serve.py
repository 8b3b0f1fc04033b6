"""`hf-defer serve`: a saved model behind an HTTP endpoint (uvicorn), in one of two forms.

- `hf-defer serve --router FOLDER --model weak=URL --model strong=URL [--price strong=30] [--max_strong_rate 0.3]
  [--fallback]`: an OpenAI-compatible routing endpoint (`/v1/chat/completions`, `/v1/models`, `/metrics`); each
  request goes to the model a route-only router picks on its last user message ([`build_router_app`]).
- `hf-defer serve --model FOLDER [--review_url URL --review_project NAME]`: a deferral model with people as experts
  (`POST /v1/decide`, `GET /v1/decisions/{id}`); deferred inputs become tasks in the review project
  ([`build_decision_app`]).

It listens on 127.0.0.1:8000 unless `--host` / `--port` say otherwise. With `--auth_keys_env VAR` every path but
`/health` needs `Authorization: Bearer KEY`, a key from that variable; an address other than a loopback one is refused
without keys unless `--allow_unauthenticated`. Needs `pip install 'hf-defer[serve]'`. This module imports the
standard library only until it runs (`hf-defer serve --help` is quick).
"""

from __future__ import annotations

import argparse
import inspect
import ipaddress
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from .promise_flags import add_promise_flags

__all__ = ["access_policy", "build_serve_parser", "is_loopback", "run_serve"]

PROG = "hf-defer serve"
DESCRIPTION = """\
hf-defer serve: a saved model behind an HTTP endpoint, in one of two forms.

- hf-defer serve --router FOLDER --model weak=URL --model strong=URL [--price strong=30] [--max_strong_rate 0.3]
  [--fallback]: an OpenAI-compatible routing endpoint (/v1/chat/completions, /v1/models, /metrics); each request
  goes to the model the route-only router picks on its last user message.
- hf-defer serve --model FOLDER [--review_url URL --review_project NAME]: a deferral model with people as experts
  (POST /v1/decide, GET /v1/decisions/{id}); deferred inputs become tasks in the review project.

It listens on 127.0.0.1:8000 unless --host / --port say otherwise. Needs pip install 'hf-defer[serve]'."""
"""What `hf-defer serve --help` says: the module's docstring without its markup and its notes for developers."""


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {value!r}")
    return port


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1; `localhost`); `0.0.0.0`, `::`, an
    empty host and names that do not resolve are not.

    Example:

    ```python
    >>> from hf_defer.commands.serve import is_loopback
    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0"), is_loopback("10.1.2.3")
    (True, True, False, False)

    ```
    """
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if not host.strip():
        return False
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def access_policy(options: argparse.Namespace) -> Any:
    """The [`AccessPolicy`] of the flags: the keys read from the environment variables they name; binding to an
    address other than a loopback one without client keys is refused unless `--allow_unauthenticated`."""
    from ..serving.access import AccessPolicy, parse_client_keys

    def keys(flag: str, variable: str | None) -> tuple:
        if variable is None:
            return ()
        if "=" in variable or "," in variable or variable != variable.strip() or not variable:
            raise ValueError(f"{flag} takes the NAME of an environment variable holding the keys (keys are never "
                             "taken on the command line).")
        return parse_client_keys(os.environ.get(variable), f"{flag} {variable}")

    client_keys = keys("--auth_keys_env", options.auth_keys_env)
    metrics_keys = keys("--metrics_key_env", options.metrics_key_env)
    if not client_keys and not is_loopback(options.host) and not options.allow_unauthenticated:
        raise ValueError(f"--host {options.host} serves beyond this machine, and without client keys anyone who can "
                         "reach the port could call it: give --auth_keys_env VAR (client keys in that environment "
                         "variable), or --allow_unauthenticated to serve it open anyway.")
    return AccessPolicy(client_keys, metrics_keys, options.max_requests_per_minute, options.max_request_bytes)


def _warn_if_open(options: argparse.Namespace, policy: Any, what: str) -> None:
    if not policy.authenticated and not is_loopback(options.host):
        print(f"{PROG}: warning: serving {options.host}:{options.port} without client keys "
              "(--allow_unauthenticated): anyone who can reach this port may " + what +
              (" and read /metrics." if not policy.metrics_keys else "."), file=sys.stderr)


def _max_length(pipe: Any, options: argparse.Namespace) -> int:
    """`--max_length`, at most the model's input limit (the tokenizer's, or the encoder's positions), as `predict`."""
    from .predict import input_length_limit

    limit = input_length_limit(pipe)
    if limit is None:
        return options.max_length or 512
    if options.max_length is not None and options.max_length > limit:
        print(f"{PROG}: --max_length {options.max_length} is more than the model takes; inputs are truncated to its "
              f"{limit} tokens.", file=sys.stderr)
    return limit if options.max_length is None else min(options.max_length, limit)


def build_serve_parser() -> argparse.ArgumentParser:
    """The flags of `hf-defer serve`."""
    from .cli import OneLineErrorParser

    parser = OneLineErrorParser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--router", default=None,
                        help="A saved route-only model (hf-defer train --route_only): serve an OpenAI-compatible "
                             "routing endpoint.")
    parser.add_argument("--model", action="append", default=None,
                        help="With --router: NAME=URL, the OpenAI-compatible base URL of each model the router routes "
                             "to (repeat the flag), e.g. strong=http://127.0.0.1:8001/v1. Without --router: a saved "
                             "deferral model with people as experts (a folder or Hub id): serve /v1/decide.")
    parser.add_argument("--host", default="127.0.0.1",
                        help="Address to listen on (default 127.0.0.1). Any other than a loopback address needs "
                             "--auth_keys_env (or --allow_unauthenticated).")
    parser.add_argument("--port", type=_port, default=8000, help="Port to listen on, 1 to 65535 (default 8000).")
    parser.add_argument("--max_length", type=_positive_int, default=None,
                        help="Truncate inputs to this many tokens (default and most: the model's input limit, as "
                             "hf-defer predict).")
    parser.add_argument("--backend", default="torch", choices=["torch", "onnx"],
                        help="onnx: the model (or --router) is a folder of hf-defer export --onnx, run by ONNX Runtime "
                             "on the CPU (pip install 'hf-defer[onnx]'; default: torch).")
    group = parser.add_argument_group("who may call (both endpoints)")
    group.add_argument("--auth_keys_env", default=None,
                       help="Environment variable holding the client keys, comma-separated, each KEY or NAME:KEY (at "
                            "least 16 characters; NAME labels /metrics): every path but /health then needs "
                            "'Authorization: Bearer KEY'. Keys are never taken on the command line.")
    group.add_argument("--metrics_key_env", default=None,
                       help="Environment variable holding the keys of /metrics (same form), e.g. a scraper's; "
                            "default: the client keys.")
    group.add_argument("--allow_unauthenticated", action="store_true",
                       help="Serve an address other than a loopback one without client keys (anyone who can reach "
                            "the port may call it).")
    group.add_argument("--max_requests_per_minute", type=_positive_float, default=None,
                       help="Requests a minute per client key (a token bucket: bursts of that many); over it, 429 "
                            "with Retry-After. Default: no limit.")
    group.add_argument("--max_request_bytes", type=_positive_int, default=4 * 1024 * 1024,
                       help="Largest request body in bytes (default 4 MiB); over it, 413.")
    group = parser.add_argument_group("routing (--router)")
    group.add_argument("--encoder", default=None,
                       help="For a head-only router (trained on sentence embeddings): the sentence encoder it was "
                            "trained on.")
    group.add_argument("--upstream_model", action="append", default=None,
                       help="NAME=ID: the model name sent to that upstream in each request (default: NAME).")
    group.add_argument("--price", action="append", default=None,
                       help="NAME=PRICE per million tokens, counted in /metrics (hf_defer_cost_total).")
    group.add_argument("--api_key_env", action="append", default=None,
                       help="NAME=ENV_VAR: the environment variable holding that upstream's API key (sent as "
                            "'Authorization: Bearer'); keys are never taken on the command line.")
    group.add_argument("--defer_threshold", type=float, default=None,
                       help="The router's margin (default: the calibrated one saved with the router).")
    group.add_argument("--max_strong_rate", type=float, default=None,
                       help="At most this share of routed requests goes to a model other than the router's default "
                            "one (a hard cap, in arrival order; a capped answer says so: hf_defer.capped and the "
                            "header x-hf-defer-capped); with --calibration_file also the budget the threshold is "
                            "calibrated to at start-up.")
    group.add_argument("--calibration_file", default=None,
                       help="Held-out prompts (txt: one per line; csv/json/jsonl/parquet: --text_column_name) to "
                            "calibrate the threshold to --max_strong_rate at start-up.")
    group.add_argument("--text_column_name", default="text", help="Prompt column of --calibration_file.")
    add_promise_flags(group, ["confidence"])  # with --calibration_file: the budget is --max_strong_rate
    group.add_argument("--fallback", action="store_true",
                       help="On an upstream error or timeout, try the next model of the router's ranking instead of "
                            "answering 502/504.")
    group.add_argument("--timeout", type=float, default=60.0, help="Seconds an upstream may take (default 60).")
    group.add_argument("--routed_only", action="store_true",
                       help="Route every request: a request naming one of the models (skipping the router and "
                            "--max_strong_rate) is 404, and /v1/models lists the router only.")
    group.add_argument("--router_name", default="hf-defer-router",
                       help="The model name clients send to be routed (default hf-defer-router).")
    group.add_argument("--max_batch_size", type=int, default=32, help="Prompts routed per forward pass.")
    group.add_argument("--max_wait_ms", type=float, default=2.0,
                       help="How long a prompt waits for others to share its forward pass (default 2 ms).")
    group = parser.add_argument_group("people as experts (--model FOLDER)")
    group.add_argument("--review_url", default=None, help="The Label Studio server of the review loop.")
    group.add_argument("--review_project", "--review-project", dest="review_project", default=None,
                       help="The review project (id or title; created for the model's classes if missing): deferred "
                            "inputs become tasks there.")
    group.add_argument("--token_env", default="LABEL_STUDIO_API_KEY",
                       help="Environment variable holding the Label Studio API token.")
    return parser


def _calibrate(pipe: Any, options: argparse.Namespace, max_length: int) -> float:
    from ..evaluation.thresholds import calibrate_deferral
    from .inputs import read_table

    if options.max_strong_rate is None:
        raise ValueError("--calibration_file calibrates the threshold to --max_strong_rate: give it too.")
    table = read_table(options.calibration_file, flag="--calibration_file")  # a .txt file: one prompt per line
    column = "text" if options.calibration_file.endswith(".txt") else options.text_column_name
    if column not in table.column_names:
        raise ValueError(f"--text_column_name {column!r} is not a column of --calibration_file "
                         f"{options.calibration_file}; its columns are {table.column_names}.")
    prompts = [str(p) for p in table[column]]
    kwargs: dict[str, Any] = {"truncation": True, "max_length": max_length}
    if options.confidence is not None:
        if "confidence" not in inspect.signature(calibrate_deferral).parameters:
            raise ValueError("--confidence: this hf_defer's calibrate_deferral has no confidence-backed calibration; "
                             "leave --confidence out (the budget then holds on the calibration prompts).")
        kwargs["confidence"] = options.confidence
    return calibrate_deferral(pipe, prompts, max_deferral_rate=options.max_strong_rate, **kwargs)


def _router_app(options: argparse.Namespace, policy: Any) -> Any:
    from ..serving import PromptRouter, build_router_app
    from ..serving.routing import load_router_pipeline
    from ..serving.upstream import parse_assignments, parse_upstreams

    models = parse_assignments("--model", options.model)
    pipe = load_router_pipeline(options.router, options.encoder, backend=options.backend)
    max_length = _max_length(pipe, options)
    threshold = options.defer_threshold
    if options.calibration_file is not None:
        if threshold is not None:
            raise ValueError("give --defer_threshold or --calibration_file, not both.")
        threshold = _calibrate(pipe, options, max_length)
        print(f"{PROG}: threshold {threshold:.6g}, calibrated to --max_strong_rate {options.max_strong_rate} on "
              f"{options.calibration_file}")
    elif options.confidence is not None:
        raise ValueError("--confidence needs --calibration_file (the prompts to calibrate the threshold on).")
    router = PromptRouter(pipe, defer_threshold=threshold, max_strong_rate=options.max_strong_rate,
                          max_batch_size=options.max_batch_size, max_wait_ms=options.max_wait_ms,
                          max_length=max_length)
    upstreams = parse_upstreams(router.expert_names, models, parse_assignments("--upstream_model",
                                options.upstream_model), parse_assignments("--price", options.price),
                                parse_assignments("--api_key_env", options.api_key_env))
    if not options.timeout > 0:
        raise ValueError(f"--timeout must be a positive number of seconds, got {options.timeout}.")
    _warn_if_open(options, policy, "call the upstream models with their API keys (at your cost)")
    return build_router_app(router, upstreams, fallback=options.fallback, timeout=options.timeout,
                            router_name=options.router_name, access=policy, pinning=not options.routed_only)


def _decision_app(options: argparse.Namespace, policy: Any) -> Any:
    from ..serving import build_decision_app
    from .predict import load_pipeline

    if not options.model or len(options.model) != 1 or "=" in options.model[0]:
        raise ValueError("--model: without --router, give one saved deferral model (a folder or Hub id); NAME=URL "
                         f"upstreams go with --router. Got {options.model}.")
    routing_only = [flag for flag in ("encoder", "upstream_model", "price", "api_key_env", "defer_threshold",
                                      "max_strong_rate", "calibration_file", "confidence")
                    if getattr(options, flag) is not None] + [flag for flag in ("fallback", "routed_only")
                                                              if getattr(options, flag)]
    if routing_only:
        raise ValueError(f"--{routing_only[0]} is for a routing endpoint (--router FOLDER).")
    pipe = load_pipeline(options.model[0], backend=options.backend)
    project = None
    if (options.review_url is None) != (options.review_project is None):
        raise ValueError("--review_url and --review_project go together (the Label Studio server and its project).")
    if options.review_project is not None:
        from ..review.client import connect

        project = connect(options.review_url, options.review_project, pipe.model.config.id2label,
                          token_env=options.token_env)
    _warn_if_open(options, policy, "ask the model for decisions" + (" and create tasks in the review project"
                                                                    if project is not None else ""))
    return build_decision_app(pipe, review_project=project, max_length=_max_length(pipe, options), access=policy)


def build_app(argv: Sequence[str]) -> Any:
    """The app `hf-defer serve` would run for the flags `argv` (without starting a server)."""
    options = build_serve_parser().parse_args(list(argv))
    try:
        import fastapi  # noqa: F401
        import httpx  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise ImportError(f"hf-defer serve needs {error.name}: pip install 'hf-defer[serve]'.") from None
    if options.router is None and not options.model:
        raise ValueError("give --router FOLDER (with --model NAME=URL for each model it routes to) or --model FOLDER "
                         "(a deferral model with people as experts).")
    policy = access_policy(options)  # before loading a model: a refused --host fails at once
    if options.router is not None:
        return _router_app(options, policy), options
    return _decision_app(options, policy), options


def run_serve(argv: Sequence[str]) -> int:
    """`hf-defer serve FLAGS`: builds the app and runs it with uvicorn until interrupted."""
    app, options = build_app(argv)
    import uvicorn

    uvicorn.run(app, host=options.host, port=options.port, log_level="info")
    return 0
