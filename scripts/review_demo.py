"""`make review-demo`: a few rounds of the review loop on HateSpeech against a local Label Studio server.

Each round: train a deferral head (A-SM, three reviewers as experts with different prices) on what is labelled so far;
measure it on a fixed test split (deferral rate, mean cost per input, system error); run it on a batch of new tweets and
push the ones it defers to Label Studio; the reviewer each input was routed to answers it (and with some probability a
second one), through the API; pull the answers back, turn them into one column per reviewer (missing where they did
not review) and add them to the training set, the missing answers masked in the loss.

Simulated reviewers (hf_defer.review.simulated): on each tweet, reviewer r answers with the r-th of the tweet's real
CrowdFlower votes in a seeded random order, so each answer is one a CrowdFlower annotator gave; the shipped data does
not say who the annotators were, so a reviewer is not the same person from tweet to tweet. The training label of a
reviewed tweet is the CrowdFlower majority, which a real team would not have (see aggregate_labels for that case).

Usage: python scripts/review_demo.py [--rounds 3] [--url URL (else a server is started)] [--output-dir results]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import torch
from transformers import PrinterCallback, pipeline

import hf_defer
import hf_defer.review as review
from hf_defer.data import HATESPEECH_LABELS, load_hatespeech
from hf_defer.evaluation.costs import mean_cost
from research.table2_hatespeech import DEFAULT_ENCODER, Protocol, training_arguments
from hf_defer.experts.embeddings import add_embeddings
from hf_defer.review.server import LABEL_STUDIO_VERSION, LabelStudioServer
from hf_defer.review.simulated import ensure_reviewers, reviewer_votes, submit_answers

CLASSES = list(HATESPEECH_LABELS)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed-rows", type=int, default=2000, help="tweets labelled by all reviewers at the start")
    parser.add_argument("--batch-rows", type=int, default=1000, help="new tweets the model sees each round")
    parser.add_argument("--test-rows", type=int, default=2000)
    parser.add_argument("--reviewers", default="rev_1,rev_2,rev_3")
    parser.add_argument("--costs", default="0.02,0.05,0.1", help="price of each reviewer's answer")
    parser.add_argument("--overlap", type=float, default=0.3, help="chance that a second reviewer also answers")
    parser.add_argument("--epochs", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", default=None, help="an existing server (its token in $LABEL_STUDIO_API_KEY)")
    parser.add_argument("--output-dir", default="results")
    return parser.parse_args(argv)


def load(options, num_reviewers):
    """Seed, pool and test tweets with MiniLM embeddings and each simulated reviewer's answer (class ids)."""
    splits = load_hatespeech(seed=options.seed)
    train, pool_size = splits["train"], options.rounds * options.batch_rows
    parts = {"seed": train.select(range(options.seed_rows)),
             "pool": train.select(range(options.seed_rows, options.seed_rows + pool_size)),
             "test": splits["test"].select(range(options.test_rows))}
    data = {}
    rng = np.random.default_rng(options.seed)
    for name, part in parts.items():
        part = add_embeddings(part, DEFAULT_ENCODER, text_column="text", column="features")
        counts = np.stack([np.asarray(part[label]) for label in CLASSES], axis=1)
        data[name] = {"text": list(part["text"]), "labels": np.asarray(part["labels"]),
                      "features": np.asarray(part["features"], dtype=np.float32),
                      "votes": reviewer_votes(counts, num_reviewers, rng)}
    return data


def train(features, labels, expert_labels, names, costs, options):
    config = hf_defer.DeferralConfig(feature_size=features.shape[1], num_labels=len(CLASSES), num_experts=len(names),
                                     id2label=dict(enumerate(CLASSES)), expert_names=names, expert_costs=costs,
                                     expert_kinds=["person"] * len(names))
    torch.manual_seed(options.seed)
    model = hf_defer.EncoderForDeferral(config)
    rows = {"features": features, "labels": labels, "expert_labels": expert_labels}
    dataset = datasets.Dataset.from_dict({key: value.tolist() for key, value in rows.items()}).with_format("numpy")
    with tempfile.TemporaryDirectory() as scratch:
        trainer = hf_defer.DeferralTrainer(model=model, train_dataset=dataset,
                                           args=training_arguments(scratch, options.seed, Protocol(epochs=options.epochs)))
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return model.eval()


