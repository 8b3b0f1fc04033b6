"""The review loop against a live Label Studio server (`make test-review`): push, push again, a push cut off and
resumed, reviewers' answers pulled back with their identities, a class the model does not have, a deleted task, a wrong
token, a project for other classes, the `hf-defer review` command, and the round trip on PostgreSQL."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import pandas as pd
import pytest
import torch
from transformers import BertConfig, BertTokenizer

import hf_defer
import hf_defer.review as review
from hf_defer.commands.review import main as review_main
from hf_defer.review.server import LabelStudioServer, free_port

pytestmark = pytest.mark.review
CLASSES = ["hate_speech", "offensive_language", "neither"]
EXPERTS = ["rev_a", "rev_b"]


def outputs_for(n, defer_every=1):
    return [{"defer": i % defer_every == 0, "expert": EXPERTS[i % 2] if i % defer_every == 0 else None,
             "class_label": CLASSES[i % 3], "class_score": 0.5, "scores": {name: 0.5 if name == CLASSES[i % 3] else 0.25
                                                                           for name in CLASSES},
             "expert_accuracy": [0.8, 0.9]} for i in range(n)]


def choice(name):
    return [{"from_name": "label", "to_name": "text", "type": "choices", "value": {"choices": [name]}}]


def reviewers(project, *names):
    """Reviewer accounts (members of the organisation) by name -> user id."""
    ids = {}
    for name in names:
        email = f"{name}-{secrets.token_hex(2)}@example.com"
        ids[name] = (project.client.users.create(email=email, username=email), email)
    return {name: (user.id, email) for name, (user, email) in ids.items()}


def server_keys(project):
    keys = [task.data.get("hf_defer_key") for task in project.client.tasks.list(project=project.project_id)]
    return keys


def test_push_creates_one_task_per_deferred_input_and_pushing_again_creates_none(label_studio, project_title):
    project = review.connect(label_studio.url, project_title, CLASSES)
    texts = [f"tweet number {i}" for i in range(7)]
    first = review.push(project, texts, outputs_for(7, defer_every=2), expert_names=EXPERTS)
    assert (first.deferred, len(first.created), first.already_there) == (4, 4, 0)
    again = review.push(project, texts, outputs_for(7, defer_every=2), expert_names=EXPERTS)
    assert (len(again.created), again.already_there) == (0, 4)
    keys = server_keys(project)
    assert sorted(keys) == sorted(review.task_key(texts[i]) for i in (0, 2, 4, 6))
    (task,) = [t for t in project.client.tasks.list(project=project.project_id, fields="all")
               if t.data["hf_defer_key"] == review.task_key(texts[2])]
    assert task.data["hf_defer_expert"] == "rev_a" and task.predictions[0].result[0]["value"] == {"choices": ["neither"]}


class CutOff(httpx.HTTPTransport):
    """A real connection that drops after `allowed` import requests."""

    def __init__(self, allowed):
        super().__init__()
        self.allowed = allowed

    def handle_request(self, request):
        if request.url.path.endswith("/import"):
            if self.allowed == 0:
                raise httpx.ConnectError("the network went away", request=request)
            self.allowed -= 1
        return super().handle_request(request)


def test_a_push_cut_off_half_way_is_finished_by_the_same_push_without_duplicates(label_studio, project_title):
    texts = [f"resumable {i}" for i in range(9)]
    cut = review.connect(label_studio.url, project_title, CLASSES, httpx_client=httpx.Client(transport=CutOff(2)))
    with pytest.raises(review.ReviewServerError, match=r"stopped after creating 4 of 9 new task\(s\)"):
        review.push(cut, texts, outputs_for(9), expert_names=EXPERTS, ids=range(9), batch_size=2)
    project = review.connect(label_studio.url, project_title, CLASSES)
    assert len(server_keys(project)) == 4
    resumed = review.push(project, texts, outputs_for(9), expert_names=EXPERTS, ids=range(9), batch_size=2)
    assert (len(resumed.created), resumed.already_there) == (5, 4)
    assert sorted(server_keys(project)) == sorted(f"id:{i}" for i in range(9))


def test_answers_come_back_with_each_reviewers_identity_incrementally(label_studio, project_title, caplog):
    project = review.connect(label_studio.url, project_title, CLASSES)
    texts = ["first", "second", "third"]
    review.push(project, texts, outputs_for(3), expert_names=EXPERTS, ids=["a", "b", "c"])
    people = reviewers(project, "ann", "bob")
    tasks = project.task_keys()
    (ann, ann_email), (bob, bob_email) = people["ann"], people["bob"]
    project.client.annotations.create(id=tasks["id:a"], result=choice("neither"), completed_by=ann)
    project.client.annotations.create(id=tasks["id:a"], result=choice("hate_speech"), completed_by=bob)
    project.client.annotations.create(id=tasks["id:b"], result=choice("spam"), completed_by=bob)
    with caplog.at_level(logging.WARNING, logger="hf_defer.review"):
        first = review.pull(project)
    assert sorted(first.table[["item", "annotator", "answer"]].values.tolist()) == sorted(
        [["id:a", ann_email, "neither"], ["id:a", bob_email, "hate_speech"]])
    assert "'spam', a class the model does not have" in caplog.text and f"by {bob_email}" in caplog.text

    project.client.annotations.create(id=tasks["id:c"], result=choice("offensive_language"), completed_by=ann)
    second = review.pull(project, known=first.table)
    assert second.table[["item", "annotator", "answer"]].values.tolist() == [["id:c", ann_email, "offensive_language"]]
    columns = review.reviews_to_columns(pd.concat([first.table, second.table]))
    by_item = columns.set_index("item")
    assert by_item.loc["id:a", ann_email] == "neither" and by_item.loc["id:a", bob_email] == "hate_speech"
    assert by_item.loc["id:c", ann_email] == "offensive_language" and by_item.loc["id:c", bob_email] is None


def test_a_task_deleted_between_push_and_pull_loses_nothing_already_pulled(label_studio, project_title, tmp_path):
    project = review.connect(label_studio.url, project_title, CLASSES)
    review.push(project, ["keep", "delete"], outputs_for(2), expert_names=EXPERTS, ids=["keep", "delete"])
    (ann, _), = reviewers(project, "ann").values()
    tasks = project.task_keys()
    for key in tasks:
        project.client.annotations.create(id=tasks[key], result=choice("neither"), completed_by=ann)
    path = tmp_path / "answers.csv"
    assert len(review.pull_to_csv(project, path).table) == 2
    project.client.tasks.delete(id=tasks["id:delete"])
    after = review.pull_to_csv(project, path)
    assert len(after.table) == 0 and [gone["item"] for gone in after.gone] == ["id:delete"]
    assert sorted(review.read_answers(path)["item"]) == ["id:delete", "id:keep"]


def test_a_wrong_token_and_a_project_for_other_classes_are_refused(label_studio, project_title, monkeypatch):
    review.connect(label_studio.url, project_title, ["yes", "no"])
    with pytest.raises(ValueError, match=r"lacks \['hate_speech', 'offensive_language', 'neither'\] and has \['yes', "
                                         r"'no'\]"):
        review.connect(label_studio.url, project_title, CLASSES)
    wrong = secrets.token_hex(20)
    monkeypatch.setenv("LABEL_STUDIO_API_KEY", wrong)
    with pytest.raises(review.ReviewServerError, match="refused the API token") as info:
        review.connect(label_studio.url, project_title, CLASSES)
    assert wrong not in str(info.value)


def tiny_model(folder: Path) -> Path:
    """A saved deferral model over a tiny random BERT that defers everything (threshold -2 < any margin)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "some", "tweet", "one", "two", "three"]
    torch.manual_seed(0)
    encoder = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=20)
    config = hf_defer.DeferralConfig(encoder=encoder, num_labels=3, id2label=dict(enumerate(CLASSES)),
                                     expert_names=EXPERTS, num_experts=2, expert_costs=[0.1, 0.3], defer_threshold=-2.0)
    hf_defer.save_for_hub(hf_defer.EncoderForDeferral(config), folder,
                          processing_class=BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}))
    return folder


