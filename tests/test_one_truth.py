"""One truth (issue 41): every coverage, deferral rate, threshold and guarantee that hf_defer reports (the library's
`deferral_metrics`, `hf-defer train`'s metrics, `evaluate`, `calibrate`, `predict`, the pipeline, the model card) is
what the decisions on the same inputs give, with masked answers, availability, costs and a side feature.

The oracle is independent of `deferral_metrics`: the pipeline's own decisions (one dict per input) read against the
CSV's labels and answers, counted here by hand: a deferral to an expert whose answer cell is empty is unscored, the
errors are over the other rows. Every comparison is exact (`==`), not approximate.
"""

from __future__ import annotations

import json
import math
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis_profiles import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import pipeline

import hf_defer
from hf_defer.commands.cli import main as hf_defer_main
from hf_defer.hub.model_card import describe_guarantee
from tiny_bert import save_tiny_bert

WORDS = "good bad fine great awful okay movie plot cast film story ending".split()
CLASSES = ["negative", "neutral", "positive"]
EXPERTS = ["alice", "bob"]
CHANNELS = ["web", "phone"]
QUIET = ["--report_to", "none", "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0",
         "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_length", "12"]


def frame(rng: np.random.Generator, n: int, skip: float) -> pd.DataFrame:
    """``n`` rows: a short text, a class, a side feature, and two annotators who each left a share ``skip`` blank."""
    labels = rng.choice(CLASSES, size=n)
    out = {"text": [" ".join(rng.choice(WORDS, size=4)) for _ in range(n)], "label": labels,
           "channel": rng.choice(CHANNELS, size=n)}
    for name, accuracy in zip(EXPERTS, (0.8, 0.6)):
        answers = np.where(rng.random(n) < accuracy, labels, rng.choice(CLASSES, size=n)).astype(object)
        answers[rng.random(n) < skip] = None
        out[name] = answers
    return pd.DataFrame(out)


def inputs_of(table: pd.DataFrame) -> list[dict]:
    return [{"text": text, "channel": channel} for text, channel in zip(table["text"], table["channel"])]


def truth(outputs: list[dict], table: pd.DataFrame) -> dict[str, float]:
    """What the decisions give, counted by hand from the pipeline's outputs and the file's labels and answers."""
    n = len(table)
    defer = np.array([out["defer"] for out in outputs])
    expert = np.array([out["expert"] for out in outputs], dtype=object)
    labels = table["label"].to_numpy()
    answered = {name: table[name].notna().to_numpy() for name in EXPERTS}
    wrong, unscored = [], {name: 0 for name in EXPERTS}
    for i, out in enumerate(outputs):
        if not out["defer"]:
            wrong.append(out["class_label"] != labels[i])
        elif answered[out["expert"]][i]:
            wrong.append(table[out["expert"]].iloc[i] != labels[i])
        else:
            unscored[out["expert"]] += 1
    counts = pd.Series(labels).value_counts()
    result = {"coverage": 1 - defer.sum() / n,
              "classifier_error": sum(out["class_label"] != y for out, y in zip(outputs, labels)) / n,
              "majority_class_error": 1 - counts.max() / n,
              "system_error": sum(wrong) / len(wrong) if wrong else math.nan,
              **{f"deferral_rate_{name}": np.sum(defer & (expert == name)) / n for name in EXPERTS}}
    if not all(answered[name].all() for name in EXPERTS):
        result.update(unscored_deferrals=sum(unscored.values()), scored_rows=len(wrong),
                      **{f"unscored_deferrals_{name}": unscored[name] for name in EXPERTS})
    return result


def assert_reports(reported: dict, expected: dict, prefix: str = "") -> None:
    for key, value in expected.items():
        got = reported[prefix + key]
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got), key
        else:  # the same counts, divided alike: equal to the last bit (a float compared with a float, not rounded)
            assert got == pytest.approx(value, rel=1e-12, abs=1e-12), (key, got, value)