def evaluate(model, test, costs):
    """Deferral rate, mean cost per input and system error on the test tweets (a deferred tweet gets the answer of the
    reviewer it is routed to)."""
    with torch.no_grad():
        logits = model(features=torch.as_tensor(test["features"])).logits
    defer, prediction, expert = (t.numpy() for t in model.surrogate.decide(logits, expert_costs=costs))
    answer = np.where(defer, test["votes"][np.arange(len(defer)), expert], prediction)
    return {"deferral_rate": float(defer.mean()), "mean_cost": mean_cost(defer, expert, costs),
            "system_error": float((answer != test["labels"]).mean()),
            "classifier_error": float((prediction != test["labels"]).mean())}


def review_batch(project, model, batch, offset, names, users, options, rng):
    """Push the batch's deferred tweets, have the routed reviewer (and maybe one more) answer them through the API."""
    classifier = pipeline("deferral", model=model)
    ids = [f"pool-{offset + row}" for row in range(len(batch["text"]))]
    outputs = classifier(batch["features"], batch_size=256)
    report = review.push(project, batch["text"], outputs, expert_names=names, expert_costs=model.config.expert_costs,
                         ids=ids, model_version=f"round-{offset}")
    keys = project.task_keys()
    answers = []
    for row, output in enumerate(outputs):
        if not output["defer"]:
            continue
        who = [names.index(output["expert"])]
        if rng.random() < options.overlap:
            who.append(rng.choice([r for r in range(len(names)) if r != who[0]]))
        answers += [(keys[f"id:{ids[row]}"], users[names[r]], CLASSES[batch["votes"][row, r]]) for r in who]
    submit_answers(project, answers)
    return report, len(answers)


def training_rows(data, wide, names):
    """The seed tweets (every reviewer answered) and the reviewed pool tweets (-100 where a reviewer did not)."""
    features, labels, experts = [data["seed"]["features"]], [data["seed"]["labels"]], [data["seed"]["votes"]]
    if len(wide):
        rows = np.array([int(item.rsplit("-", 1)[1]) for item in wide["item"]])
        answers = np.full((len(rows), len(names)), -100, dtype=np.int64)
        for r, name in enumerate(names):
            column = f"{name}@example.com"
            if column in wide:
                answers[:, r] = [CLASSES.index(v) if isinstance(v, str) else -100 for v in wide[column]]
        features.append(data["pool"]["features"][rows])
        labels.append(data["pool"]["labels"][rows])
        experts.append(answers)
    return np.concatenate(features), np.concatenate(labels), np.concatenate(experts)


