"""Both apps of `hf-defer serve` with client keys, tried as an attacker would: no key, a wrong key, a key of the right
length, a key in the query string, a huge body, a burst over the rate, a request naming an upstream directly, bodies of
the wrong shape. None gets through (no upstream call, no review task), none makes the server fail, and the allowed
clients are served all along. The router app runs on 127.0.0.1 with uvicorn, called with the official `openai`
client, against two fake upstreams (the strong one behind an API key of its own)."""

from __future__ import annotations

import asyncio
import hashlib
import logging

import httpx
import openai
import pytest
from hypothesis_profiles import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_upstream import UpstreamBehaviour, answer_text, fake_upstream_app, serve_in_thread
from hf_defer import EncoderForDeferral
from hf_defer.serving import PromptRouter, build_router_app
from hf_defer.serving.access import AccessPolicy, parse_client_keys
from hf_defer.serving.routing import load_router_pipeline
from hf_defer.serving.upstream import parse_upstreams
from tiny_router import PROMPTS, margins_by_forward

KEY_A = "sk-team-a-0123456789abcdef"
KEY_B = "sk-B-fedcba9876543210zyx"
UPSTREAM_KEY = "sk-upstream-SECRET-4242424242"
ID_B = "key-" + hashlib.sha256(KEY_B.encode()).hexdigest()[:8]
PRICES = {"strong": 30.0, "weak": 1.0}


@pytest.fixture(scope="module")
def expected(router_folder) -> dict[str, str]:
    threshold = EncoderForDeferral.from_pretrained(router_folder).config.defer_threshold
    margins = margins_by_forward(router_folder, PROMPTS)
    return {p: "strong" if m > threshold else "weak" for p, m in zip(PROMPTS, margins)}


@pytest.fixture(scope="module")
def fakes():
    behaviours = {name: UpstreamBehaviour(name) for name in ("weak", "strong")}
    with serve_in_thread(fake_upstream_app(behaviours["weak"])) as weak, \
            serve_in_thread(fake_upstream_app(behaviours["strong"])) as strong:
        yield behaviours, {"weak": weak + "/v1", "strong": strong + "/v1"}


def start(router_folder, urls, policy):
    router = PromptRouter(load_router_pipeline(str(router_folder)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DEFER_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
        upstreams = parse_upstreams(router.expert_names, urls, model_ids={"strong": "big-model-v2"},
                                    prices={k: str(v) for k, v in PRICES.items()},
                                    api_key_envs={"strong": "HF_DEFER_TEST_UPSTREAM_KEY"})
    return serve_in_thread(build_router_app(router, upstreams, access=policy))


@pytest.fixture(scope="module")
def served(router_folder, fakes):
    """The router app with two client keys (team-a named, the other known by its digest), 1000 requests a minute
    for each, 20 kB bodies; the strong upstream takes the key UPSTREAM_KEY."""
    behaviours, urls = fakes
    policy = AccessPolicy(parse_client_keys(f"team-a:{KEY_A},{KEY_B}", "K"), max_requests_per_minute=1000,
                          max_request_bytes=20_000)
    with start(router_folder, urls, policy) as url:
        yield url, behaviours


@pytest.fixture()
def behaviours(served):
    _, behaviours = served
    for behaviour in behaviours.values():
        behaviour.mode = "ok"
        behaviour.received.clear()
        behaviour.headers.clear()
    return behaviours


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)


def ask(chat: openai.OpenAI, prompt: str, model: str = "hf-defer-router"):
    return chat.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}])


def metrics_of(url: str) -> dict:
    return httpx.get(url + "/metrics", params={"format": "json"}, headers={"Authorization": f"Bearer {KEY_A}"}).json()


def server_log(caplog) -> str:
    """What the server side logged (uvicorn, FastAPI, hf_defer), not the clients' debug logs of what they send."""
    return "\n".join(record.getMessage() for record in caplog.records
                     if record.name.split(".")[0] in ("uvicorn", "fastapi", "starlette", "hf_defer"))


