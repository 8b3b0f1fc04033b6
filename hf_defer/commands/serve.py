"""`hf-defer serve`: a saved model behind an HTTP endpoint (uvicorn), in one of two forms.

- `hf-defer serve --router FOLDER --model weak=URL --model strong=URL [--price strong=30] [--max_strong_rate 0.3]
  [--fallback]`: an OpenAI-compatible routing endpoint (`/v1/chat/completions`, `/v1/models`, `/metrics`); each
  request goes to the model a route-only router picks on its last user message ([`build_router_app`]).
- `hf-defer serve --model FOLDER [--review_url URL --review_project NAME]`: a deferral model with people as experts
  (`POST /v1/decide`, `GET /v1/decisions/{id}`); deferred inputs become tasks in the review project
  ([`build_decision_app`]).

It listens on 127.0.0.1:8000 unless `--host` / `--port` say otherwise. Needs `pip install 'hf-defer[serve]'`. This
module imports the standard library only until it runs (`hf-defer serve --help` is quick).
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Sequence
from typing import Any

__all__ = ["build_serve_parser", "run_serve"]

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
    parser.add_argument("--host", default="127.0.0.1", help="Address to listen on (default 127.0.0.1).")
    parser.add_argument("--port", type=int, default=8000, help="Port to listen on (default 8000).")
    parser.add_argument("--max_length", type=int, default=512, help="Truncate inputs to this many tokens.")
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
                            "one (a hard cap, in arrival order); with --calibration_file also the budget the "
                            "threshold is calibrated to at start-up.")
    group.add_argument("--calibration_file", default=None,
                       help="Held-out prompts (txt: one per line; csv/json/jsonl/parquet: --text_column_name) to "
                            "calibrate the threshold to --max_strong_rate at start-up.")
    group.add_argument("--text_column_name", default="text", help="Prompt column of --calibration_file.")
    group.add_argument("--confidence", type=float, default=None,
                       help="With --calibration_file: calibrate so that the budget holds on new prompts with this "
                            "probability, e.g. 0.9 (default: the budget holds on the calibration prompts).")
    group.add_argument("--fallback", action="store_true",
                       help="On an upstream error or timeout, try the next model of the router's ranking instead of "
                            "answering 502/504.")
    group.add_argument("--timeout", type=float, default=60.0, help="Seconds an upstream may take (default 60).")
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


def _calibrate(pipe: Any, options: argparse.Namespace) -> float:
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
    kwargs: dict[str, Any] = {"truncation": True, "max_length": options.max_length}
    if options.confidence is not None:
        if "confidence" not in inspect.signature(calibrate_deferral).parameters:
            raise ValueError("--confidence: this hf_defer's calibrate_deferral has no confidence-backed calibration; "
                             "leave --confidence out (the budget then holds on the calibration prompts).")
        kwargs["confidence"] = options.confidence
    return calibrate_deferral(pipe, prompts, max_deferral_rate=options.max_strong_rate, **kwargs)


def _router_app(options: argparse.Namespace) -> Any:
    from ..serving import PromptRouter, build_router_app
    from ..serving.routing import load_router_pipeline
    from ..serving.upstream import parse_assignments, parse_upstreams

    models = parse_assignments("--model", options.model)
    pipe = load_router_pipeline(options.router, options.encoder)
    threshold = options.defer_threshold
    if options.calibration_file is not None:
        if threshold is not None:
            raise ValueError("give --defer_threshold or --calibration_file, not both.")
        threshold = _calibrate(pipe, options)
        print(f"{PROG}: threshold {threshold:.6g}, calibrated to --max_strong_rate {options.max_strong_rate} on "
              f"{options.calibration_file}")
    elif options.confidence is not None:
        raise ValueError("--confidence needs --calibration_file (the prompts to calibrate the threshold on).")
    router = PromptRouter(pipe, defer_threshold=threshold, max_strong_rate=options.max_strong_rate,
                          max_batch_size=options.max_batch_size, max_wait_ms=options.max_wait_ms,
                          max_length=options.max_length)
    upstreams = parse_upstreams(router.expert_names, models, parse_assignments("--upstream_model",
                                options.upstream_model), parse_assignments("--price", options.price),
                                parse_assignments("--api_key_env", options.api_key_env))
    if not options.timeout > 0:
        raise ValueError(f"--timeout must be a positive number of seconds, got {options.timeout}.")
    return build_router_app(router, upstreams, fallback=options.fallback, timeout=options.timeout,
                            router_name=options.router_name)


def _decision_app(options: argparse.Namespace) -> Any:
    from ..serving import build_decision_app
    from .predict import load_pipeline

    if not options.model or len(options.model) != 1 or "=" in options.model[0]:
        raise ValueError("--model: without --router, give one saved deferral model (a folder or Hub id); NAME=URL "
                         f"upstreams go with --router. Got {options.model}.")
    routing_only = [flag for flag in ("encoder", "upstream_model", "price", "api_key_env", "defer_threshold",
                                      "max_strong_rate", "calibration_file", "confidence")
                    if getattr(options, flag) is not None] + (["fallback"] if options.fallback else [])
    if routing_only:
        raise ValueError(f"--{routing_only[0]} is for a routing endpoint (--router FOLDER).")
    pipe = load_pipeline(options.model[0])
    project = None
    if (options.review_url is None) != (options.review_project is None):
        raise ValueError("--review_url and --review_project go together (the Label Studio server and its project).")
    if options.review_project is not None:
        from ..review.client import connect

        project = connect(options.review_url, options.review_project, pipe.model.config.id2label,
                          token_env=options.token_env)
    return build_decision_app(pipe, review_project=project, max_length=options.max_length)


def build_app(argv: Sequence[str]) -> Any:
    """The app `hf-defer serve` would run for the flags `argv` (without starting a server)."""
    options = build_serve_parser().parse_args(list(argv))
    try:
        import fastapi  # noqa: F401
        import httpx  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise ImportError(f"hf-defer serve needs {error.name}: pip install 'hf-defer[serve]'.") from None
    if options.router is not None:
        return _router_app(options), options
    if not options.model:
        raise ValueError("give --router FOLDER (with --model NAME=URL for each model it routes to) or --model FOLDER "
                         "(a deferral model with people as experts).")
    return _decision_app(options), options


def run_serve(argv: Sequence[str]) -> int:
    """`hf-defer serve FLAGS`: builds the app and runs it with uvicorn until interrupted."""
    app, options = build_app(argv)
    import uvicorn

    uvicorn.run(app, host=options.host, port=options.port, log_level="info")
    return 0
