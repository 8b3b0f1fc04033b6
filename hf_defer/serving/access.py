"""Who may call a served app, and how much: client keys, a per-key request rate and a request size limit, checked
before a request reaches the app ([`AccessGuard`], an ASGI middleware both apps of `hf-defer serve` run behind).

- **Keys.** With client keys ([`parse_client_keys`]: `KEY` or `NAME:KEY`, comma-separated, from an environment
  variable), every path but the health check (`/health`) needs `Authorization: Bearer <key>`; a missing or wrong key
  is 401 in OpenAI's error shape. The key is compared with every client key in constant time (`hmac.compare_digest`
  on SHA-256 digests, so that neither the key nor its length shows in the time taken); only the digests are kept.
  `/metrics` takes its own keys when given (a scraper's), else the client keys. A key in the query string is not
  read: keys go in the header only (URLs end up in logs).
- **Rate.** A token bucket per key (`max_requests_per_minute` = N: a burst of at most N requests, refilled at N a
  minute); a request over it is 429 with `Retry-After` (seconds).
- **Size.** A request body over `max_request_bytes` is 413: refused from its `Content-Length` before any byte is
  read, or once the bytes received (a chunked body) pass the limit. A refused request's connection is closed after the
  answer, so that no more of its body is read.

Each client is known by an id that never is its key: the name given as `NAME:KEY`, else `key-` and the first 8 hex
digits of the key's SHA-256; `/metrics` counts by that id ([`~hf_defer.serving.metrics.ClientMetrics`]).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import openai_error

__all__ = ["ANONYMOUS", "HEALTH_PATH", "AccessGuard", "AccessPolicy", "ClientKey", "TokenBucket", "client_id",
           "parse_client_keys"]

HEALTH_PATH = "/health"
ANONYMOUS = "anonymous"
"""The client id of every request when the app has no client keys."""
UNKNOWN = "-"
"""The client label of a request refused for its key (no client matched)."""
MIN_KEY_LENGTH = 16
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: what a header carries unchanged


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape") if isinstance(key, str) else key).digest()


def client_id(key: str) -> str:
    """The id of a key without a name: `key-` and the first 8 hex digits of its SHA-256 (the key cannot be read back
    from it).

    Example:

    ```python
    >>> from hf_defer.serving.access import client_id
    >>> client_id("sk-team-a-0123456789abcdef")
    'key-0d9e958b'

    ```
    """
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class ClientKey:
    """A client key as the server keeps it: its id (`name`) and the SHA-256 digest of the key, never the key."""

    name: str
    digest: bytes = field(repr=False)


def parse_client_keys(value: str | None, source: str) -> tuple[ClientKey, ...]:
    """The client keys of an environment variable's `value`: comma-separated, each `KEY` or `NAME:KEY` (a name for
    `/metrics`; letters, digits, `_`, `.`, `-`). A key has at least 16 characters, printable ASCII without spaces
    (e.g. `python -c "import secrets; print(secrets.token_urlsafe(32))"`); a key or name given twice is an error.
    `source` names the variable in the errors, which never show a key.

    Example:

    ```python
    >>> from hf_defer.serving.access import parse_client_keys
    >>> keys = parse_client_keys("team-a:sk-0123456789abcdef, sk-fedcba9876543210", "--auth_keys_env KEYS")
    >>> [key.name for key in keys]
    ['team-a', 'key-284673d4']

    ```
    """
    if value is None or not value.strip():
        raise ValueError(f"{source}: that environment variable is not set or empty (give one or more client keys, "
                         "comma-separated, KEY or NAME:KEY).")
    keys: list[ClientKey] = []
    digests: set[bytes] = set()
    for position, item in enumerate(value.split(","), start=1):
        item = item.strip()
        name, sep, key = item.partition(":")
        if not sep:
            name, key = "", item
        where = f"{source}: key {position}" + (f" ({name!r})" if name else "")
        if sep and not _NAME.fullmatch(name):
            raise ValueError(f"{where}: a name (before ':') is letters, digits, '_', '.' or '-'.")
        if not _KEY.fullmatch(key or " "):
            raise ValueError(f"{where} is empty or has spaces or characters outside printable ASCII.")
        if len(key) < MIN_KEY_LENGTH:
            raise ValueError(f"{where} has {len(key)} characters; use at least {MIN_KEY_LENGTH} random ones, e.g. "
                             "python -c \"import secrets; print(secrets.token_urlsafe(32))\".")
        name = name or client_id(key)
        digest = _digest(key)
        if digest in digests or any(k.name == name for k in keys):
            raise ValueError(f"{where}: that key or name is given twice.")
        digests.add(digest)
        keys.append(ClientKey(name, digest))
    return tuple(keys)


def match_key(given: bytes | None, keys: Sequence[ClientKey]) -> str | None:
    """The id of the client key equal to `given`, or None; compares with every key, in constant time."""
    if given is None:
        given = b""
    digest = _digest(given)
    found = None
    for key in keys:  # no early exit: the time taken does not say which key (or whether one) matched
        if hmac.compare_digest(digest, key.digest):
            found = key.name
    return found


class TokenBucket:
    """A token bucket: holds at most `capacity` tokens, refilled at `rate` tokens a second; each request takes one.

    Example:

    ```python
    >>> from hf_defer.serving.access import TokenBucket
    >>> now = [0.0]
    >>> bucket = TokenBucket(capacity=2, rate=0.5, clock=lambda: now[0])
    >>> bucket.take(), bucket.take(), bucket.take()  # 0: let through; else the seconds until a token is back
    (0.0, 0.0, 2.0)
    >>> now[0] = 1.5; bucket.take()
    0.5

    ```
    """

    def __init__(self, capacity: float, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not capacity >= 1 or not rate > 0:
            raise ValueError(f"a token bucket needs capacity >= 1 and rate > 0, got {capacity!r} and {rate!r}.")
        self.capacity, self.rate, self.clock = float(capacity), float(rate), clock
        self.tokens, self.updated = float(capacity), clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Takes a token and returns 0.0, or takes none and returns the seconds until one is back."""
        with self._lock:
            now = self.clock()
            self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
            if self.tokens >= 1:
                self.tokens -= 1
                return 0.0
            return (1 - self.tokens) / self.rate


