"""connect / push / pull through label-studio-sdk against responses recorded from a live Label Studio 1.23 server
(tests/review/fixtures/, written by record_review_fixtures.py, whose docstring tells the scenario). The expected values
come from that scenario: what was pushed and what each reviewer answered."""

from __future__ import annotations

import logging

import httpx
import pandas as pd
import pytest

import hf_defer.review as review
from hf_defer.review.server import free_port
from record_review_fixtures import CLASSES, EXPERTS, INPUTS, OUTPUTS
from review_replay import replay_client

TOKEN = "recorded-token-0123456789"


@pytest.fixture(autouse=True)
def token(monkeypatch):
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", TOKEN)


def connected(*names):
    http, transport = replay_client("connect_create", *names)
    project = review.connect("http://127.0.0.1:8080/", "recorded reviews", dict(enumerate(CLASSES)), httpx_client=http)
    return project, transport


def test_connect_creates_the_project_for_the_model_classes_with_the_token_from_the_environment():
    project, transport = connected()
    assert (project.project_id, project.title, project.classes, project.url) == (
        1, "recorded reviews", CLASSES, "http://127.0.0.1:8080")
    created = [r for r in transport.requests if r["method"] == "POST" and r["path"] == "/api/projects/"]
    assert created[0]["body"]["title"] == "recorded reviews"
    assert created[0]["body"]["label_config"] == review.label_config(CLASSES)
    assert {r["headers"]["authorization"] for r in transport.requests} == {f"Token {TOKEN}"}


def test_push_sends_only_the_deferred_inputs_with_their_suggestion_and_a_repeat_only_what_is_new():
    project, transport = connected("push_first", "push_again")
    report = review.push(project, INPUTS, OUTPUTS, expert_names=EXPERTS, ids=["t1", "t2", "t3"], expert_costs=[0.1, 0.2])
    assert (report.inputs, report.deferred, report.created, report.already_there) == (3, 2, [1, 2], 0)
    (sent,) = [r["body"] for r in transport.requests if r["method"] == "POST" and r["path"].endswith("/import")]
    assert [task["data"]["hf_defer_key"] for task in sent] == ["id:t1", "id:t2"]
    assert [(t["data"]["hf_defer_expert"], t["data"]["hf_defer_cost"]) for t in sent] == [("rev_a", 0.1), ("rev_b", 0.2)]
    assert [t["predictions"][0]["result"][0]["value"]["choices"] for t in sent] == [["offensive_language"], ["neither"]]
    assert [t["predictions"][0]["score"] for t in sent] == [0.5, 0.6]

    again = review.push(project, INPUTS + ["a fourth tweet"], OUTPUTS + [dict(OUTPUTS[0], class_label="hate_speech")],
                        expert_names=EXPERTS, ids=["t1", "t2", "t3", "t4"], expert_costs=[0.1, 0.2])
    assert (again.deferred, again.already_there, len(again.created)) == (3, 2, 1)
    sent = [r["body"] for r in transport.requests if r["method"] == "POST" and r["path"].endswith("/import")][-1]
    assert [task["data"]["hf_defer_key"] for task in sent] == ["id:t4"]


class Unreachable(httpx.BaseTransport):
    """Passes requests on to a replay until `fail_at` import requests have been answered, then refuses to connect."""

    def __init__(self, inner, fail_at):
        self.inner, self.fail_at, self.imports = inner, fail_at, 0

    def handle_request(self, request):
        if request.url.path.endswith("/import"):
            self.imports += 1
            if self.imports > self.fail_at:
                raise httpx.ConnectError("connection refused", request=request)
        return self.inner.handle_request(request)


def test_a_push_cut_off_says_what_was_created_and_that_running_it_again_finishes_it():
    http, transport = replay_client("connect_create", "push_first")
    project = review.connect("http://127.0.0.1:8080", "recorded reviews", CLASSES,
                             httpx_client=httpx.Client(transport=Unreachable(transport, fail_at=0)))
    with pytest.raises(review.ReviewServerError, match=r"cannot reach .* stopped after creating 0 of 2 new task\(s\); "
                                                        "run the same push again"):
        review.push(project, INPUTS, OUTPUTS, expert_names=EXPERTS, ids=["t1", "t2", "t3"])


def test_pull_returns_each_answer_with_its_reviewer_and_skips_what_is_not_an_answer(caplog):
    project, _ = connected("pull_first")
    with caplog.at_level(logging.INFO, logger="hf_defer.review"):
        result = review.pull(project)
    table = result.table
    assert list(table.columns) == ["item", "annotator", "answer", "time", "text", "task_id", "annotation_id", "lead_time"]
    assert table[["item", "annotator", "answer", "task_id", "annotation_id"]].values.tolist() == [
        ["id:t1", "rev_a@example.com", "offensive_language", 1, 1], ["id:t1", "rev_b@example.com", "neither", 1, 2]]
    assert table["text"].tolist() == [INPUTS[0]] * 2 and table["lead_time"].tolist() == [4.0, 7.5]
    assert table["time"].is_monotonic_increasing
    reasons = {skip["annotation_id"]: skip["reason"] for skip in result.skipped}
    assert set(reasons) == {3, 4} and "cancelled" in reasons[3]
    assert "'spam', a class the model does not have" in reasons[4]
    assert "annotation 4 of task 2 (item 'id:t2') by rev_b@example.com" in caplog.text