def decide(folder: Path, table: pd.DataFrame, **kwargs) -> list[dict]:
    pipe = pipeline("deferral", model=str(folder))
    return pipe(inputs_of(table), batch_size=4, truncation=True, **kwargs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict, Path]:
    """One `hf-defer train` run (masked answers, a side feature, a calibrated budget, a labelled test file)."""
    root = tmp_path_factory.mktemp("one_truth")
    save_tiny_bert(root / "encoder", WORDS)
    rng = np.random.default_rng(0)
    frame(rng, 48, 0.3).to_csv(root / "train.csv", index=False)
    frame(rng, 20, 0.4).to_csv(root / "dev.csv", index=False)
    frame(rng, 20, 0.4).to_csv(root / "test.csv", index=False)
    out = root / "model"
    assert hf_defer_main(["train", "--model_name_or_path", str(root / "encoder"), "--train_file",
                          str(root / "train.csv"), "--validation_file", str(root / "dev.csv"), "--test_file",
                          str(root / "test.csv"), "--text_column_names", "text", "--label_column_name", "label",
                          "--expert_column_names", "alice,bob", "--missing_expert", "mask",
                          "--side_feature_columns", "channel", "--side_feature_dim", "4", "--max_deferral_rate",
                          "0.3", "--num_train_epochs", "4", "--learning_rate", "3e-2", "--pooling", "mean",
                          "--output_dir", str(out), *QUIET]) == 0
    return root, json.loads((out / "all_results.json").read_text()), out


def test_train_reports_the_decisions_of_its_saved_pipeline(trained):
    root, results, out = trained
    dev, test = pd.read_csv(root / "dev.csv"), pd.read_csv(root / "test.csv")
    config = json.loads((out / "config.json").read_text())
    # calibrated_eval: the dev split at the calibrated threshold, what the saved pipeline does on dev
    on_dev = decide(out, dev)
    assert_reports(results, truth(on_dev, dev), "calibrated_eval_")
    assert sum(o["defer"] for o in on_dev) <= math.floor(0.3 * len(dev))  # the budget calibrated on these rows
    assert json.loads((out / "hf_defer_run.json").read_text())["defer_threshold"] == config["defer_threshold"]
    assert config["calibrated_expert_costs"] == [0.0, 0.0]
    # test: the saved pipeline on the test file, and the run's predictions.csv are the same decisions
    on_test = decide(out, test)
    assert_reports(results, truth(on_test, test), "test_")
    written = pd.read_csv(out / "predictions.csv")
    assert written["defer"].tolist() == [o["defer"] for o in on_test]
    assert [e if isinstance(e, str) else None for e in written["expert"]] == [o["expert"] for o in on_test]
    # every decision records the costs and threshold that made it
    assert {(tuple(o["expert_costs"]), o["defer_threshold"]) for o in on_test} == {
        ((0.0, 0.0), config["defer_threshold"])}
    # the card: the threshold of the config beside it, and the test metrics the run measured
    card = (out / "README.md").read_text()
    assert f"**Deferral threshold:** {config['defer_threshold']:.4g}" in card
    assert f"| {results['test_coverage']:.4f} |" in card.replace("|  ", "| ")
    # evaluate, on the same test file: the same numbers
    metrics = json.loads(_cli(["evaluate", "--model", str(out), "--input", str(root / "test.csv"),
                               "--expert_column_names", "alice,bob", "--missing_expert", "mask"]))
    assert_reports(metrics, truth(on_test, test))


def _cli(argv: list[str]) -> str:
    import contextlib
    import io

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = hf_defer_main(argv)
    assert status == 0, stderr.getvalue()
    return stdout.getvalue()


@settings(max_examples=examples(5), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), n_dev=st.integers(10, 24), skip=st.sampled_from([0.0, 0.3, 0.7]),
       budget=st.sampled_from([0.2, 0.3, 0.5]), costs=st.sampled_from([(0.0, 0.0), (0.0, 0.1), (0.05, 0.0)]),
       confidence=st.sampled_from([None, 0.8]))