@dataclass(frozen=True)
class AccessPolicy:
    """Who may call an app and how much (see the module's docstring).

    Attributes:
        client_keys (`tuple[ClientKey, ...]`): from [`parse_client_keys`]; none: every client may call (keep such an
            app on a loopback address).
        metrics_keys (`tuple[ClientKey, ...]`): the keys of `/metrics`; none: the client keys.
        max_requests_per_minute (`float`, *optional*): the rate of each key (a token bucket of that many requests,
            refilled at that rate); none: no limit. Without client keys, all clients share one bucket.
        max_request_bytes (`int`, *optional*, defaults to 4 MiB): the largest request body.

    Example:

    ```python
    >>> from hf_defer.serving.access import AccessPolicy, parse_client_keys
    >>> policy = AccessPolicy(parse_client_keys("ci:sk-0123456789abcdef", "KEYS"), max_requests_per_minute=600)
    >>> policy.authenticated, policy.max_request_bytes
    (True, 4194304)

    ```
    """

    client_keys: tuple[ClientKey, ...] = ()
    metrics_keys: tuple[ClientKey, ...] = ()
    max_requests_per_minute: float | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES

    def __post_init__(self) -> None:
        rate = self.max_requests_per_minute
        if rate is not None and (isinstance(rate, bool) or not 0 < rate < math.inf):
            raise ValueError(f"max_requests_per_minute must be a positive number, got {rate!r}.")
        size = self.max_request_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"max_request_bytes must be a positive integer, got {size!r}.")

    @property
    def authenticated(self) -> bool:
        """Whether the app's routes need a client key."""
        return bool(self.client_keys)

    @property
    def client_names(self) -> list[str]:
        """The ids `/metrics` counts by (the metrics keys' too)."""
        names = [key.name for key in (*self.client_keys, *self.metrics_keys)] or [ANONYMOUS]
        return list(dict.fromkeys(names))