def test_the_openai_client_is_served_with_a_key_and_refused_without(served, behaviours, expected, caplog):
    url, _ = served
    before = metrics_of(url)
    caplog.set_level(logging.DEBUG)
    prompts = PROMPTS[:6]
    answers = [ask(client(url, KEY_A if i % 2 == 0 else KEY_B), p) for i, p in enumerate(prompts)]
    for prompt, answer in zip(prompts, answers):
        assert answer.choices[0].message.content == answer_text(expected[prompt], prompt)
    refused = []
    for key in ("sk-not-a-key-at-all", "x" * len(KEY_A), KEY_A[:-1] + "g", KEY_A + "x", KEY_A.upper()):
        with pytest.raises(openai.AuthenticationError) as caught:
            ask(client(url, key), prompts[0])
        refused.append(caught.value)
    with pytest.raises(openai.AuthenticationError, match="no API key"):
        openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                      default_headers={"Authorization": ""}).models.list()
    with pytest.raises(openai.AuthenticationError):
        client(url, "sk-wrong-wrong-wrong-wrong").models.list()
    models = client(url, KEY_B).models.list()
    after = metrics_of(url)
    assert [m.id for m in models.data] == ["hf-defer-router", "weak", "strong"]
    assert all(error.status_code == 401 and error.body["code"] == "invalid_api_key" for error in refused)
    # the upstreams saw the six allowed requests only; the strong one got its own key, never a client's
    n_strong = sum(expected[p] == "strong" for p in prompts)
    assert len(behaviours["strong"].received) == n_strong and len(behaviours["weak"].received) == 6 - n_strong
    assert {h["authorization"] for h in behaviours["strong"].headers} <= {f"Bearer {UPSTREAM_KEY}"}
    assert all("authorization" not in h for h in behaviours["weak"].headers)
    # by client: counts, tokens (15 an answer) and their price, worked out from the routing
    for name, indices in (("team-a", [0, 2, 4]), (ID_B, [1, 3, 5])):
        cost = sum(15 * PRICES[expected[prompts[i]]] / 1e6 for i in indices)
        assert after["client_cost"][name] - before["client_cost"][name] == pytest.approx(cost)
        assert after["client_tokens"][name] - before["client_tokens"].get(name, 0) == 45
    assert after["client_requests"]["team-a"] - before["client_requests"]["team-a"] == 3 + 1  # + the metrics read
    assert after["client_requests"][ID_B] - before["client_requests"][ID_B] == 3 + 1  # + /v1/models
    assert after["rejected"]["unauthorized"]["-"] - before.get("rejected", {}).get("unauthorized", {}).get("-", 0) == 7
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY_B}"}).text
    for secret in (KEY_A, KEY_B, UPSTREAM_KEY):
        assert secret not in text and secret not in server_log(caplog)
    assert f'hf_defer_client_requests_total{{client="{ID_B}"}}' in text


def test_a_request_naming_an_upstream_directly_gets_nowhere_without_a_key(served, behaviours, fakes):
    url, _ = served
    attempts = [
        httpx.post(url + "/v1/chat/completions", json={"model": "strong", "messages": [{"role": "user",
                                                                                          "content": "hi"}]}),
        httpx.post(url + "/v1/chat/completions", json={"model": "big-model-v2", "messages": [{"role": "user",
                                                                                                "content": "hi"}]},
                   params={"api_key": KEY_A, "key": KEY_A}),
        httpx.post(url + "/strong/v1/chat/completions", json={"model": "strong", "messages": []}),
        httpx.get(url + "/v1/models", headers={"x-api-key": KEY_A, "api-key": KEY_A}),
        httpx.get(url + "/metrics"), httpx.get(url + "/docs"), httpx.get(url + "/openapi.json"),
    ]
    assert [a.status_code for a in attempts] == [401] * len(attempts)
    assert all(a.json()["error"]["code"] == "invalid_api_key" for a in attempts)
    with_key = client(url, KEY_A)
    for model in ("big-model-v2", fakes[1]["strong"], fakes[1]["strong"] + "/chat/completions"):
        with pytest.raises(openai.NotFoundError, match="is not served here"):
            ask(with_key, "hi", model=model)
    assert behaviours["strong"].received == [] and behaviours["weak"].received == []
    assert httpx.get(url + "/health").json() == {"status": "ok"}


def test_an_upstream_that_echoes_its_key_does_not_give_it_away(served, behaviours, expected, caplog):
    url, _ = served
    behaviours["strong"].mode = "echo_key"
    prompt = next(p for p in PROMPTS if expected[p] == "strong")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(openai.APIStatusError, match=r"answered HTTP 401: bad credentials Bearer \*\*\*") as caught:
        ask(client(url, KEY_A), prompt)
    assert caught.value.status_code == 502 and behaviours["strong"].headers[-1]["authorization"].endswith(UPSTREAM_KEY)
    assert UPSTREAM_KEY not in str(caught.value.body) and UPSTREAM_KEY not in server_log(caplog)