def render(history, options, settings, output_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(history)
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for axis, key, title in zip(axes, ("deferral_rate", "mean_cost", "system_error"),
                                ("deferral rate", "mean cost per input", "system error")):
        axis.plot(frame["round"], frame[key], marker="o")
        axis.set_title(title)
        axis.set_ylim(0, 1.15 * float(frame[key].max()) or 1.0)
        axis.set_xlabel("round (0 = before any review)")
        axis.set_xticks(frame["round"])
    figure.tight_layout()
    figure.savefig(output_dir / "review_loop.png", dpi=120)
    columns = ["round", "train_rows", "deferral_rate", "mean_cost", "system_error", "classifier_error",
               "tasks_pushed", "answers_pulled"]
    table = "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(f"{row[c]:.4f}" if isinstance(row[c], float) else str(row[c]) for c in columns) + " |"
        for row in history])
    text = f"""# The review loop on HateSpeech (`make review-demo`)

{options.rounds} rounds against a local Label Studio {LABEL_STUDIO_VERSION} server: each round the deferral model
(A-SM head over frozen MiniLM embeddings, three simulated reviewers as experts priced {settings['costs']}) is measured
on {options.test_rows} test tweets, then sees {options.batch_rows} new tweets; the ones it defers are pushed as tasks,
the reviewer each was routed to answers it through the API (a second reviewer too with probability {options.overlap}),
`pull` reads the answers back with each reviewer's identity, `reviews_to_columns` makes one column per reviewer
(missing where they did not review) and the model is retrained with those missing answers masked.

{table}

![per-round deferral rate, cost and system error](review_loop.png)

- Round 0 is the model trained on the {options.seed_rows} seed tweets that every reviewer answered; round r is the model
  retrained after r rounds of review. Mean cost is per test input (0 when the model answers).
- **What a simulated reviewer is.** On each tweet, reviewer r answers with the r-th of the tweet's real CrowdFlower
  votes in a seeded random order. The shipped data has vote counts, not annotator identities, so "rev_1" is a
  different CrowdFlower worker on each tweet: the reviewers are equally skilled in expectation, differ only in price,
  and the model learns whom to route to from prices and estimated accuracy, not from individual skill.
- The training label of a reviewed tweet is its CrowdFlower majority, which a real review team would not have.
- One standard error of an error rate on {options.test_rows} test tweets is about {settings['standard_error']:.4f}: a
  change in system error smaller than twice that between rounds is noise.
- Settings: {json.dumps(settings)}. Wall time {settings['seconds']:.0f} s on {os.cpu_count()} CPU core(s) (the embeddings,
  and the server's start, included).
"""
    (output_dir / "review_loop.md").write_text(text)
    (output_dir / "review_loop.json").write_text(json.dumps({"settings": settings, "rounds": history}, indent=2) + "\n")
    return table


def main(argv=None) -> int:
    options = parse(argv)
    start = time.time()
    names, costs = options.reviewers.split(","), [float(c) for c in options.costs.split(",")]
    torch.set_num_threads(1)
    print(f"Loading HateSpeech and embedding {options.seed_rows + options.rounds * options.batch_rows + options.test_rows}"
          " tweets (cached after the first run)")
    data = load(options, len(names))
    server = None
    if options.url is None:
        os.environ["LABEL_STUDIO_API_KEY"] = secrets.token_hex(20)  # this process (and the server) only
        print("Starting a local Label Studio server (its own venv; about a minute, more on the first run)")
        server = LabelStudioServer().start()
    try:
        url = options.url or server.url
        project = review.connect(url, f"HateSpeech review loop {secrets.token_hex(2)}", CLASSES)
        users = ensure_reviewers(project, names)
        history, known, rng = [], review.pull(project).table, np.random.default_rng(options.seed)
        for round_ in range(options.rounds + 1):
            wide = review.reviews_to_columns(known) if len(known) else pd.DataFrame({"item": []})
            features, labels, experts = training_rows(data, wide, names)
            model = train(features, labels, experts, names, costs, options)
            row = {"round": round_, "train_rows": len(labels), **evaluate(model, data["test"], costs),
                   "tasks_pushed": 0, "answers_pulled": 0}
            if round_ < options.rounds:
                offset = round_ * options.batch_rows
                batch = {key: value[offset:offset + options.batch_rows] for key, value in data["pool"].items()}
                report, submitted = review_batch(project, model, batch, offset, names, users, options, rng)
                pulled = review.pull(project, known=known)
                known = pd.concat([known, pulled.table], ignore_index=True)
                row.update(tasks_pushed=len(report.created), answers_pulled=len(pulled.table))
                assert len(pulled.table) == submitted, (len(pulled.table), submitted)
            history.append(row)
            print({key: round(value, 4) if isinstance(value, float) else value for key, value in row.items()})
    finally:
        if server is not None:
            server.stop()
    settings = {"rounds": options.rounds, "seed_rows": options.seed_rows, "batch_rows": options.batch_rows,
                "test_rows": options.test_rows, "reviewers": names, "costs": costs, "overlap": options.overlap,
                "epochs": options.epochs, "seed": options.seed, "seconds": time.time() - start}
    worst = max(row["system_error"] for row in history)
    settings["standard_error"] = float(np.sqrt(worst * (1 - worst) / options.test_rows))
    output_dir = Path(options.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    print(render(history, options, settings, output_dir))
    print(f"Wrote {output_dir / 'review_loop.md'} and review_loop.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
