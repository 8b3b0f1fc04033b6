"""The FastAPI app of `hf-defer serve --model`: a deferral model with people as experts, as a decision endpoint.

- `POST /v1/decide` with `{"input": TEXT, "id": ..., "available_experts": [...]}` (`id` and `available_experts`
  optional; a feature vector for a head-only model, a base64 data URL `data:image/png;base64,...` for an image
  model, never a path or URL for the server to read): the model's answer (`status` `"answered"`, `answer` its
  class), or `status` `"deferred"` with the `expert` chosen and the model's `suggestion`. With a review project, a
  deferred input becomes a Label Studio task there (keyed by the decision's id: posting the same id again creates
  nothing) and its `status` is `"pending_review"`.
- `GET /monitor`: the model's promises watched on the decisions made ([`DeferralMonitor`]: rates, the label-free error
  estimate, their anytime-valid bounds and the alarm), as JSON; `/metrics` carries the same as Prometheus gauges.
- `GET /v1/decisions/{id}`: the decision; once a reviewer has answered the task, `status` `"reviewed"` with their
  `answer` and `reviewer` (the latest answer when several reviewers answered).
- `GET /metrics`: the counters of [`DecisionMetrics`] (decisions by status, requests and refusals by client),
  Prometheus text (`?format=json` for JSON).
- `GET /health`: `{"status": "ok"}`, the one path open without a client key.

Every request passes the [`AccessGuard`] of `access` first (client keys, rate, size); errors are in OpenAI's shape.
Decisions are kept in memory (a restart forgets them; the review tasks stay in the project).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from ..modeling.surrogate_routing import is_route_only
from ..monitoring import monitor_for, register_monitor_metrics
from ..review.client import ReviewProject, ReviewServerError
from ..review.pulling import pull
from ..review.pushing import push
from ..review.tasks import task_key
from .access import HEALTH_PATH, AccessGuard, AccessPolicy
from .errors import RequestError, install_error_handlers, openai_error, read_json_object
from .metrics import DecisionMetrics, metrics_response

__all__ = ["build_decision_app"]


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    return openai_error(status, message, None if status < 500 else "review_server_error", param)


def build_decision_app(pipe: Any, *, review_project: ReviewProject | None = None, max_length: int = 512,
                       access: AccessPolicy | None = None) -> FastAPI:
    """The decision app (see the module's docstring); run it with uvicorn.

    Args:
        pipe ([`DeferralPipeline`]): of a deferral model with a class head (a route-only model is served with
            `hf-defer serve --router`).
        review_project ([`~hf_defer.review.ReviewProject`], *optional*): from `hf_defer.review.connect`; deferred
            inputs become tasks there and `GET /v1/decisions/{id}` reads the reviewers' answers back.
        max_length (`int`, *optional*, defaults to 512): texts are truncated to this many tokens.
        access ([`~hf_defer.serving.access.AccessPolicy`], *optional*): client keys, rate and size limits; defaults
            to no keys (keep such an app on a loopback address) and the default size limit.

    Example:

    ```python
    >>> from hf_defer.serving import build_decision_app  # see tests/serving for an app on a tiny model
    >>> # uvicorn.run(build_decision_app(pipeline("deferral", model="demo_model")), host="127.0.0.1", port=8000)

    ```
    """
    config = pipe.model.config
    _check_servable(config, review_project)
    decisions: dict[str, dict[str, Any]] = {}
    reviews: dict[str, dict[str, Any]] = {}  # task key -> the latest answer pulled
    lock = asyncio.Lock()  # one pipeline / review call at a time (neither is thread-safe)
    state: dict[str, Any] = {"known": None}
    options = {} if pipe.input_kind != "text" else {"truncation": True, "max_length": max_length}

    def run_model(model_input: Any, available: Any) -> dict[str, Any]:
        kwargs = dict(options)
        if available is not None:
            kwargs["available_experts"] = available
        return pipe(_readable(pipe.input_kind, model_input), **kwargs)

    def send_for_review(key_id: str, text: str, output: dict[str, Any]) -> int | None:
        report = push(review_project, [text], [output], expert_names=list(config.expert_names),
                      expert_costs=getattr(config, "expert_costs", None), ids=[key_id],
                      model_version=str(getattr(config, "_name_or_path", "") or "hf_defer"))
        return report.created[0] if report.created else review_project.task_keys().get(task_key(text, key_id))

    def read_reviews() -> None:
        import pandas as pd

        result = pull(review_project, known=state["known"])
        state["known"] = result.table if state["known"] is None else pd.concat([state["known"], result.table])
        for row in result.table.to_dict("records"):
            reviews[str(row["item"])] = {"answer": row["answer"], "reviewer": row["annotator"], "time": row["time"]}

    access = AccessPolicy() if access is None else access
    metrics = DecisionMetrics(access.client_names)
    app = FastAPI(title="hf_defer decisions")
    app.state.decisions, app.state.metrics, app.state.access = decisions, metrics, access
    app.state.monitor = monitor = monitor_for(config)  # one per served model: its promises watched on its decisions
    register_monitor_metrics(metrics.registry, {str(getattr(config, "_name_or_path", "") or "model"): monitor})
    install_error_handlers(app)
    app.add_middleware(AccessGuard, policy=access, metrics=metrics.clients)

    @app.get(HEALTH_PATH)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/monitor")
    async def monitor_state() -> JSONResponse:
        return JSONResponse(monitor.state())

    @app.get("/metrics")
    async def metrics_endpoint(format: str = "prometheus") -> Response:
        return metrics_response(metrics, format)

    @app.post("/v1/decide")
    async def decide(request: Request) -> JSONResponse:
        body = await read_json_object(request, '{"input": ..., "id": ...}')
        model_input, decision_id = _checked_request(body, pipe.input_kind)
        if decision_id in decisions:
            if decisions[decision_id]["input"] != model_input:
                return _error(409, f"id {decision_id!r} was already used for another input.", "id")
            return JSONResponse(_public(decisions[decision_id]))
        async with lock:
            try:
                output = await asyncio.to_thread(run_model, model_input, body.get("available_experts"))
            except (ValueError, TypeError) as error:
                return _error(400, str(error), "input")
            record = _decision_record(decision_id, model_input, output)
            if output["defer"] and review_project is not None:
                text = model_input if isinstance(model_input, str) else str(model_input)
                try:
                    record["task_id"] = await asyncio.to_thread(send_for_review, decision_id, text, output)
                except (ReviewServerError, ValueError) as error:
                    return _error(502, f"the input was deferred to {output['expert']!r} but its review task could "
                                  f"not be created: {error}")
                record["key"] = task_key(text, decision_id)
                record["status"] = "pending_review"
            decisions[decision_id] = record
            monitor.update([output], ids=[decision_id])
            metrics.decisions.labels(status=record["status"]).inc()
        return JSONResponse(_public(record))

    @app.get("/v1/decisions/{decision_id}")
    async def decision(decision_id: str) -> JSONResponse:
        record = decisions.get(decision_id)
        if record is None:
            return _error(404, f"no decision {decision_id!r} (ids are those POST /v1/decide returned; a restart "
                          "forgets them).", "id")
        if record["status"] == "pending_review":
            async with lock:
                try:
                    await asyncio.to_thread(read_reviews)
                except ReviewServerError as error:
                    return _error(502, f"could not read the reviews: {error}")
            review = reviews.get(record["key"])
            if review is not None:
                record.update(status="reviewed", answer=review["answer"], reviewer=review["reviewer"])
        return JSONResponse(_public(record))

    return app


def _check_servable(config: Any, review_project: ReviewProject | None) -> None:
    """A `ValueError` unless the model has a class head and the review project (if any) offers its classes."""
    if is_route_only(config):
        raise ValueError("--model is a route-only model (no class head, no answer of its own): serve it with "
                         "`hf-defer serve --router`.")
    if review_project is not None:
        missing = sorted(set(config.id2label.values()) - set(review_project.classes))
        if missing:
            raise ValueError(f"the review project {review_project.title!r} does not offer the model's classes "
                             f"{missing} (it offers {review_project.classes}).")


def _decision_record(decision_id: str, model_input: Any, output: dict[str, Any]) -> dict[str, Any]:
    """What the app keeps of one decision: the pipeline's output as `deferred` or `answered`, no review yet."""
    return {"id": decision_id, "input": model_input, "deferred": bool(output["defer"]),
            "status": "deferred" if output["defer"] else "answered",
            "answer": None if output["defer"] else output["label"], "expert": output["expert"],
            "suggestion": output["class_label"], "class_score": output["class_score"],
            "expert_scores": output["expert_scores"], "task_id": None, "reviewer": None}


def _checked_request(body: dict[str, Any], kind: str) -> tuple[Any, str]:
    """The input and the decision's id (the client's, or a new one) of a `POST /v1/decide` body; a [`RequestError`]
    naming the field otherwise."""
    if "input" not in body:
        raise RequestError("the request body must be a JSON object with an \"input\" (the text to decide on).", "input")
    model_input, given_id = body["input"], body.get("id")
    _check_input(kind, model_input)
    if given_id is not None and (not isinstance(given_id, (str, int)) or isinstance(given_id, bool)
                                 or not str(given_id).strip()):
        raise RequestError(f"id must be a non-empty string or an integer, got {given_id!r:.60}.", "id")
    return model_input, str(given_id) if given_id is not None else uuid.uuid4().hex


def _check_input(kind: str, value: Any) -> None:
    """A [`RequestError`] unless `value` is one input of the model's kind: a non-empty text; a list of numbers (a
    feature vector); an image as a base64 data URL (`data:image/png;base64,...`), never a path or a URL, which the
    server would read or fetch for the client."""
    if kind == "text" and (not isinstance(value, str) or not value.strip()):
        raise RequestError(f"input must be a non-empty text for this model, got {value!r:.60}.", "input")
    if kind == "features" and (not isinstance(value, list) or not value or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise RequestError(f"input must be a feature vector (a list of numbers) for this model, got {value!r:.60}.",
                           "input")
    if kind == "image" and (not isinstance(value, str) or not value.startswith("data:image/")
                            or ";base64," not in value[:100]):
        raise RequestError("input must be an image as a base64 data URL (data:image/png;base64,...) for this model; "
                           "the server reads no path or URL for a client.", "input")


def _readable(kind: str, value: Any) -> Any:
    """The input as the pipeline reads it: an image data URL decoded here (a bad one is a `ValueError`)."""
    if kind != "image":
        return value
    import base64
    import binascii
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(base64.b64decode(value.split(";base64,", 1)[1], validate=True)))
        return image.convert("RGB")
    except (binascii.Error, UnidentifiedImageError, OSError) as error:
        raise ValueError(f"input is not a readable base64 image ({type(error).__name__}).") from None


def _public(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in ("input", "key")}