@pytest.mark.parametrize("body, param", [
    ({"model": ["hf-defer-router"], "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": {"name": "strong"}, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 42}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [7]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": 3, "content": "hi"}]}, "messages[0].role"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": {"text": "hi"}}]}, "messages[0].content"),
    ({"messages": {"role": "user"}}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
    ({"messages": [{"role": "user", "content": "hi"}], "metadata": ["a"]}, "metadata"),
    ({"messages": [{"role": "user", "content": "hi"}], "metadata": {"tier": ["pro"]}}, "metadata.tier"),
])
def test_a_body_of_the_wrong_shape_is_400_in_openais_shape(served, behaviours, body, param):
    url, _ = served
    response = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY_A}"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param and response.json()["error"]["type"] == "invalid_request_error"
    assert behaviours["strong"].received == [] and behaviours["weak"].received == []


def test_the_openai_client_sending_a_wrong_model_type_gets_a_bad_request(served, behaviours):
    url, _ = served
    with pytest.raises(openai.BadRequestError, match="model must be a string"):
        client(url, KEY_A).chat.completions.create(model=["hf-defer-router"],  # type: ignore[arg-type]
                                                   messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[0\]\.text must be a string"):
        client(url, KEY_A).chat.completions.create(model="hf-defer-router", messages=[
            {"role": "user", "content": [{"type": "text", "text": 3}]}])  # type: ignore[list-item]


@pytest.mark.parametrize("content, words", [
    (b"[" * 15_000, "nested too deeply"),
    (b'{"messages": "\xff\xfe"}', "is not valid JSON"),
    (b"not json", "is not valid JSON"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', "Infinity is not a JSON number"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "model": NaN}', "NaN is not a JSON number"),
    (b"[1, 2]", "must be a JSON object"),
    (b"x" * 20_001, "larger than the server's limit of 20000 bytes"),
])
def test_malformed_and_huge_bodies_are_refused(served, behaviours, content, words):
    url, _ = served
    status = 413 if len(content) > 20_000 else 400
    response = httpx.post(url + "/v1/chat/completions", content=content,
                          headers={"Authorization": f"Bearer {KEY_A}", "content-type": "application/json"})
    assert response.status_code == status and words in response.json()["error"]["message"]


def test_a_huge_streamed_body_is_cut_off(served, behaviours):
    url, _ = served
    sent = []

    def endless():
        while True:
            sent.append(1)
            yield b" " * 4096

    try:  # the server answers 413 and closes the connection: the client sees the answer, or a closed socket
        response = httpx.post(url + "/v1/chat/completions", content=endless(),
                              headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30)
        assert response.status_code == 413 and "larger than the server's limit" in response.json()["error"]["message"]
    except httpx.TransportError:
        pass
    assert len(sent) < 5000  # the server stopped reading soon after the limit (socket buffers aside), not never
    assert httpx.get(url + "/health").status_code == 200


NUMBER = st.integers() | st.floats(allow_nan=False, allow_infinity=False)  # what a JSON client can send
SCALAR = st.none() | st.booleans() | NUMBER | st.text(max_size=5)
JSON = st.recursive(SCALAR,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)
MESSAGE = st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "system"]) | JSON,
                                              "content": st.text(max_size=8) | JSON | st.lists(
                                                  st.fixed_dictionaries({}, optional={
                                                      "type": st.just("text") | JSON, "text": JSON}), max_size=2)})
