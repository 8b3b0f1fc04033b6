"""Record the Label Studio responses that the default suite replays (tests/review/fixtures/*.json).

Run by hand against a live server (it starts one; a few minutes):
    HF_HUB_OFFLINE=1 .venv/bin/python tests/review/record_review_fixtures.py

The scenario, which tests/review/test_recorded.py checks against by hand-derived values:
- connect_create: a new project "recorded reviews" for the HateSpeech classes.
- push_first: inputs t1, t2 deferred (to rev_a and rev_b), t3 not deferred.
- (setup) reviewers rev_a@example.com and rev_b@example.com; on t1 rev_a answers offensive_language and rev_b neither;
  on t2 rev_a skips the task and rev_b answers "spam" (a class the model does not have).
- pull_first: the first pull.
- (setup) rev_a changes the answer on t1 to hate_speech.
- pull_revised: a pull that knows pull_first's table.
- push_again: t1, t2, t3 again and t4 (deferred): only t4 is created.
- (setup) task t1 is deleted on the server.
- pull_after_delete: a pull that knows both tables.
- wrong_token, mismatch (a project for the classes a and b), no_project (create=False).
"""

from __future__ import annotations

import json
import os
import secrets
import sys

import httpx
import pandas as pd

import hf_defer.review as review
from hf_defer.review.server import LabelStudioServer
from review_replay import FIXTURES, RecordingTransport

CLASSES = ["hate_speech", "offensive_language", "neither"]
EXPERTS = ["rev_a", "rev_b"]


def output(defer: bool, expert: str | None, label: str, score: float) -> dict:
    rest = (1 - score) / 2
    return {"defer": defer, "expert": expert, "class_label": label, "class_score": score,
            "scores": {name: (score if name == label else rest) for name in CLASSES}, "expert_accuracy": [0.9, 0.8]}


INPUTS = ["first deferred tweet", "second deferred tweet", "a tweet the model answers"]
OUTPUTS = [output(True, "rev_a", "offensive_language", 0.5), output(True, "rev_b", "neither", 0.6),
           output(False, None, "neither", 0.9)]


def choice(name: str) -> list[dict]:
    return [{"from_name": "label", "to_name": "text", "type": "choices", "value": {"choices": [name]}}]


def main() -> int:
    os.environ["LABEL_STUDIO_API_KEY"] = secrets.token_hex(20)
    recorder = RecordingTransport()
    http = httpx.Client(transport=recorder, timeout=60)
    with LabelStudioServer() as server:
        project = review.connect(server.url, "recorded reviews", CLASSES, httpx_client=http)
        recorder.save("connect_create")
        review.push(project, INPUTS, OUTPUTS, expert_names=EXPERTS, ids=["t1", "t2", "t3"], expert_costs=[0.1, 0.2])
        recorder.save("push_first")
        admin = project.client
        users = {name: admin.users.create(email=f"{name}@example.com", username=name).id for name in EXPERTS}
        keys = project.task_keys()
        recorder.exchanges = []
        t1, t2 = keys["id:t1"], keys["id:t2"]
        first_a = admin.annotations.create(id=t1, result=choice("offensive_language"), completed_by=users["rev_a"],
                                           lead_time=4.0)
        admin.annotations.create(id=t1, result=choice("neither"), completed_by=users["rev_b"], lead_time=7.5)
        admin.annotations.create(id=t2, result=[], was_cancelled=True, completed_by=users["rev_a"])
        admin.annotations.create(id=t2, result=choice("spam"), completed_by=users["rev_b"])
        recorder.exchanges = []
        first = review.pull(project)
        recorder.save("pull_first")
        admin.annotations.update(id=first_a.id, result=choice("hate_speech"))
        recorder.exchanges = []
        revised = review.pull(project, known=first.table)
        recorder.save("pull_revised")
        review.push(project, INPUTS + ["a fourth tweet"], OUTPUTS + [output(True, "rev_a", "hate_speech", 0.4)],
                    expert_names=EXPERTS, ids=["t1", "t2", "t3", "t4"], expert_costs=[0.1, 0.2])
        recorder.save("push_again")
        admin.tasks.delete(id=t1)
        recorder.exchanges = []
        review.pull(project, known=pd.concat([first.table, revised.table], ignore_index=True))
        recorder.save("pull_after_delete")
        token = os.environ["LABEL_STUDIO_API_KEY"]
        os.environ["LABEL_STUDIO_API_KEY"] = "0" * 40
        try:
            review.connect(server.url, "recorded reviews", CLASSES, httpx_client=http)
        except review.ReviewServerError as error:
            print("wrong token:", error)
        recorder.save("wrong_token")
        os.environ["LABEL_STUDIO_API_KEY"] = token
        admin.projects.create(title="other classes", label_config=review.label_config(["a", "b"]))
        recorder.exchanges = []
        try:
            review.connect(server.url, "other classes", CLASSES, httpx_client=http)
        except ValueError as error:
            print("mismatch:", error)
        recorder.save("mismatch")
        try:
            review.connect(server.url, "no such project", CLASSES, httpx_client=http, create=False)
        except review.ReviewServerError as error:
            print("no project:", error)
        recorder.save("no_project")
    leaked = [path.name for path in FIXTURES.glob("*.json") if token in path.read_text()]
    assert not leaked, f"the token leaked into {leaked}"
    sizes = {path.name: path.stat().st_size for path in sorted(FIXTURES.glob("*.json"))}
    print(json.dumps(sizes, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