def test_a_second_pull_returns_only_the_changed_answer_and_the_columns_keep_the_latest():
    project, _ = connected("pull_first", "pull_revised")
    first = review.pull(project).table
    revised = review.pull(project, known=first).table
    assert revised[["item", "annotator", "answer", "annotation_id"]].values.tolist() == [
        ["id:t1", "rev_a@example.com", "hate_speech", 1]]
    assert revised["time"][0] > first["time"][0]
    columns = review.reviews_to_columns(pd.concat([first, revised], ignore_index=True))
    assert columns.to_dict("records") == [{"item": "id:t1", "text": INPUTS[0], "rev_a@example.com": "hate_speech",
                                           "rev_b@example.com": "neither"}]


def test_answers_of_a_task_deleted_on_the_server_are_named_and_kept(caplog):
    project, _ = connected("pull_first", "pull_revised", "push_again", "pull_after_delete")
    first = review.pull(project).table
    known = pd.concat([first, review.pull(project, known=first).table], ignore_index=True)
    review.push(project, INPUTS + ["a fourth tweet"], OUTPUTS + [OUTPUTS[0]], expert_names=EXPERTS,
                ids=["t1", "t2", "t3", "t4"])
    with caplog.at_level(logging.WARNING, logger="hf_defer.review"):
        after = review.pull(project, known=known)
    assert len(after.table) == 0
    assert sorted((gone["annotator"], gone["annotation_id"], gone["task_id"]) for gone in after.gone) == [
        ("rev_a@example.com", 1, 1), ("rev_b@example.com", 2, 1)]
    assert "2 answer(s) pulled before are no longer on the server (task(s) ['1'] deleted" in caplog.text


def test_pull_to_csv_appends_only_new_answers_and_keeps_the_old_ones(tmp_path):
    project, _ = connected("pull_first", "pull_revised")
    path = tmp_path / "answers.csv"
    assert len(review.pull_to_csv(project, path).table) == 2
    assert len(review.pull_to_csv(project, path).table) == 1
    kept = review.read_answers(path)
    assert kept["answer"].tolist() == ["offensive_language", "neither", "hate_speech"]
    assert kept["annotation_id"].tolist() == [1, 2, 1] and sorted(p.name for p in tmp_path.iterdir()) == ["answers.csv"]


def test_a_wrong_token_is_refused_naming_the_variable_never_the_token():
    http, _ = replay_client("wrong_token")
    with pytest.raises(review.ReviewServerError, match=r"refused the API token in \$LABEL_STUDIO_API_KEY .*HTTP 401") as info:
        review.connect("http://127.0.0.1:8080", "recorded reviews", CLASSES, httpx_client=http)
    assert TOKEN not in str(info.value)


def test_a_project_made_for_other_classes_and_a_missing_project_are_refused():
    http, _ = replay_client("mismatch")
    with pytest.raises(ValueError, match=r"project 'other classes' \(id 2\)'s labelling configuration does not match "
                                         r"the model's classes .* has \['a', 'b'\]"):
        review.connect("http://127.0.0.1:8080", "other classes", CLASSES, httpx_client=http)
    http, _ = replay_client("no_project")
    with pytest.raises(review.ReviewServerError, match="has no project 'no such project'"):
        review.connect("http://127.0.0.1:8080", "no such project", CLASSES, httpx_client=http, create=False)


def test_an_unreachable_server_and_an_unset_token_are_clear_errors(monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(review.ReviewServerError, match=f"cannot reach the Label Studio server at {url}"):
        review.connect(url, "p", CLASSES, timeout=5)
    monkeypatch.delenv("LABEL_STUDIO_API_KEY")
    with pytest.raises(ValueError, match=r"\$LABEL_STUDIO_API_KEY .* is not set"):
        review.connect(url, "p", CLASSES)
    with pytest.raises(ValueError, match="`url` must be the server's http"):
        review.connect("localhost:8080", "p", CLASSES)


def test_the_command_says_what_is_wrong_in_one_line_and_exits_2(monkeypatch, capsys):
    from hf_defer.commands.review import main

    monkeypatch.delenv("LABEL_STUDIO_API_KEY")
    assert main(["pull", "--url", "http://127.0.0.1:9", "--project", "p"]) == 2
    assert "$LABEL_STUDIO_API_KEY (`token_env`) holding the Label Studio API token is not set" in capsys.readouterr().err
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", TOKEN)
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["pull", "--url", url, "--project", "p", "--output", "unused.csv"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("hf-defer review pull: error: cannot reach the Label Studio server") and TOKEN not in error


def test_pull_refuses_to_replace_a_reviewer_columns_file_without_overwrite(tmp_path, capsys):
    # The README invites users to add their labels to reviewers.csv; a second pull rebuilt it from answers.csv and
    # the labels were gone. Refused before the server is asked; with --overwrite the pull goes on (to an unreachable
    # server here).
    from hf_defer.commands.review import main

    columns = tmp_path / "reviewers.csv"
    columns.write_text("item,text,ann@example.com,label\nid:2,tweet one,hate_speech,hate_speech\n")
    url = f"http://127.0.0.1:{free_port()}"
    pull = ["pull", "--url", url, "--project", "p", "--output", str(tmp_path / "answers.csv"),
            "--columns_output", str(columns)]
    assert main(pull) == 2
    error = capsys.readouterr().err
    assert f"--columns_output {str(columns)!r} exists" in error and "pass --overwrite" in error
    assert columns.read_text().endswith("hate_speech,hate_speech\n") and not (tmp_path / "answers.csv").exists()
    assert main([*pull, "--overwrite"]) == 2
    assert "cannot reach the Label Studio server" in capsys.readouterr().err