BODY = st.fixed_dictionaries({}, optional={"model": st.sampled_from(["hf-defer-router", "weak", "nope"]) | JSON,
                                           "messages": st.lists(MESSAGE, max_size=3) | JSON,
                                           "stream": st.just(False) | JSON, "metadata": JSON})


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODY)
def test_no_request_body_makes_the_server_fail(served, body):
    """Any JSON object with the chat fields of any type: a 200 from an upstream, or a 4xx in OpenAI's shape; never a
    5xx."""
    url, behaviours = served
    for behaviour in behaviours.values():
        behaviour.mode = "ok"
    response = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY_B}"},
                          timeout=30)
    if response.status_code == 200:
        assert "hf_defer" in response.json()
    else:
        assert 400 <= response.status_code < 500, (body, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_allowed_clients_are_served_during_an_attack(served, behaviours, expected):
    """Concurrently: a flood of keyless and wrong-key requests, huge bodies and malformed ones, and one client's
    requests, which are all answered by the right model."""
    url, _ = served

    async def attack(http: httpx.AsyncClient, i: int) -> int:
        kind = i % 4
        if kind == 0:
            r = await http.post("/v1/chat/completions", json={"model": "strong", "messages": [
                {"role": "user", "content": "spend"}]})
        elif kind == 1:
            r = await http.post("/v1/chat/completions", headers={"Authorization": "Bearer " + "y" * len(KEY_A)},
                                json={"messages": [{"role": "user", "content": "spend"}]})
        elif kind == 2:
            r = await http.post("/v1/chat/completions", content=b"[" * 30_000,
                                headers={"Authorization": f"Bearer {KEY_B}"})
        else:
            r = await http.post("/v1/chat/completions", json={"model": {"$ne": None}, "messages": []},
                                headers={"Authorization": f"Bearer {KEY_B}"})
        return r.status_code

    async def legit(http: httpx.AsyncClient, prompt: str) -> tuple[str, str]:
        r = await http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY_A}"},
                            json={"model": "hf-defer-router", "messages": [{"role": "user", "content": prompt}]})
        r.raise_for_status()
        return prompt, r.json()["choices"][0]["message"]["content"]

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            return await asyncio.gather(asyncio.gather(*(attack(http, i) for i in range(120))),
                                        asyncio.gather(*(legit(http, p) for p in PROMPTS[:12])))

    statuses, answers = asyncio.run(run())
    assert statuses == [401, 401, 413, 400] * 30
    assert all(content == answer_text(expected[p], p) for p, content in answers)
    n_strong = sum(expected[p] == "strong" for p in PROMPTS[:12])
    assert len(behaviours["strong"].received) == n_strong  # the flood reached no upstream


def test_a_burst_over_the_rate_is_429_for_that_key_only(router_folder, fakes):
    behaviours, urls = fakes
    policy = AccessPolicy(parse_client_keys(f"team-a:{KEY_A},{KEY_B}", "K"), max_requests_per_minute=2)
    with start(router_folder, urls, policy) as url:
        a, b = client(url, KEY_A), client(url, KEY_B)
        ask(a, PROMPTS[0]), ask(a, PROMPTS[1])
        with pytest.raises(openai.RateLimitError, match="rate limit reached for client 'team-a'") as caught:
            ask(a, PROMPTS[2])
        served_b = ask(b, PROMPTS[2])  # another key has its own bucket
        metrics = httpx.get(url + "/metrics", params={"format": "json"}, headers={"Authorization": f"Bearer {KEY_B}"})
    assert caught.value.status_code == 429 and 29 <= int(caught.value.response.headers["retry-after"]) <= 30
    assert served_b.choices[0].message.content.endswith(PROMPTS[2])
    assert metrics.json()["rejected"] == {"rate_limited": {"team-a": 1.0}}


def test_routed_only_leaves_key_holders_no_way_around_the_router(router_folder, fakes, expected):
    """With `pinning=False` (`--routed_only`) even a key holder cannot name the strong model: 404, nothing sent there,
    and the cap counts every request."""
    behaviours, urls = fakes
    for behaviour in behaviours.values():
        behaviour.mode = "ok"
        behaviour.received.clear()
    router = PromptRouter(load_router_pipeline(str(router_folder)), max_strong_rate=0.0)
    upstreams = parse_upstreams(router.expert_names, urls)
    policy = AccessPolicy(parse_client_keys(KEY_A, "K"))
    with serve_in_thread(build_router_app(router, upstreams, access=policy, pinning=False)) as url:
        chat = client(url, KEY_A)
        prompt = next(p for p in PROMPTS if expected[p] == "strong")
        for model in ("strong", "weak"):
            with pytest.raises(openai.NotFoundError, match="this server routes every request"):
                ask(chat, prompt, model=model)
        answer = ask(chat, prompt)
        models = [m.id for m in chat.models.list().data]
    assert behaviours["strong"].received == [] and len(behaviours["weak"].received) == 1
    assert answer.hf_defer == {"model": "weak", "routed_to": "strong", "capped": True, "margin": answer.hf_defer[
        "margin"], "fallback_from": []}
    assert models == ["hf-defer-router"]