def test_the_command_pushes_a_file_and_pulls_answers_and_reviewer_columns(label_studio, project_title, tmp_path, capsys):
    model = tiny_model(tmp_path / "model")
    pd.DataFrame({"id": [1, 2, 3], "text": ["some tweet", "tweet one", "two three"]}).to_csv(tmp_path / "in.csv",
                                                                                            index=False)
    server = ["--url", label_studio.url, "--project", project_title]
    assert review_main(["push", *server, "--model", str(model), "--input", str(tmp_path / "in.csv"),
                        "--id_column_name", "id"]) == 0
    assert "3 inputs, 3 deferred: 3 tasks created" in capsys.readouterr().out
    assert review_main(["push", *server, "--model", str(model), "--input", str(tmp_path / "in.csv"),
                        "--id_column_name", "id"]) == 0
    assert "0 tasks created, 3 already in the project" in capsys.readouterr().out
    project = review.connect(label_studio.url, project_title, CLASSES)
    (ann, email), = reviewers(project, "ann").values()
    project.client.annotations.create(id=project.task_keys()["id:2"], result=choice("hate_speech"), completed_by=ann)
    answers, columns = tmp_path / "answers.csv", tmp_path / "reviewers.csv"
    assert review_main(["pull", *server, "--output", str(answers), "--columns_output", str(columns),
                        "--model", str(model)]) == 0
    assert "1 new answer(s)" in capsys.readouterr().out
    assert pd.read_csv(columns).to_dict("records") == [{"item": "id:2", "text": "tweet one", email: "hate_speech"}]
    assert os.environ["LABEL_STUDIO_API_KEY"] not in answers.read_text() + columns.read_text()


