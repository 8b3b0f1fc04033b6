"""The upstream models: OpenAI-compatible servers that the router forwards chat completions to, with httpx.

An upstream that answers with an error status, cannot be reached or does not answer in time gives an
[`UpstreamError`] that says which model, what happened and what status the client should get (502, or 504 for a
timeout); nothing here falls back to another model (the app does, only with `--fallback`).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

__all__ = ["Upstream", "UpstreamError", "parse_assignments", "parse_upstreams"]


@dataclass(frozen=True)
class Upstream:
    """One upstream model.

    Attributes:
        name (`str`): the router's name for it (one of the router's experts).
        url (`str`): its OpenAI-compatible base URL, e.g. `http://127.0.0.1:8001/v1` (`/chat/completions` is added).
        model_id (`str`): the `model` sent upstream (defaults to `name`).
        api_key (`str`, *optional*): sent as `Authorization: Bearer ...`.
        price (`float`, *optional*): price per million tokens, for the cost counter of `/metrics`.
    """

    name: str
    url: str
    model_id: str
    api_key: str | None = None
    price: float | None = None

    @property
    def endpoint(self) -> str:
        return self.url.rstrip("/") + "/chat/completions"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def shown(self) -> str:
        """The endpoint as error messages show it: without a user, password or query string in the URL."""
        parts = urlsplit(self.endpoint)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path}"

    def redact(self, text: str) -> str:
        """`text` (an upstream's answer) with this upstream's API key replaced by `***`, should it echo the key."""
        return text.replace(self.api_key, "***") if self.api_key else text

    def __repr__(self) -> str:  # never the key
        return f"Upstream(name={self.name!r}, url={self.shown!r}, model_id={self.model_id!r}, price={self.price!r})"


class UpstreamError(Exception):
    """An upstream call that failed: `status` is what the client gets (502 bad gateway, 504 timeout)."""

    def __init__(self, model: str, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.model, self.status, self.message, self.kind = model, status, message, kind

    def body(self) -> dict[str, Any]:
        """The error in OpenAI's shape, which the `openai` client raises as `APIStatusError` with this message."""
        return {"error": {"message": self.message, "type": self.kind, "code": self.status, "model": self.model}}


def parse_assignments(flag: str, values: Sequence[str] | None) -> dict[str, str]:
    """`["a=1", "b=2"]` (a repeated flag, or comma-separated) as `{"a": "1", "b": "2"}`; a malformed one or a name
    given twice is a `ValueError` naming `flag`.

    Example:

    ```python
    >>> from hf_defer.serving.upstream import parse_assignments
    >>> parse_assignments("--price", ["strong=30,weak=0.5"])
    {'strong': '30', 'weak': '0.5'}

    ```
    """
    parsed: dict[str, str] = {}
    for value in values or []:
        for item in value.split(","):
            name, sep, right = item.partition("=")
            if not sep or not name.strip() or not right.strip():
                raise ValueError(f"{flag} takes NAME=VALUE (e.g. {flag} strong=...), got {item!r}.")
            if name.strip() in parsed:
                raise ValueError(f"{flag} names {name.strip()!r} twice.")
            parsed[name.strip()] = right.strip()
    return parsed


def parse_upstreams(expert_names: Sequence[str], models: Mapping[str, str], model_ids: Mapping[str, str] | None = None,
                    prices: Mapping[str, str] | None = None,
                    api_key_envs: Mapping[str, str] | None = None) -> dict[str, Upstream]:
    """One [`Upstream`] per expert of the router, from the `--model`, `--upstream_model`, `--price` and
    `--api_key_env` assignments; every expert needs a URL, and no flag may name a model the router does not know.

    Example:

    ```python
    >>> from hf_defer.serving.upstream import parse_upstreams
    >>> up = parse_upstreams(["weak", "strong"], {"weak": "http://127.0.0.1:8001/v1", "strong": "http://127.0.0.1:8002/v1"},
    ...                      model_ids={"strong": "gpt-4o"}, prices={"strong": "5"})
    >>> up["strong"].endpoint, up["strong"].model_id, up["strong"].price, up["weak"].model_id
    ('http://127.0.0.1:8002/v1/chat/completions', 'gpt-4o', 5.0, 'weak')

    ```
    """
    model_ids, prices, api_key_envs = dict(model_ids or {}), dict(prices or {}), dict(api_key_envs or {})
    for flag, given in (("--model", models), ("--upstream_model", model_ids), ("--price", prices),
                        ("--api_key_env", api_key_envs)):
        unknown = sorted(set(given) - set(expert_names))
        if unknown:
            raise ValueError(f"{flag} names {unknown}, which the router does not route to; its models are "
                             f"{list(expert_names)}.")
    missing = [name for name in expert_names if name not in models]
    if missing:
        raise ValueError(f"--model: give the URL of every model the router routes to ({list(expert_names)}), e.g. "
                         f"--model {missing[0]}=http://127.0.0.1:8001/v1; missing {missing}.")
    upstreams = {}
    for name in expert_names:
        url = models[name]
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"--model {name}={url!r}: expected an http(s) URL such as http://127.0.0.1:8001/v1.")
        price = None
        if name in prices:
            try:
                price = float(prices[name])
            except ValueError:
                raise ValueError(f"--price {name}={prices[name]!r}: expected a number (per million tokens).") from None
            if not price >= 0:
                raise ValueError(f"--price {name}={prices[name]!r}: expected a number >= 0.")
        key = None
        if name in api_key_envs:
            key = os.environ.get(api_key_envs[name])
            if not key:
                raise ValueError(f"--api_key_env {name}={api_key_envs[name]}: that environment variable is not set.")
        upstreams[name] = Upstream(name, url, model_ids.get(name, name), key, price)
    return upstreams


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _describe(response_text: str, limit: int = 300) -> str:
    """The upstream's own error message when it sent OpenAI's error shape, else the start of its body."""
    try:
        message = json.loads(response_text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response_text
    message = " ".join(str(message).split())
    return message[:limit] + ("..." if len(message) > limit else "")


def _transport_error(upstream: Upstream, error: httpx.HTTPError) -> UpstreamError:
    if isinstance(error, httpx.TimeoutException):
        return UpstreamError(upstream.name, 504, f"upstream model {upstream.name!r} ({upstream.shown}) did not "
                             f"answer in time ({type(error).__name__}).", "upstream_timeout")
    return UpstreamError(upstream.name, 502, f"upstream model {upstream.name!r} ({upstream.shown}) could not be "
                         f"reached: {type(error).__name__}: {upstream.redact(str(error))}", "upstream_unreachable")


def _status_error(upstream: Upstream, status: int, text: str) -> UpstreamError:
    return UpstreamError(upstream.name, 502, f"upstream model {upstream.name!r} ({upstream.shown}) answered "
                         f"HTTP {status}: {_describe(upstream.redact(text))}", "upstream_error")


async def complete(client: httpx.AsyncClient, upstream: Upstream, body: Mapping[str, Any]) -> dict[str, Any]:
    """A non-streaming chat completion from `upstream` (the request `body` with its `model`); its JSON."""
    payload = {**body, "model": upstream.model_id}
    try:
        response = await client.post(upstream.endpoint, json=payload, headers=upstream.headers())
    except httpx.HTTPError as error:
        raise _transport_error(upstream, error) from error
    if response.status_code >= 400:
        raise _status_error(upstream, response.status_code, response.text)
    try:
        answer = json.loads(response.content, parse_constant=_no_constant)  # NaN would make the answer unsendable
    except ValueError:
        raise UpstreamError(upstream.name, 502, f"upstream model {upstream.name!r} answered HTTP "
                            f"{response.status_code} with a body that is not JSON: "
                            f"{_describe(upstream.redact(response.text))}",
                            "upstream_error") from None
    if not isinstance(answer, dict):
        raise UpstreamError(upstream.name, 502, f"upstream model {upstream.name!r} answered {type(answer).__name__}, "
                            "not a chat completion object.", "upstream_error")
    return answer


async def open_stream(client: httpx.AsyncClient, upstream: Upstream,
                      body: Mapping[str, Any]) -> httpx.Response:
    """Opens a streaming chat completion; returns the response once its status is known to be good (read it with
    [`relay`], which closes it). An error status or a failed connection is an [`UpstreamError`] before any byte
    reaches the client."""
    payload = {**body, "model": upstream.model_id}
    request = client.build_request("POST", upstream.endpoint, json=payload, headers=upstream.headers())
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as error:
        raise _transport_error(upstream, error) from error
    if response.status_code >= 400:
        try:
            text = (await response.aread()).decode("utf-8", "replace")
        except httpx.HTTPError:
            text = ""
        finally:
            await response.aclose()
        raise _status_error(upstream, response.status_code, text)
    return response


async def relay(upstream: Upstream, response: httpx.Response, on_end: Any = None) -> AsyncIterator[bytes]:
    """The upstream's server-sent events, byte for byte; an error mid-stream ends it with an SSE `error` event in
    OpenAI's shape (the status line has gone already). `on_end(None)` is called when the stream ends whole,
    `on_end(UpstreamError)` when it was cut."""
    failure = None
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.HTTPError as error:
        failure = _transport_error(upstream, error)
        yield f"data: {json.dumps(failure.body())}\n\n".encode()
    finally:
        await response.aclose()
        if on_end is not None:
            on_end(failure)
