"""`hf-defer serve`: its flags (the app it builds, its one-line errors), calibrating the threshold at start-up, and
(slow) the command itself in a subprocess, called with the openai client."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from fake_upstream import UpstreamBehaviour, answer_text, fake_upstream_app, serve_in_thread
from hf_defer.commands.cli import main as hf_defer_main
from hf_defer.commands.serve import build_app
from tiny_router import PROMPTS, margins_by_forward

URLS = ["--model", "weak=http://127.0.0.1:9/v1", "--model", "strong=http://127.0.0.1:9/v1"]


def test_the_router_app_gets_the_flags(router_folder):
    app, options = build_app(["--router", str(router_folder), *URLS, "--upstream_model", "strong=gpt-4o",
                              "--price", "strong=5,weak=0.2", "--max_strong_rate", "0.3", "--port", "8123"])
    up = app.state.upstreams
    assert (up["strong"].model_id, up["strong"].price, up["weak"].price) == ("gpt-4o", 5.0, 0.2)
    assert app.state.router.max_strong_rate == 0.3 and options.port == 8123 and options.host == "127.0.0.1"
    routed_only, _ = build_app(["--router", str(router_folder), *URLS, "--routed_only"])
    assert [m["id"] for m in TestClient(routed_only).get("/v1/models").json()["data"]] == ["hf-defer-router"]


@pytest.mark.parametrize("flags, words", [
    (["--model", "weak=http://127.0.0.1:9/v1"], r"give the URL of every model the router routes to .*missing \['strong'\]"),
    (URLS + ["--model", "medium=http://127.0.0.1:9/v1"], r"--model names \['medium'\], which the router does not"),
    (URLS + ["--price", "strong=cheap"], "--price strong='cheap': expected a number"),
    (["--model", "weak=ftp://x", "--model", "strong=http://127.0.0.1:9/v1"], "expected an http"),
    (URLS + ["--api_key_env", "strong=HF_DEFER_NO_SUCH_VARIABLE"], "that environment variable is not set"),
    (URLS + ["--confidence", "0.9"], "--confidence needs --calibration_file"),
    (URLS + ["--encoder", "x"], "--encoder 'x' is for a head-only router"),
    (URLS + ["--model", "weak"], "--model takes NAME=VALUE"),
])
def test_router_flag_mistakes_are_named(router_folder, flags, words):
    with pytest.raises(ValueError, match=words):
        build_app(["--router", str(router_folder), *flags])


def test_decision_flag_mistakes_are_named(router_folder, capsys):
    with pytest.raises(ValueError, match="give --router FOLDER"):
        build_app([])
    with pytest.raises(ValueError, match="route-only model .*serve it with `hf-defer serve --router`"):
        build_app(["--model", str(router_folder)])
    with pytest.raises(ValueError, match="--max_strong_rate is for a routing endpoint"):
        build_app(["--model", str(router_folder), "--max_strong_rate", "0.2"])
    with pytest.raises(ValueError, match="--routed_only is for a routing endpoint"):
        build_app(["--model", str(router_folder), "--routed_only"])
    assert hf_defer_main(["serve", "--model", str(router_folder), "--review_url", "http://127.0.0.1:9"]) == 2
    assert "--review_url and --review_project go together" in capsys.readouterr().err


def test_calibrating_at_start_up_sends_the_top_margins_within_the_budget(router_folder, tmp_path):
    """The budget keeps the floor(r N) prompts of highest margin (among those with a positive margin): worked out here
    from the router's own forward pass."""
    (tmp_path / "held_out.txt").write_text("\n".join(PROMPTS) + "\n")
    rate = 0.25
    app, _ = build_app(["--router", str(router_folder), *URLS, "--max_strong_rate", str(rate),
                        "--calibration_file", str(tmp_path / "held_out.txt")])
    threshold = app.state.router.defer_threshold
    margins = margins_by_forward(router_folder, PROMPTS)
    kept = min(math.floor(rate * len(PROMPTS)), sum(m > 0 for m in margins))
    assert kept > 0 and threshold >= 0
    assert sorted(m > threshold for m in margins) == sorted([True] * kept + [False] * (len(PROMPTS) - kept))
    assert min(m for m in margins if m > threshold) == pytest.approx(sorted(margins)[-kept])
    with pytest.raises(ValueError, match="--calibration_file calibrates the threshold to --max_strong_rate"):
        build_app(["--router", str(router_folder), *URLS, "--calibration_file", str(tmp_path / "held_out.txt")])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_hf_defer_serve_runs_and_answers_the_openai_client(router_folder):
    """The command itself, with a client key from the environment: the openai client with the key is answered,
    without it refused, and /health answers without a key (what a load balancer probes)."""
    key = "sk-subprocess-0123456789abcdef"
    behaviours = {name: UpstreamBehaviour(name) for name in ("weak", "strong")}
    port = _free_port()
    with serve_in_thread(fake_upstream_app(behaviours["weak"])) as weak, \
            serve_in_thread(fake_upstream_app(behaviours["strong"])) as strong:
        process = subprocess.Popen(
            [sys.executable, "-m", "hf_defer", "serve", "--router", str(router_folder), "--model", f"weak={weak}/v1",
             "--model", f"strong={strong}/v1", "--port", str(port), "--auth_keys_env", "HF_DEFER_TEST_KEYS"],
            env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DEFER_TEST_KEYS": f"ci:{key}"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 600  # imports take minutes on a loaded machine
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        process.kill()  # communicate() would wait for a server that never exits
                        raise AssertionError(f"hf-defer serve did not start: {process.communicate()[0][-2000:]}")
                    time.sleep(0.5)
            chat = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=120)
            completion = chat.chat.completions.create(model="hf-defer-router",
                                                      messages=[{"role": "user", "content": PROMPTS[0]}])
            stranger = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-" + "0" * 27, max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                stranger.chat.completions.create(model="strong", messages=[{"role": "user", "content": PROMPTS[0]}])
        finally:
            process.terminate()
            process.wait(timeout=30)
    log = process.stdout.read()
    assert key not in log and "warning" not in log and "401" in log  # uvicorn's access log, with no key in it
    assert completion.choices[0].message.content == answer_text(completion.hf_defer["model"], PROMPTS[0])
    assert len(behaviours[completion.hf_defer["model"]].received) == 1