def test_calibrate_evaluate_predict_pipeline_and_card_agree(trained, seed, n_dev, skip, budget, costs, confidence):
    _, _, model = trained
    rng = np.random.default_rng(seed)
    dev, test = frame(rng, n_dev, skip), frame(rng, 12, skip)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dev.to_csv(tmp / "dev.csv", index=False)
        test.to_csv(tmp / "test.csv", index=False)
        out = tmp / "calibrated"
        summary = json.loads(_cli(["calibrate", "--model", str(model), "--input", str(tmp / "dev.csv"),
                                   "--max_deferral_rate", str(budget), "--expert_costs", ",".join(map(str, costs)),
                                   "--output_dir", str(out)]
                                  + (["--confidence", str(confidence)] if confidence else [])))
        config = json.loads((out / "config.json").read_text())
        threshold = config["defer_threshold"]
        assert summary["defer_threshold"] == threshold and config["expert_costs"] == list(costs)
        assert config["calibrated_expert_costs"] == list(costs)
        assert summary["deferral_guarantee"] == config["deferral_guarantee"]
        # the budget holds on the calibration rows, for the decisions the pipeline makes there
        on_dev = decide(out, dev)
        if confidence is None:
            assert sum(o["defer"] for o in on_dev) <= math.floor(budget * n_dev)
        # evaluate on the calibration file and on new rows: the rates of the pipeline's decisions, exactly
        for table, name in ((dev, "dev.csv"), (test, "test.csv")):
            reported = json.loads(_cli(["evaluate", "--model", str(out), "--input", str(tmp / name),
                                        "--expert_column_names", "alice,bob", "--missing_expert", "mask"]))
            decisions = on_dev if table is dev else decide(out, test)
            assert_reports(reported, truth(decisions, table))
        # predict writes those decisions
        _cli(["predict", "--model", str(out), "--input", str(tmp / "test.csv"), "--output", str(tmp / "p.csv")])
        written = pd.read_csv(tmp / "p.csv")
        assert written["defer"].tolist() == [o["defer"] for o in decide(out, test)]
        # the card in the copy describes its config: threshold, costs, guarantee
        card = (out / "README.md").read_text()
        assert f"**Deferral threshold:** {threshold:.4g}" in card
        statement = describe_guarantee(config["deferral_guarantee"], threshold)
        assert (statement is not None) == (confidence is not None)
        if statement:
            assert statement.split("\n")[0] in card
        # a call with other costs than the threshold was calibrated at warns, and says what decided
        other = [c + 0.2 for c in costs]
        with pytest.warns(UserWarning, match="calibrat|guarantee"):
            moved = decide(out, test, expert_costs=other)
        assert {tuple(o["expert_costs"]) for o in moved} == {tuple(other)}


@settings(max_examples=examples(5), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), skip=st.sampled_from([0.0, 0.5, 1.0]), threshold=st.sampled_from([-0.3, 0.0, 0.2]),
       available=st.sampled_from(["all", "alice", "per input"]))
def test_the_library_metrics_are_the_pipeline_decisions_with_availability(trained, seed, skip, threshold, available):
    _, _, model = trained
    rng = np.random.default_rng(seed)
    table = frame(rng, 12, skip)
    pipe = pipeline("deferral", model=str(model))
    mask = {"all": np.ones((12, 2), dtype=bool), "alice": np.tile([True, False], (12, 1)),
            "per input": rng.random((12, 2)) < 0.5}[available]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a threshold the model was not calibrated at: warned, and wanted here
        outputs = pipe(inputs_of(table), batch_size=4, truncation=True, defer_threshold=threshold,
                       available_experts=mask)
    with torch.no_grad():  # the logits of each input, through the pipeline's own preprocessing
        logits = np.concatenate([pipe._forward(pipe.preprocess(item, truncation=True))["logits"].numpy()
                                 for item in inputs_of(table)])
    answers = np.array([[CLASSES.index(a) if isinstance(a, str) else -100 for a in table[name]] for name in EXPERTS]).T
    labels = np.array([CLASSES.index(y) for y in table["label"]])
    metrics = hf_defer.deferral_metrics(logits, labels, answers, pipe.model, defer_threshold=threshold,
                                        available=mask, expert_names=EXPERTS)
    assert_reports(metrics, truth(outputs, table))


