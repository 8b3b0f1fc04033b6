"""`hf-defer serve --router`: the routing app with the official `openai` client against two fake upstream servers on
127.0.0.1 (no network). The routing decisions are checked against the router model's own forward pass, worked out
here: a prompt goes to `strong` iff sigmoid(u_strong) - sigmoid(u_weak) > the threshold saved in its config."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fake_upstream import UpstreamBehaviour, answer_text, fake_upstream_app, serve_in_thread
from hf_defer import EncoderForDeferral, calibrate_deferral
from hf_defer.serving import PromptRouter, build_router_app
from hf_defer.serving.access import AccessPolicy, parse_client_keys
from hf_defer.serving.routing import load_router_pipeline
from hf_defer.serving.upstream import parse_upstreams
from tiny_router import PROMPTS, margins_by_forward


@pytest.fixture(scope="module")
def expected(router_folder) -> dict[str, str]:
    threshold = EncoderForDeferral.from_pretrained(router_folder).config.defer_threshold
    return {p: "strong" if m > threshold else "weak" for p, m in zip(PROMPTS, margins_by_forward(router_folder, PROMPTS))}


@pytest.fixture(scope="module")
def upstreams():
    behaviours = {name: UpstreamBehaviour(name) for name in ("weak", "strong")}
    with serve_in_thread(fake_upstream_app(behaviours["weak"])) as weak, \
            serve_in_thread(fake_upstream_app(behaviours["strong"])) as strong:
        yield behaviours, {"weak": weak + "/v1", "strong": strong + "/v1"}


@pytest.fixture()
def behaviours(upstreams):
    behaviours, _ = upstreams
    for behaviour in behaviours.values():
        behaviour.mode, behaviour.delay = "ok", 0.0
        behaviour.received.clear()
    return behaviours


@pytest.fixture(scope="module")
def pipe(router_folder):
    return load_router_pipeline(str(router_folder))


def start(pipe, upstreams, **kwargs):
    _, urls = upstreams
    router_kwargs = {k: kwargs.pop(k) for k in ("max_strong_rate", "defer_threshold") if k in kwargs}
    router = PromptRouter(pipe, **router_kwargs)
    up = parse_upstreams(router.expert_names, urls, model_ids={"strong": "big-model-v2"},
                         prices={"strong": "30", "weak": "1"})
    return serve_in_thread(build_router_app(router, up, **kwargs))


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20)


def ask(chat: openai.OpenAI, prompt: str, **kwargs):
    return chat.chat.completions.with_raw_response.create(model="hf-defer-router",
                                                          messages=[{"role": "user", "content": prompt}], **kwargs)


def test_routes_each_prompt_as_the_router_model_decides(pipe, upstreams, behaviours, expected):
    assert 4 <= sum(expected[p] == "strong" for p in PROMPTS) <= 20  # both upstreams get work
    with start(pipe, upstreams) as url:
        chat = client(url)
        for prompt in PROMPTS:
            raw = ask(chat, prompt)
            completion = raw.parse()
            answered = expected[prompt]
            assert raw.headers["x-hf-defer-model"] == answered
            assert completion.hf_defer["model"] == answered and completion.hf_defer["fallback_from"] == []
            assert completion.choices[0].message.content == answer_text(answered, prompt)
        models = chat.models.list()
        metrics = httpx.get(url + "/metrics", params={"format": "json"}).json()
        text = httpx.get(url + "/metrics").text
    assert [m.id for m in models.data] == ["hf-defer-router", "weak", "strong"]
    n_strong = sum(expected[p] == "strong" for p in PROMPTS)
    assert [body["model"] for body in behaviours["strong"].received] == ["big-model-v2"] * n_strong
    assert len(behaviours["weak"].received) == len(PROMPTS) - n_strong
    assert metrics["routed"] == {"strong": n_strong, "weak": len(PROMPTS) - n_strong}
    assert metrics["upstream_calls"]["strong"] == {"error": 0, "ok": n_strong, "timeout": 0}
    assert metrics["requests"] == {"chat_completions": len(PROMPTS)}
    assert metrics["tokens"]["strong"] == 15 * n_strong
    assert metrics["cost"]["strong"] == pytest.approx(15 * n_strong * 30 / 1e6)
    assert metrics["routing_seconds"]["count"] == len(PROMPTS)
    assert f'hf_defer_routed_total{{model="strong"}} {float(n_strong)}' in text


def test_streaming_passes_the_upstream_events_through(pipe, upstreams, behaviours, expected):
    prompt = next(p for p in PROMPTS if expected[p] == "strong")
    with start(pipe, upstreams) as url:
        chat = client(url)
        with chat.chat.completions.with_streaming_response.create(
                model="hf-defer-router", messages=[{"role": "user", "content": prompt}], stream=True) as response:
            assert response.headers["x-hf-defer-model"] == "strong"
            text = "".join(chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices)
        metrics = httpx.get(url + "/metrics", params={"format": "json"}).json()
    assert text == answer_text("strong", prompt)
    assert behaviours["strong"].received[-1]["stream"] is True
    assert metrics["upstream_calls"]["strong"] == {"error": 0.0, "ok": 1.0, "timeout": 0.0}


def test_a_pinned_model_is_not_routed_and_an_unknown_model_is_refused(pipe, upstreams, behaviours, expected):
    prompt = next(p for p in PROMPTS if expected[p] == "strong")
    with start(pipe, upstreams) as url:
        chat = client(url)
        raw = chat.chat.completions.with_raw_response.create(model="weak", messages=[{"role": "user", "content": prompt}])
        with pytest.raises(openai.NotFoundError, match="'gpt-5' is not served here"):
            chat.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": prompt}])
        with pytest.raises(openai.BadRequestError, match="no user message"):
            chat.chat.completions.create(model="hf-defer-router", messages=[{"role": "system", "content": "hi"}])
        metrics = httpx.get(url + "/metrics", params={"format": "json"}).json()
    assert raw.headers["x-hf-defer-model"] == "weak" and raw.parse().hf_defer["routed_to"] is None
    assert metrics["pinned"] == {"weak": 1.0} and metrics["routed"] == {"strong": 0.0, "weak": 0.0}


@pytest.mark.parametrize("mode, status, words", [("error", 502, "answered HTTP 500: strong is overloaded"),
                                                 ("slow", 504, "did not answer in time"),
                                                 ("nan", 502, "a body that is not JSON")])
def test_an_upstream_failure_is_a_clear_error_without_fallback(pipe, upstreams, behaviours, expected, mode, status,
                                                               words):
    prompt = next(p for p in PROMPTS if expected[p] == "strong")
    behaviours["strong"].mode, behaviours["strong"].delay = mode, 2.0
    with start(pipe, upstreams, timeout=0.5) as url:
        with pytest.raises(openai.APIStatusError, match=words) as caught:
            ask(client(url), prompt)
        metrics = httpx.get(url + "/metrics", params={"format": "json"}).json()
    assert caught.value.status_code == status
    assert "strong" in caught.value.message and not behaviours["weak"].received  # no silent fall-back
    assert metrics["upstream_calls"]["strong"]["timeout" if mode == "slow" else "error"] == 1


def test_fallback_tries_the_other_model_and_says_so(pipe, upstreams, behaviours, expected):
    prompt = next(p for p in PROMPTS if expected[p] == "strong")
    behaviours["strong"].mode = "error"
    with start(pipe, upstreams, fallback=True) as url:
        raw = ask(client(url), prompt)
        behaviours["weak"].mode = "error"
        with pytest.raises(openai.APIStatusError, match="every model failed.*strong.*then.*weak") as caught:
            ask(client(url), prompt)
        metrics = httpx.get(url + "/metrics", params={"format": "json"}).json()
    assert raw.headers["x-hf-defer-model"] == "weak" and raw.headers["x-hf-defer-fallback-from"] == "strong"
    assert raw.parse().hf_defer == {"model": "weak", "routed_to": "strong", "capped": False, "margin": pytest.approx(
        raw.parse().hf_defer["margin"]), "fallback_from": ["strong"]}
    assert raw.parse().choices[0].message.content == answer_text("weak", prompt)
    assert caught.value.status_code == 502
    assert metrics["fallbacks"] == {"strong": {"weak": 2.0}}


def test_the_strong_call_cap_holds_in_arrival_order(pipe, upstreams, behaviours, expected):
    """With max_strong_rate r, the k-th prompt goes to strong iff the router wants it and the strong calls so far
    stay within floor(r k): worked out here over the prompts in the order they are sent."""
    rate, strong, want = 0.25, 0, []
    for k, prompt in enumerate(PROMPTS, start=1):
        go = expected[prompt] == "strong" and strong + 1 <= int(rate * k)
        strong += go
        want.append("strong" if go else "weak")
    assert want != [expected[p] for p in PROMPTS]  # the cap acts
    with start(pipe, upstreams, max_strong_rate=rate) as url:
        chat = client(url)
        raws = [ask(chat, prompt) for prompt in PROMPTS]
        metrics = httpx.get(url + "/metrics", params={"format": "json"}).json()
        wants_strong = next(p for p in PROMPTS if expected[p] == "strong")
        streamed = []
        for _ in range(2):  # a streamed answer says so in its headers
            with chat.chat.completions.with_streaming_response.create(
                    model="hf-defer-router", messages=[{"role": "user", "content": wants_strong}], stream=True) as sent:
                streamed.append((sent.headers["x-hf-defer-model"], sent.headers["x-hf-defer-capped"]))
    got = [raw.headers["x-hf-defer-model"] for raw in raws]
    assert got == want
    # a capped request says so itself: the router wanted strong, the cap sent it to weak
    capped = [expected[p] == "strong" and w == "weak" for p, w in zip(PROMPTS, want)]
    assert [raw.headers["x-hf-defer-capped"] for raw in raws] == ["true" if c else "false" for c in capped]
    assert [raw.parse().hf_defer["capped"] for raw in raws] == capped
    assert all(raw.parse().hf_defer["routed_to"] == expected[p] for raw, p in zip(raws, PROMPTS))
    assert metrics["capped"] == {"strong": float(sum(expected[p] == "strong" for p in PROMPTS) - strong)}
    want_streamed = []
    for k in (len(PROMPTS) + 1, len(PROMPTS) + 2):  # the 25th and 26th requests, by the same rule
        go = strong + 1 <= int(rate * k)
        strong += go
        want_streamed.append(("strong", "false") if go else ("weak", "true"))
    assert ("weak", "true") in want_streamed and streamed == want_streamed


def test_concurrent_requests_are_all_answered_by_the_right_model(pipe, upstreams, behaviours, expected):
    prompts = PROMPTS * 4

    async def many(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as http:
            return await asyncio.gather(*(http.post(url + "/v1/chat/completions", json={
                "model": "hf-defer-router", "messages": [{"role": "user", "content": p}]}) for p in prompts))

    with start(pipe, upstreams) as url:
        responses = asyncio.run(many(url))
    assert [r.status_code for r in responses] == [200] * len(prompts)
    assert [r.json()["choices"][0]["message"]["content"] for r in responses] == \
        [answer_text(expected[p], p) for p in prompts]


def test_a_stream_cut_mid_way_ends_with_an_error_event(pipe, upstreams, behaviours, expected):
    prompt = next(p for p in PROMPTS if expected[p] == "weak")
    behaviours["weak"].mode = "break"
    with start(pipe, upstreams) as url:
        chat = client(url)
        received = []
        with pytest.raises(openai.APIError, match="upstream model 'weak'"):
            for chunk in chat.chat.completions.create(model="hf-defer-router", stream=True,
                                                      messages=[{"role": "user", "content": prompt}]):
                received.append(chunk.choices[0].delta.content)
        metrics = httpx.get(url + "/metrics", params={"format": "json"}).json()
    assert received == [answer_text("weak", prompt).split(" ")[0]]  # the first chunk, then the error
    assert metrics["upstream_calls"]["weak"] == {"error": 1.0, "ok": 0.0, "timeout": 0.0}


def test_the_examples_of_the_serving_modules_run():
    import doctest

    from hf_defer.serving import metrics, router_app, routing, upstream

    for module in (metrics, router_app, routing, upstream):
        failed, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert failed == 0 and tried > 0, module.__name__


KEY = "sk-monitor-0123456789abcdef"


def gauges(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_monitor_watches_the_router_models_decisions_before_the_cap(pipe, upstreams, behaviours, expected):
    # max_strong_rate=0: every request is answered by weak, yet the monitor counts the model's own strong picks
    policy = AccessPolicy(parse_client_keys(KEY, "K"))
    with start(pipe, upstreams, max_strong_rate=0.0, access=policy) as url:
        chat = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=20)
        for prompt in PROMPTS:
            assert ask(chat, prompt).headers["x-hf-defer-model"] == "weak"
        chat.chat.completions.create(model="strong", messages=[{"role": "user", "content": PROMPTS[0]}])  # pinned
        refused = httpx.get(url + "/monitor")
        state = httpx.get(url + "/monitor", headers={"Authorization": f"Bearer {KEY}"}).json()
        text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert refused.status_code == 401
    n_strong = sum(expected[p] == "strong" for p in PROMPTS)
    assert 0 < n_strong < len(PROMPTS)
    assert state["rows"] == len(PROMPTS)  # the routed requests, not the pinned one
    rate = state["channels"]["deferral_rate"]
    assert rate["n"] == len(PROMPTS) and rate["mean"] == pytest.approx(n_strong / len(PROMPTS))
    assert state["channels"]["deferral_rate[strong]"]["mean"] == pytest.approx(n_strong / len(PROMPTS))
    assert rate["lower"] <= n_strong / len(PROMPTS) <= rate["upper"]
    # not calibrated with a confidence: the rates and the estimate without targets, and no alarm
    assert rate["target"] is None and state["alarm"] is None and state["guarantee"] is None
    found = gauges(text)
    model = str(pipe.model.config._name_or_path)
    assert found["hf_defer_monitor_mean", (("channel", "deferral_rate"), ("model", model))] == pytest.approx(
        n_strong / len(PROMPTS))
    assert found["hf_defer_monitor_rows", (("model", model),)] == len(PROMPTS)
    assert not any(name == "hf_defer_monitor_alarm" for name, _ in found)  # nothing has a target
    assert found["hf_defer_routed_total", (("model", "strong"),)] == 0.0  # the cap held every strong pick back


def test_a_calibrated_routers_budget_is_monitored(router_folder, upstreams, behaviours):
    pipe = load_router_pipeline(str(router_folder))  # its own copy: calibrating moves the threshold
    calibrate_deferral(pipe, PROMPTS, max_deferral_rate=0.5, confidence=0.9)
    threshold = pipe.model.config.defer_threshold
    n_strong = sum(m > threshold for m in margins_by_forward(router_folder, PROMPTS))
    with start(pipe, upstreams) as url:
        chat = client(url)
        answered = [ask(chat, prompt).headers["x-hf-defer-model"] for prompt in PROMPTS]
        state = httpx.get(url + "/monitor").json()
        text = httpx.get(url + "/metrics").text
    assert answered.count("strong") == n_strong
    rate = state["channels"]["deferral_rate"]
    assert rate["target"] == 0.5 and rate["mean"] == pytest.approx(n_strong / len(PROMPTS))
    assert state["confidence"] == pytest.approx(0.9) and state["alarm"] is None
    key = (("channel", "deferral_rate"), ("model", str(router_folder)))
    found = gauges(text)
    assert found["hf_defer_monitor_target", key] == 0.5 and found["hf_defer_monitor_alarm", key] == 0.0