def _postgres_binaries():
    for folder in ("/usr/lib/postgresql/15/bin", "/usr/local/bin", "/usr/bin"):
        if all(Path(folder, name).exists() for name in ("initdb", "pg_ctl")):
            return Path(folder)
    return None


@pytest.mark.skipif(_postgres_binaries() is None, reason="PostgreSQL (initdb, pg_ctl) is not installed")
def test_the_round_trip_on_postgresql(project_title):
    """A throw-away PostgreSQL cluster on 127.0.0.1 (run as the `postgres` user when root, which initdb refuses); the
    tasks are then read from PostgreSQL itself, so the server cannot have fallen back to SQLite."""
    binaries, port = _postgres_binaries(), free_port()
    cluster = Path(tempfile.mkdtemp(prefix="hf_defer_pg_"))
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(cluster, "postgres")

    def run(*args):
        return subprocess.run([*as_user, *map(str, args)], check=True, capture_output=True, text=True, timeout=120)

    run(binaries / "initdb", "-D", cluster / "data", "-U", "postgres", "--auth=trust")
    run(binaries / "pg_ctl", "-D", cluster / "data", "-l", cluster / "log", "-w", "-t", "60", "-o",
        f"-p {port} -k {cluster} -c listen_addresses=127.0.0.1", "start")
    try:
        run(binaries / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "labelstudio")
        settings = {"name": "labelstudio", "user": "postgres", "host": "127.0.0.1", "port": port}
        with LabelStudioServer(postgres=settings, venv=Path(__file__).resolve().parents[2] / ".venv-label-studio") as server:
            project = review.connect(server.url, project_title, CLASSES)
            review.push(project, ["on postgres"], outputs_for(1), expert_names=EXPERTS, ids=["pg"])
            (ann, email), = reviewers(project, "ann").values()
            project.client.annotations.create(id=project.task_keys()["id:pg"], result=choice("neither"), completed_by=ann)
            assert review.pull(project).table[["item", "annotator", "answer"]].values.tolist() == [
                ["id:pg", email, "neither"]]
            stored = run(binaries / "psql", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-d", "labelstudio", "-tAc",
                         "select data->>'hf_defer_key' from task").stdout.split()
            assert stored == ["id:pg"]
    finally:
        run(binaries / "pg_ctl", "-D", cluster / "data", "-m", "fast", "-w", "-t", "60", "stop")
        shutil.rmtree(cluster, ignore_errors=True)
