"""`hf_defer.serving.access`: client keys (parsed, ids that never are the key, constant-time matching), the token bucket
(against its guarantee, drawn with hypothesis) and the guard in front of a tiny echo app, through httpx's ASGI
transport: 401 / 429 / 413 in OpenAI's shape, and a body over the limit refused without reading it to its end."""

from __future__ import annotations

import asyncio
import hashlib
import math

import httpx
import pytest
from fastapi import FastAPI, Request
from hypothesis import given
from hypothesis import strategies as st

from hf_defer.serving.access import (ANONYMOUS, AccessGuard, AccessPolicy, TokenBucket, client_id, match_key,
                                     parse_client_keys)
from hf_defer.serving.errors import install_error_handlers
from hf_defer.serving.metrics import ClientMetrics, registry_as_json

KEY_A = "sk-team-a-0123456789abcdef"
KEY_B = "sk-B-fedcba9876543210zyx"


def test_keys_are_parsed_with_names_or_an_id_from_their_digest():
    keys = parse_client_keys(f" team-a:{KEY_A} ,{KEY_B}", "--auth_keys_env K")
    assert [key.name for key in keys] == ["team-a", "key-" + hashlib.sha256(KEY_B.encode()).hexdigest()[:8]]
    assert [key.digest for key in keys] == [hashlib.sha256(KEY_A.encode()).digest(),
                                            hashlib.sha256(KEY_B.encode()).digest()]
    assert KEY_A not in repr(keys) and KEY_B not in repr(keys)
    assert client_id(KEY_B) == keys[1].name
    assert match_key(KEY_A.encode(), keys) == "team-a" and match_key(KEY_B.encode(), keys) == keys[1].name
    for wrong in (None, b"", KEY_A[:-1].encode(), (KEY_A[:-1] + "g").encode(), (KEY_A + "0").encode(),
                  KEY_A.upper().encode(), b"team-a"):
        assert match_key(wrong, keys) is None


@pytest.mark.parametrize("value, words", [
    (None, "not set or empty"),
    ("  ", "not set or empty"),
    ("short-key", "key 1 has 9 characters; use at least 16"),
    (f"{KEY_A},{KEY_A}", "key 2: that key or name is given twice"),
    (f"a:{KEY_A},a:{KEY_B}", r"key 2 \('a'\): that key or name is given twice"),
    (f"{KEY_A},", "key 2 is empty"),
    (f"team a:{KEY_A}", "a name .* is letters, digits"),
    ("sk-with a space-0123456789", "has spaces or characters outside printable ASCII"),
])
def test_bad_keys_are_named_by_position_never_shown(value, words):
    with pytest.raises(ValueError, match=words) as caught:
        parse_client_keys(value, "--auth_keys_env K")
    assert "--auth_keys_env K" in str(caught.value)
    for secret in (KEY_A, KEY_B, "short-key", "sk-with a space-0123456789"):
        assert secret not in str(caught.value)


