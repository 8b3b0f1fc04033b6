"""`hf_defer.review.client` against a server whose answers are valid JSON of the wrong shape (a proxy, another
service on the port, an incompatible version): each is a `ReviewServerError` naming the server and what was being
done, never a traceback from inside the SDK, nor a wrong number (a `task_ids` string read as a list of its letters).
The answers are the recorded ones (tests/review/fixtures/), one of them replaced."""

from __future__ import annotations

import httpx
import pytest

import hf_defer.review as review
from record_review_fixtures import CLASSES, EXPERTS, INPUTS, OUTPUTS
from review_replay import ReplayTransport

URL = "http://127.0.0.1:8080"


@pytest.fixture(autouse=True)
def token(monkeypatch):
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", "recorded-token-0123456789")


class Replaced(httpx.BaseTransport):
    """The recorded answers, except those to `method` on a path containing `path`, replaced by `payload`."""

    def __init__(self, inner: ReplayTransport, method: str, path: str, payload) -> None:
        self.inner, self.method, self.path, self.payload = inner, method, path, payload

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == self.method and self.path in request.url.path:
            return httpx.Response(response.status_code, json=self.payload, request=request)
        return response


def _task(**changes):
    return {"tasks": [{"id": 1, "data": {"hf_defer_key": "id:t1"}, "annotations": [
        {"id": 1, "completed_by": 1, "result": [{"from_name": "label", "value": {"choices": ["neither"]}}]}],
        **changes}], "total": 1}


@pytest.mark.parametrize("step, method, path, payload, words", [
    ("connect", "POST", "/api/projects/", ["not", "a", "project"], "opening project 'recorded reviews'"),
    ("connect", "POST", "/api/projects/", {"id": "one", "title": "x"}, "the created project with an integer id"),
    ("connect", "GET", "/api/projects/1/", {"id": 1, "title": ["x"]}, "a project with an integer id, a title"),
    ("push", "GET", "/api/tasks/", {"tasks": [{"id": 1, "data": ["x"]}], "total": 1}, "listing the project's tasks"),
    ("push", "POST", "/import", {"task_ids": "12"}, "'task_ids' a list of integer task ids, got '12'"),
    ("push", "POST", "/import", [1, 2], "importing tasks"),
    ("pull", "GET", "/api/tasks/", _task(annotations=["x"]), "reading the annotated tasks"),
    ("pull", "GET", "/api/tasks/", _task(annotations=[{"id": 1, "completed_by": 1, "result": "neither"}]),
     "an annotation's 'result' a list of objects"),
    ("pull", "GET", "/api/tasks/", _task(annotations=[{"id": 1, "completed_by": 1,
                                                        "result": [{"from_name": "label", "value": "neither"}]}]),
     "an annotation's 'result' a list of objects with a 'value' object"),
    ("pull", "GET", "/api/users/", [{"id": "a", "email": 3}], "users with an integer id"),
    ("pull", "GET", "/api/users/", {"users": 1}, "reading the users"),
])
def test_valid_json_of_the_wrong_shape_is_a_named_server_error(step, method, path, payload, words):
    recorded = {"connect": [], "push": ["push_first"], "pull": ["pull_first"]}[step]
    inner = ReplayTransport("connect_create", *recorded)
    replaced = Replaced(inner, method, path, payload)
    with pytest.raises(review.ReviewServerError) as refused:
        if step == "connect":
            review.connect(URL, "recorded reviews", CLASSES, httpx_client=httpx.Client(transport=replaced))
        else:
            project = review.connect(URL, "recorded reviews", CLASSES, httpx_client=httpx.Client(transport=inner))
            inner_calls = len(inner.requests)
            project.client._client_wrapper.httpx_client.httpx_client._transport = replaced
            assert len(inner.requests) == inner_calls
            if step == "push":
                review.push(project, INPUTS, OUTPUTS, expert_names=EXPERTS, ids=["t1", "t2", "t3"])
            else:
                review.pull(project)
    message = str(refused.value)
    assert message.startswith(f"the server at {URL} answered ") and words in message, message
    assert "is http://127.0.0.1:8080 a Label Studio server" in message