KEY = "sk-serve-test-0123456789abcdef"


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True),
                                            ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                            ("::", False), ("", False), ("10.0.0.7", False),
                                            ("no-such-host.invalid", False)])
def test_loopback_addresses_are_told_apart(host, loopback):
    from hf_defer.commands.serve import is_loopback

    assert is_loopback(host) is loopback


def test_an_open_server_beyond_loopback_is_refused_unless_asked_for(router_folder, monkeypatch, capsys):
    monkeypatch.setenv("HF_DEFER_TEST_KEYS", f"ci:{KEY}")
    for app_flags in (["--router", str(router_folder), *URLS], ["--model", str(router_folder)]):
        assert hf_defer_main(["serve", *app_flags, "--host", "0.0.0.0"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--host 0.0.0.0 serves beyond this machine" in err
        assert "--auth_keys_env VAR" in err and "--allow_unauthenticated" in err
    app, _ = build_app(["--router", str(router_folder), *URLS, "--host", "0.0.0.0", "--allow_unauthenticated"])
    warning = capsys.readouterr().err
    assert "warning: serving 0.0.0.0:8000 without client keys" in warning
    assert "call the upstream models with their API keys" in warning and "read /metrics" in warning
    assert not app.state.access.authenticated
    app, _ = build_app(["--router", str(router_folder), *URLS, "--host", "0.0.0.0", "--auth_keys_env",
                        "HF_DEFER_TEST_KEYS", "--max_requests_per_minute", "90", "--max_request_bytes", "5000"])
    policy = app.state.access
    assert [key.name for key in policy.client_keys] == ["ci"] and "warning" not in capsys.readouterr().err
    assert (policy.max_requests_per_minute, policy.max_request_bytes) == (90, 5000)
    assert KEY not in repr(policy)


@pytest.mark.parametrize("flags, words", [
    (["--auth_keys_env", "HF_DEFER_NO_SUCH_VARIABLE"], "--auth_keys_env HF_DEFER_NO_SUCH_VARIABLE: that environment "
                                                       "variable is not set"),
    (["--auth_keys_env", KEY + ",x"], "takes the NAME of an environment variable"),
    (["--auth_keys_env", "HF_DEFER_TEST_SHORT"], "key 1 has 5 characters"),
    (["--metrics_key_env", "HF_DEFER_NO_SUCH_VARIABLE"], "--metrics_key_env HF_DEFER_NO_SUCH_VARIABLE"),
    (["--port", "70000"], "argument --port: expected a port number from 1 to 65535, got '70000'"),
    (["--port", "http"], "argument --port: expected a port number from 1 to 65535, got 'http'"),
    (["--max_length", "0"], "argument --max_length: expected a positive integer, got '0'"),
    (["--max_requests_per_minute", "-1"], "argument --max_requests_per_minute: expected a positive number"),
    (["--max_request_bytes", "1e9"], "argument --max_request_bytes: expected a positive integer"),
])
def test_access_and_port_mistakes_are_one_line(router_folder, monkeypatch, capsys, flags, words):
    monkeypatch.setenv("HF_DEFER_TEST_SHORT", "short")
    assert hf_defer_main(["serve", "--router", str(router_folder), *URLS, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert "short" not in err.replace("HF_DEFER_TEST_SHORT", "") and KEY not in err.replace(KEY + ",x", "")


def test_max_length_is_capped_at_the_encoders_positions(router_folder, capsys):
    """The tiny router's encoder has 32 positions and its tokenizer no limit of its own: as `predict`, serve truncates
    to 32 tokens by default and when asked for more (a long prompt is routed, not refused)."""
    app, _ = build_app(["--router", str(router_folder), *URLS])
    assert app.state.router.max_length == 32 and "--max_length" not in capsys.readouterr().err
    long_prompt = " ".join(PROMPTS) * 3
    assert len(long_prompt.split()) > 100
    assert app.state.router.decide([long_prompt])[0]["expert"] in ("weak", "strong")  # routed, not an error
    app, _ = build_app(["--router", str(router_folder), *URLS, "--max_length", "512"])
    assert app.state.router.max_length == 32
    assert "--max_length 512 is more than the model takes; inputs are truncated to its 32 tokens" in \
        capsys.readouterr().err
    app, _ = build_app(["--router", str(router_folder), *URLS, "--max_length", "8"])
    assert app.state.router.max_length == 8