def test_with_drop_the_budget_is_calibrated_on_the_rows_it_is_scored_on(trained, tmp_path):
    # Issue 41: with --missing_expert drop the run calibrated on every validation row and scored the complete ones
    # ("at most 20 %" beside a reported 26 %). Both now use the rows drop keeps.
    root, _, _ = trained
    out = tmp_path / "dropped"
    assert hf_defer_main(["train", "--model_name_or_path", str(root / "encoder"), "--train_file",
                          str(root / "train.csv"), "--validation_file", str(root / "dev.csv"), "--text_column_names",
                          "text", "--label_column_name", "label", "--expert_column_names", "alice,bob",
                          "--missing_expert", "drop", "--side_feature_columns", "channel", "--side_feature_dim", "4",
                          "--max_deferral_rate", "0.3", "--num_train_epochs", "2", "--learning_rate", "3e-2",
                          "--pooling", "mean", "--output_dir", str(out), *QUIET]) == 0
    results = json.loads((out / "all_results.json").read_text())
    dev = pd.read_csv(root / "dev.csv")
    complete = dev[dev[EXPERTS].notna().all(axis=1)].reset_index(drop=True)
    decisions = decide(out, complete)
    assert_reports(results, truth(decisions, complete), "calibrated_eval_")
    assert sum(o["defer"] for o in decisions) <= math.floor(0.3 * len(complete))


# ---------------------------------------------------------------------------------------------- serve --model
# The decision app takes one plain text per request: its model has no side feature, and saved expert costs (which
# every decision of the app and of the pipeline uses). Each posted input carries the experts available for it.