def test_the_bucket_refills_at_its_rate_worked_by_hand():
    now = [0.0]
    bucket = TokenBucket(capacity=3, rate=0.5, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [0.0, 0.0, 0.0, 2.0]  # 3 tokens, then 1 / 0.5 s to the next
    now[0] = 1.0
    assert bucket.take() == pytest.approx(1.0)  # half a token back
    now[0] = 2.0
    assert bucket.take() == 0.0 and bucket.take() == pytest.approx(2.0)
    now[0] = 100.0  # full again, never more than its capacity
    assert [bucket.take() for _ in range(4)][:3] == [0.0] * 3 and bucket.take() > 0


@given(capacity=st.integers(1, 5), per_second=st.floats(0.1, 10),
       gaps=st.lists(st.floats(0, 3), min_size=1, max_size=40))
def test_the_bucket_keeps_its_guarantee(capacity, per_second, gaps):
    """In any window of w seconds at most capacity + rate * w requests get through; a refused request would have got
    through had it come `wait` seconds later (and not a bit before)."""
    times = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    now = [0.0]
    bucket = TokenBucket(capacity, per_second, clock=lambda: now[0])
    allowed = []
    for t in times:
        now[0] = t
        state = (bucket.tokens, bucket.updated)
        wait = bucket.take()
        if wait == 0:
            allowed.append(t)
            continue
        probe = TokenBucket(capacity, per_second, clock=lambda: now[0])
        probe.tokens, probe.updated = state
        now[0] = t + wait * 0.999
        assert probe.take() > 0
        probe.tokens, probe.updated = state
        now[0] = t + wait + 1e-9
        assert probe.take() == 0
        now[0] = t
    for i, start in enumerate(allowed):
        for j in range(i, len(allowed)):
            assert j - i + 1 <= capacity + per_second * (allowed[j] - start) + 1e-9


def echo_app(policy: AccessPolicy) -> tuple[FastAPI, ClientMetrics, list[int]]:
    """An app behind the guard that answers with the client id and the size of the body it got."""
    from prometheus_client import CollectorRegistry

    metrics = ClientMetrics(CollectorRegistry(), policy.client_names)
    sizes: list[int] = []
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(AccessGuard, policy=policy, metrics=metrics)

    @app.post("/v1/echo")
    async def echo(request: Request) -> dict:
        body = await request.body()
        sizes.append(len(body))
        return {"client": request.scope["hf_defer.client"], "size": len(body)}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics_endpoint() -> dict:
        return {"ok": True}

    return app, metrics, sizes


def call(app: FastAPI, *requests: tuple) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as http:
            return [await http.request(method, path, **kwargs) for method, path, kwargs in requests]

    return asyncio.run(run())


def assert_openai_error(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and words in error["message"]


def test_keys_open_every_path_but_the_health_check():
    keys = parse_client_keys(f"team-a:{KEY_A}", "K")
    app, metrics, sizes = echo_app(AccessPolicy(keys))
    bearer = {"Authorization": f"Bearer {KEY_A}"}
    responses = call(app, ("POST", "/v1/echo", {"content": b"{}"}),
                     ("POST", "/v1/echo", {"content": b"{}",
                                           "headers": {"Authorization": "Bearer " + "x" * len(KEY_A)}}),
                     ("POST", f"/v1/echo?api_key={KEY_A}", {"content": b"{}"}),
                     ("POST", "/v1/echo", {"content": b"{}", "headers": {"x-api-key": KEY_A, "api-key": KEY_A}}),
                     ("POST", "/v1/echo", {"content": b"{}", "headers": {"Authorization": f"Basic {KEY_A}"}}),
                     ("GET", "/metrics", {}), ("GET", "/no/such/path", {}),
                     ("GET", "/health", {}),
                     ("POST", "/v1/echo", {"content": b"{}", "headers": bearer}),
                     ("POST", "/v1/echo", {"content": b"{}", "headers": {"authorization": f"bearer {KEY_A}"}}),
                     ("GET", "/no/such/path", {"headers": bearer}))
    for response in responses[:7]:
        assert_openai_error(response, 401, "API key")
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert "no API key" in responses[0].json()["error"]["message"]
    assert responses[7].json() == {"status": "ok"}
    assert [r.json() for r in responses[8:10]] == [{"client": "team-a", "size": 2}] * 2
    assert_openai_error(responses[10], 404, "no route GET /no/such/path")
    assert sizes == [2, 2]  # no refused body reached the app
    counts = registry_as_json(metrics.registry)
    assert counts["client_requests"] == {"team-a": 3.0} and counts["rejected"] == {"unauthorized": {"-": 7.0}}


def test_metrics_takes_its_own_keys_when_given():
    keys, scraper = parse_client_keys(f"team-a:{KEY_A}", "K"), parse_client_keys(f"prom:{KEY_B}", "M")
    app, _, _ = echo_app(AccessPolicy(keys, scraper))
    got = call(app, ("GET", "/metrics", {"headers": {"Authorization": f"Bearer {KEY_A}"}}),
               ("GET", "/metrics", {"headers": {"Authorization": f"Bearer {KEY_B}"}}),
               ("POST", "/v1/echo", {"content": b"{}", "headers": {"Authorization": f"Bearer {KEY_B}"}}))
    assert_openai_error(got[0], 401, "this path takes the metrics keys")
    assert got[1].json() == {"ok": True}
    assert_openai_error(got[2], 401, "incorrect API key")  # a scraper's key calls nothing else


def test_a_burst_over_the_rate_gets_429_with_retry_after_and_other_keys_go_on():
    keys = parse_client_keys(f"a:{KEY_A},b:{KEY_B}", "K")
    app, metrics, _ = echo_app(AccessPolicy(keys, max_requests_per_minute=3))  # 3 at once, then one every 20 s
    a, b = ({"content": b"{}", "headers": {"Authorization": f"Bearer {key}"}} for key in (KEY_A, KEY_B))
    got = call(app, *[("POST", "/v1/echo", a)] * 5, ("POST", "/v1/echo", b), ("GET", "/health", {}))
    assert [r.status_code for r in got] == [200, 200, 200, 429, 429, 200, 200]
    for refused in got[3:5]:
        assert_openai_error(refused, 429, "rate limit reached for client 'a': at most 3 requests a minute")
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert 19 <= int(refused.headers["retry-after"]) <= 20  # 1 token / (3 / 60 per second), less what refilled
    counts = registry_as_json(metrics.registry)
    assert counts["client_requests"] == {"a": 3.0, "b": 1.0} and counts["rejected"] == {"rate_limited": {"a": 2.0}}


def test_a_body_over_the_limit_is_refused_without_reading_it_to_its_end():
    app, metrics, sizes = echo_app(AccessPolicy(max_request_bytes=1000))
    produced = []

    async def endless():  # a chunked body without Content-Length that never ends
        while True:
            produced.append(300)
            yield b"x" * 300

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as http:
            return [await http.post("/v1/echo", content=b"x" * 1000),
                    await http.post("/v1/echo", content=b"x" * 1001),
                    await http.post("/v1/echo", content=endless()),
                    await http.post("/v1/echo", content=b"{}", headers={"content-length": "lots"})]

    exact, over, streamed, malformed = asyncio.run(run())
    assert exact.json() == {"client": ANONYMOUS, "size": 1000}
    assert_openai_error(over, 413, "the request body (1001 bytes) is larger than the server's limit of 1000 bytes")
    assert_openai_error(streamed, 413, "larger than the server's limit of 1000 bytes")
    assert len(produced) <= math.ceil(1001 / 300) + 1  # read up to the limit, then no more
    assert_openai_error(malformed, 400, "Content-Length")
    assert sizes == [1000]
    assert registry_as_json(metrics.registry)["rejected"] == {"bad_request": {ANONYMOUS: 1.0},
                                                              "too_large": {ANONYMOUS: 2.0}}


def test_a_refused_key_is_refused_before_its_body_is_read():
    app, _, sizes = echo_app(AccessPolicy(parse_client_keys(KEY_A, "K"), max_request_bytes=10))
    produced = []

    async def endless():
        while True:
            produced.append(1)
            yield b"x" * 100

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as http:
            return await http.post("/v1/echo", content=endless())

    assert_openai_error(asyncio.run(run()), 401, "no API key")
    assert sizes == [] and len(produced) <= 1


@pytest.mark.parametrize("kwargs, words", [({"max_requests_per_minute": 0}, "max_requests_per_minute"),
                                           ({"max_requests_per_minute": float("nan")}, "max_requests_per_minute"),
                                           ({"max_request_bytes": 0}, "max_request_bytes"),
                                           ({"max_request_bytes": 1.5}, "max_request_bytes")])
def test_a_policy_with_bad_limits_is_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        AccessPolicy(**kwargs)


def test_the_examples_of_the_module_run():
    import doctest

    from hf_defer.serving import access, errors, metrics

    for module in (access, errors, metrics):
        failed, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert failed == 0 and tried > 0, module.__name__