class _TooLarge(Exception):
    pass


class AccessGuard:
    """An ASGI middleware that lets a request reach `app` only under `policy` (see the module's docstring); the client
    id of a request let through is in its scope, `scope["hf_defer.client"]`. `metrics` ([`ClientMetrics`]) counts
    the requests let through and those refused, by client id and reason.

    Example:

    ```python
    >>> from fastapi import FastAPI
    >>> from hf_defer.serving.access import AccessGuard, AccessPolicy
    >>> app = FastAPI()
    >>> app.add_middleware(AccessGuard, policy=AccessPolicy(max_request_bytes=1024))

    ```
    """

    def __init__(self, app: Any, policy: AccessPolicy, metrics: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app, self.policy, self.metrics = app, policy, metrics
        rate = policy.max_requests_per_minute
        self.buckets = {} if rate is None else {name: TokenBucket(max(rate, 1.0), rate / 60, clock)
                                                for name in policy.client_names}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] == HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        client, refusal = self._client(scope)
        if refusal is not None:
            await self._refuse(scope, receive, send, "unauthorized", UNKNOWN, refusal)
            return
        bucket = self.buckets.get(client)
        wait = bucket.take() if bucket is not None else 0.0
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            await self._refuse(scope, receive, send, "rate_limited", client, openai_error(
                429, f"rate limit reached for client {client!r}: at most {self.policy.max_requests_per_minute:g} "
                f"requests a minute; retry after {seconds} s.", code="rate_limit_exceeded",
                headers={"retry-after": str(seconds)}))
            return
        limit = self.policy.max_request_bytes
        length = _header(scope, b"content-length")
        if length is not None:
            if not length.isdigit():
                await self._refuse(scope, receive, send, "bad_request", client,
                                   openai_error(400, "the Content-Length header is not a number of bytes."))
                return
            if int(length) > limit:
                await self._refuse(scope, receive, send, "too_large", client, self._too_large(int(length)))
                return
        try:
            body = await _read_body(receive, limit)
        except _TooLarge:
            await self._refuse(scope, receive, send, "too_large", client, self._too_large(None))
            return
        if self.metrics is not None:
            self.metrics.requests.labels(client=client).inc()
        scope["hf_defer.client"] = client
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _client(self, scope: dict[str, Any]) -> tuple[str, Any]:
        """The client id of a request, or the 401 answer that refuses it."""
        keys = self.policy.metrics_keys if scope["path"] == "/metrics" and self.policy.metrics_keys \
            else self.policy.client_keys
        if not keys:
            return ANONYMOUS, None
        authorization = _header(scope, b"authorization")
        scheme, _, token = (authorization or "").partition(" ")
        given = token.strip().encode("latin-1") if scheme.lower() == "bearer" else None
        name = match_key(given, keys)
        if name is not None:
            return name, None
        message = ("no API key: send it as the header 'Authorization: Bearer <key>'" if given is None else
                   "incorrect API key provided") + (" (this path takes the metrics keys)." if keys is
                                                      self.policy.metrics_keys else ".")
        return UNKNOWN, openai_error(401, message, code="invalid_api_key", headers={"www-authenticate": "Bearer"})

    def _too_large(self, length: int | None) -> Any:
        size = "" if length is None else f" ({length} bytes)"
        return openai_error(413, f"the request body{size} is larger than the server's limit of "
                            f"{self.policy.max_request_bytes} bytes.", code="request_too_large")

    async def _refuse(self, scope: dict[str, Any], receive: Any, send: Any, reason: str, client: str,
                      response: Any) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(reason=reason, client=client).inc()
        response.headers["connection"] = "close"  # the server reads no more of a body it refused
        await response(scope, receive, send)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _read_body(receive: Any, limit: int) -> bytes:
    """The whole request body, counting bytes as they come: `_TooLarge` once they pass `limit` (nothing more read)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