AVAILABILITY = {"all": lambda rng, n: np.ones((n, 2), dtype=bool),
                "bob only": lambda rng, n: np.tile([False, True], (n, 1)),
                "per input": lambda rng, n: rng.random((n, 2)) < 0.6}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A three-class text model (experts alice and bob, costs [0, 0.05], no side feature) with its threshold at the
    median margin of some random texts, so that it answers some inputs and defers others."""
    from transformers import BertTokenizer

    root = tmp_path_factory.mktemp("served")
    save_tiny_bert(root / "encoder", WORDS)
    torch.manual_seed(5)
    model = hf_defer.EncoderForDeferral.from_encoder_pretrained(
        str(root / "encoder"), num_labels=3, num_experts=2, id2label=dict(enumerate(CLASSES)), expert_names=EXPERTS,
        pooling="mean", expert_costs=[0.0, 0.05])
    with torch.no_grad():
        model.head[-1].weight.mul_(20)  # spread the margins
    model.save_pretrained(root / "model")
    BertTokenizer.from_pretrained(root / "encoder").save_pretrained(root / "model")
    texts = frame(np.random.default_rng(1), 40, 0.0)["text"].tolist()
    margins = [o["margin"] for o in pipeline("deferral", model=str(root / "model"))(texts, return_margin=True)]
    model.config.defer_threshold = float(np.median(margins))
    model.save_pretrained(root / "model", overwrite=True)
    return root / "model"


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), n=st.integers(4, 14), skip=st.sampled_from([0.0, 0.4]),
       available=st.sampled_from(sorted(AVAILABILITY)))
def test_serve_model_decides_as_the_pipeline_and_reports_its_rate(served, tmp_path, seed, n, skip, available):
    from fastapi.testclient import TestClient

    from hf_defer.serving import build_decision_app

    rng = np.random.default_rng(seed)
    table = frame(rng, n, skip).drop(columns="channel")
    mask = AVAILABILITY[available](rng, n)
    pipe = pipeline("deferral", model=str(served))
    with TestClient(build_decision_app(pipe)) as http:
        bodies = [{"input": text, "id": str(i)} for i, text in enumerate(table["text"])]
        if available != "all":  # "all": the field left out, the app's default
            for body, row in zip(bodies, mask):
                body["available_experts"] = [name for name, free in zip(EXPERTS, row) if free]
        answers = [http.post("/v1/decide", json=body) for body in bodies]
        monitor = http.get("/monitor").json()
    assert [r.status_code for r in answers] == [200] * n, [r.text for r in answers]
    answers = [r.json() for r in answers]
    # the pipeline, on the same texts with the same availability: the same decision for every input
    outputs = pipe(table["text"].tolist(), batch_size=4, truncation=True, available_experts=mask)
    assert [(a["status"], a["expert"] if a["deferred"] else a["answer"]) for a in answers] == [
        ("deferred", o["expert"]) if o["defer"] else ("answered", o["label"]) for o in outputs]
    assert all(mask[i, EXPERTS.index(a["expert"])] for i, a in enumerate(answers) if a["deferred"])
    # the rates counted from the app's decisions: what the pipeline gives, and what deferral_metrics reports
    deferred = sum(a["status"] == "deferred" for a in answers)
    per_expert = {name: sum(a["deferred"] and a["expert"] == name for a in answers) / n for name in EXPERTS}
    assert deferred / n == sum(o["defer"] for o in outputs) / n
    with torch.no_grad():
        logits = np.concatenate([pipe._forward(pipe.preprocess(text, truncation=True))["logits"].numpy()
                                 for text in table["text"]])
    expert_answers = np.array([[CLASSES.index(a) if isinstance(a, str) else -100 for a in table[name]]
                               for name in EXPERTS]).T
    labels = np.array([CLASSES.index(y) for y in table["label"]])
    metrics = hf_defer.deferral_metrics(logits, labels, expert_answers, pipe.model, available=mask)
    assert metrics["coverage"] == 1 - deferred / n
    assert {name: metrics[f"deferral_rate_{name}"] for name in EXPERTS} == per_expert
    assert_reports(metrics, truth(outputs, table))
    if available == "all":  # `hf-defer evaluate` has no availability flag: every expert may be deferred to
        table.to_csv(tmp_path / "eval.csv", index=False)
        reported = json.loads(_cli(["evaluate", "--model", str(served), "--input", str(tmp_path / "eval.csv"),
                                    "--expert_column_names", "alice,bob", "--missing_expert", "mask"]))
        assert reported["coverage"] == 1 - deferred / n
        assert {name: reported[f"deferral_rate_{name}"] for name in EXPERTS} == per_expert
    # the monitor the app keeps: the deferral rate it observed is the decisions'
    channel = monitor["channels"]["deferral_rate"]
    assert monitor["rows"] == n and channel["n"] == n
    assert channel["mean"] == pytest.approx(deferred / n, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------------------------------------- serve --router
# The router app on the serving tests' tiny route-only model (experts weak, the default, and strong), with two fake
# OpenAI-compatible upstreams on 127.0.0.1. With a cap, the reference is the cap's rule worked out here on the
# pipeline's own decisions, in the order the prompts were posted: of the first n routed, at most floor(r n) leave weak.


@pytest.fixture(scope="module")
def router_and_upstreams(tmp_path_factory):
    from fake_upstream import UpstreamBehaviour, fake_upstream_app, serve_in_thread
    from tiny_router import save_tiny_router

    folder = save_tiny_router(tmp_path_factory.mktemp("router"))
    with serve_in_thread(fake_upstream_app(UpstreamBehaviour("weak"))) as weak, \
            serve_in_thread(fake_upstream_app(UpstreamBehaviour("strong"))) as strong:
        yield folder, {"weak": weak + "/v1", "strong": strong + "/v1"}


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), n=st.integers(3, 16), cap=st.sampled_from([None, 0.0, 0.25, 0.5, 1.0]))
def test_serve_router_routes_as_the_pipeline_and_reports_its_strong_rate(router_and_upstreams, tmp_path, seed, n,
                                                                         cap):
    from fastapi.testclient import TestClient

    from fake_upstream import answer_text
    from hf_defer.serving import PromptRouter, build_router_app
    from hf_defer.serving.routing import load_router_pipeline
    from hf_defer.serving.upstream import parse_upstreams
    from tiny_router import WORDS as ROUTER_WORDS

    folder, urls = router_and_upstreams
    rng = np.random.default_rng(seed)
    prompts = [" ".join(rng.choice(ROUTER_WORDS, size=rng.integers(1, 6))) for _ in range(n)]
    pipe = load_router_pipeline(str(folder))
    router = PromptRouter(pipe, max_strong_rate=cap)
    app = build_router_app(router, parse_upstreams(router.expert_names, urls))
    with TestClient(app) as http:  # one prompt after another: the order the cap counts in
        answers = [http.post("/v1/chat/completions", json={"model": "hf-defer-router", "messages": [
            {"role": "user", "content": prompt}]}) for prompt in prompts]
    assert [r.status_code for r in answers] == [200] * n, [r.text for r in answers]
    # the route-only pipeline on the same prompts: the model each prompt was routed to
    wanted = [o["expert"] for o in pipe(prompts, batch_size=4, truncation=True)]
    summaries = [r.json()["hf_defer"] for r in answers]
    assert [s["routed_to"] for s in summaries] == wanted
    assert [r.headers["x-hf-defer-routed-to"] for r in answers] == wanted
    # the cap's rule, worked out on those decisions
    sent, capped, strong = [], [], 0
    for i, pick in enumerate(wanted, start=1):
        over = pick != "weak" and cap is not None and strong + 1 > math.floor(cap * i + 1e-9)
        strong += pick != "weak" and not over
        sent.append("weak" if over else pick)
        capped.append(over)
    assert [s["model"] for s in summaries] == [r.headers["x-hf-defer-model"] for r in answers] == sent
    assert [s["capped"] for s in summaries] == capped
    assert [r.headers["x-hf-defer-capped"] for r in answers] == ["true" if c else "false" for c in capped]
    assert [r.json()["choices"][0]["message"]["content"] for r in answers] == [
        answer_text(model, prompt) for model, prompt in zip(sent, prompts)]
    if cap is not None:
        assert sum(model == "strong" for model in sent) <= math.floor(cap * n + 1e-9)
    # the share the router picked strong for (before any cap): what evaluate and deferral_metrics report
    strong_share = sum(s["routed_to"] == "strong" for s in summaries) / n
    correct = rng.random((n, 2)) < 0.7
    pd.DataFrame({"text": prompts, "weak": correct[:, 0].astype(int), "strong": correct[:, 1].astype(int)}).to_csv(
        tmp_path / "routed.csv", index=False)
    reported = json.loads(_cli(["evaluate", "--model", str(folder), "--input", str(tmp_path / "routed.csv"),
                                "--expert_correct_columns", "weak,strong"]))
    assert reported["deferral_rate_strong"] == strong_share and reported["coverage"] == 1 - strong_share
    with torch.no_grad():
        logits = np.concatenate([pipe._forward(pipe.preprocess(p, truncation=True))["logits"].numpy() for p in prompts])
    metrics = hf_defer.deferral_metrics(logits, None, None, pipe.model, expert_correct=correct.astype(float))
    assert metrics["deferral_rate_strong"] == strong_share and metrics["coverage"] == 1 - strong_share
