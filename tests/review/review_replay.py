"""Recorded Label Studio responses: a transport that records what a live server answers (used by
`record_review_fixtures.py`), and one that answers the same requests from the recording (the default suite, offline).

A recording is a list of exchanges `{"method", "path", "query", "body", "status", "response"}`; the replaying transport
answers each request with the first unused exchange of the same method, path and query, and keeps every request it got
(with its JSON body) in `requests`, so a test can check what was sent."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qsl

import httpx

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _query(url: httpx.URL) -> dict[str, str]:
    return dict(parse_qsl(url.query.decode()))


def _body(request: httpx.Request):
    content = request.content
    if not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return None


class RecordingTransport(httpx.BaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.exchanges: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        response.read()
        try:
            payload = json.loads(response.content) if response.content else None
        except ValueError:
            payload = response.content.decode(errors="replace")
        self.exchanges.append({"method": request.method, "path": request.url.path, "query": _query(request.url),
                               "body": _body(request), "status": response.status_code, "response": payload})
        return httpx.Response(response.status_code, headers={"content-type": "application/json"},
                              content=response.content, request=request)

    def save(self, name: str) -> None:
        (FIXTURES / f"{name}.json").write_text(json.dumps(self.exchanges, indent=1, ensure_ascii=False) + "\n")
        self.exchanges = []


class ReplayTransport(httpx.BaseTransport):
    def __init__(self, *names: str) -> None:
        self.exchanges = [exchange for name in names
                          for exchange in json.loads((FIXTURES / f"{name}.json").read_text())]
        self.used = [False] * len(self.exchanges)
        self.requests: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        query = _query(request.url)
        self.requests.append({"method": request.method, "path": request.url.path, "query": query,
                              "body": _body(request), "headers": dict(request.headers)})
        for index, exchange in enumerate(self.exchanges):
            if not self.used[index] and (exchange["method"], exchange["path"], exchange["query"]) == (
                    request.method, request.url.path, query):
                self.used[index] = True
                return httpx.Response(exchange["status"], json=exchange["response"], request=request)
        raise AssertionError(f"no recorded response left for {request.method} {request.url}")


def replay_client(*names: str) -> tuple[httpx.Client, ReplayTransport]:
    transport = ReplayTransport(*names)
    return httpx.Client(transport=transport), transport
