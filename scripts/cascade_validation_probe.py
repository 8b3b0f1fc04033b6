"""Probe, on validation tweets only, of learned cascades that might beat the confidence cascade on HateSpeech.

Written after `results/hatespeech_cascade.md` showed the confidence cascade ahead (so after its test areas were seen);
this probe never touches the test tweets. Per seed (the report's splits, annotator draws and prices), the validation
tweets are cut in two halves; each method's settings are chosen on one half (its Pareto front) and its area under the
error-cost staircase (log cost, 1 to 100; then split at 11, the cheap and the costly price, into the budgets where at
most the two models are paid and those above) is measured on the other, both ways, and averaged. Variants:

- `confidence cascade`: the report's baseline.
- `A-SM stage 1 / costly max`: the report's learned cascade with stage 2 replaced by a threshold on the costly model's
  max probability (what the confidence cascade does there): isolates stage 1.
- `route-only stage 1 on the cheap probabilities / costly max`: stage 1 is a route-only model over (cheap, costly,
  person) that reads only the cheap model's probabilities and their summaries (`escalation_features` with no input
  features), trained for `--stage1-epochs` on the cheap model's cross-fitted correctness.
- `... / stacked answer`: the same stage 1; after the costly model answers, the answer is a logistic regression on the
  log-probabilities of both models (the cheap model's cross-fitted on training tweets), and the person is paid below a
  threshold on its max probability.
- `... / A-SM stage 2`: the same stage 1; after the costly model answers, an A-SM head with the classes and the person
  as expert, on `escalation_features` of both models' probabilities (with, or without, both models' log-probabilities
  too): its classifier stacks the two models; it pays the person by the cost rule (a_person - d > max p + t) or by the
  confidence rule (max p < threshold). The last row, without log-probabilities and with the confidence rule, runs the
  report's own code for the cheap-first cascade (`research.hatespeech_cascade._cheap_first_estimates`,
  `DeferralCascade(..., first_expert=...)` with `stage2_min_confidence`): it was added to the report as the best of
  these on validation (with the stacked answer, within 0.01 point) that `DeferralCascade` can run.

    python scripts/cascade_validation_probe.py   # about a minute on 2 cores; writes results/hatespeech_cascade_probe.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np
import torch

from hf_defer.evaluation.costs import area_under_error_cost
from research.routing_baselines import confidence_cascade_curve
from research import hatespeech_cascade as cx
from hf_defer.cascade import escalation_features

ROOT = Path(__file__).resolve().parent.parent
PRICES = (1.0, 10.0, 100.0)


def split_area(curve_of, grid: np.ndarray, val: np.ndarray, base: list[float], seed: int) -> np.ndarray:
    """Settings chosen on one half of `val`, areas measured on the other, both ways, averaged ([`mean_area`])."""
    order = np.random.default_rng(100 + seed).permutation(len(val))
    halves = val[order[: len(val) // 2]], val[order[len(val) // 2 :]]
    return mean_area(cx._select_on_validation(curve_of, grid, choose, measure, base)  # the report's choice
                     for choose, measure in (halves, halves[::-1]))


def mean_area(curves) -> np.ndarray:
    """Mean over `curves` of the areas from the cheap price to the person's, up to cheap + costly, and above it."""
    ranges = ((PRICES[0], PRICES[2]), (PRICES[0], PRICES[0] + PRICES[1]), (PRICES[0] + PRICES[1], PRICES[2]))
    return np.mean([[area_under_error_cost(np.log(curve.cost), curve.error, np.log(low), np.log(high))
                     for low, high in ranges] for curve in curves], axis=0)


def probe(features, costly, labels, persons, seeds, stage1_epochs: int) -> dict[str, list[float]]:
    n, k = len(labels), costly.shape[1]
    costly_answer = costly.argmax(1)
    steps = np.concatenate([-np.geomspace(1e-2, 1.0, 12)[::-1], [0.0], np.geomspace(1e-3, 1.0, 24)])
    pairs = np.array([(a, b) for a in steps for b in steps])
    log = lambda p: np.log(np.clip(p, 1e-6, 1.0)).astype(np.float32)  # noqa: E731
    out: dict[str, list[float]] = {}
    for seed in seeds:
        person = persons[seed]
        order = np.random.default_rng(seed).permutation(n)
        n_test, n_val = round(0.2 * n), round(0.1 * n)
        val, train = order[n_test : n_test + n_val], order[n_test + n_val :]  # the test rows are never read
        cheap = cx._fit_linear(features[train], labels[train], k, seed)(features)
        crossfit = cheap.copy()  # the cheap model's answers on training rows, out of sample
        inner = cx.fold_of_rows(len(train), 5, seed)
        for fold in range(5):
            fit = cx._fit_linear(features[train[inner != fold]], labels[train[inner != fold]], k, seed)
            crossfit[train[inner == fold]] = fit(features[train[inner == fold]])
        conf = np.stack([cheap.max(1), costly.max(1)], 1)
        answers = np.stack([cheap.argmax(1), costly_answer, person], 1)
        grid = np.array([(a, b) for a in cx._levels(conf[:, 0]) for b in cx._levels(conf[:, 1])])
        variants = {"confidence cascade": split_area(
            lambda rows, g: confidence_cascade_curve(conf[rows], answers[rows], labels[rows], list(PRICES), g),
            grid, val, [0.0, 0.0], seed)}

        def learned(top, accuracy, gain, wrong) -> np.ndarray:
            return split_area(lambda rows, g: cx._learned_cascade_curve(top[rows], accuracy[rows], gain[rows],
                                                                         wrong[rows], PRICES, g),
                              cx._escalation_grid(pairs, gain), val, [1.0, 1.0, 2.0], seed)

        experts = np.stack([costly_answer, person], 1)
        probs, accuracy = cx._fit_deferral(features[train], labels[train], experts[train], "asm", seed, 30)(features)
        wrong = np.stack([probs.argmax(1) != labels, costly_answer != labels, person != labels], 1)
        variants["A-SM stage 1 / costly max"] = learned(probs.max(1), accuracy, -costly.max(1).astype(float), wrong)
        summaries = escalation_features(np.zeros((n, 0), np.float32), crossfit)  # p, max, entropy, log-odds
        correct = np.stack([crossfit.argmax(1) == labels, costly_answer == labels, person == labels], 1)
        route = cx._fit_route_only(summaries[train], correct[train].astype(np.float32), ["cheap", "costly", "person"],
                                   seed, stage1_epochs)
        estimate = route(escalation_features(np.zeros((n, 0), np.float32), cheap))
        wrong = np.stack([cheap.argmax(1) != labels, costly_answer != labels, person != labels], 1)
        name = "route-only stage 1 on the cheap probabilities"
        variants[f"{name} / costly max"] = learned(estimate[:, 0], estimate[:, 1:], -costly.max(1).astype(float),
                                                   wrong)
        stack_train = np.concatenate([log(costly), log(crossfit)], 1)
        stacked = cx._fit_linear(stack_train[train], labels[train], k, seed)(np.concatenate([log(costly), log(cheap)],
                                                                                            1))
        wrong = np.stack([cheap.argmax(1) != labels, stacked.argmax(1) != labels, person != labels], 1)
        variants[f"{name} / stacked answer"] = learned(estimate[:, 0], estimate[:, 1:], -stacked.max(1).astype(float),
                                                       wrong)
        for extra, suffix in ((lambda c: np.zeros((n, 0), np.float32), ""), (log, " with log-probabilities")):
            z = np.concatenate([extra(crossfit), extra(costly), escalation_features(summaries, costly)], 1)
            stage2 = cx._fit_deferral(z[train], labels[train], person[train, None], "asm", seed, 30)
            p2, a2 = stage2(np.concatenate([extra(cheap), extra(costly), escalation_features(
                escalation_features(np.zeros((n, 0), np.float32), cheap), costly)], 1))
            wrong = np.stack([cheap.argmax(1) != labels, p2.argmax(1) != labels, person != labels], 1)
            variants[f"{name} / A-SM stage 2{suffix}, cost rule"] = learned(estimate[:, 0], estimate[:, 1:],
                                                                             a2[:, 0] - p2.max(1), wrong)
            if suffix:
                variants[f"{name} / A-SM stage 2{suffix}, confidence rule"] = learned(
                    estimate[:, 0], estimate[:, 1:], -p2.max(1), wrong)
        variants[f"{name} / A-SM stage 2, confidence rule (the cheap-first cascade)"] = learned(  # the report's code
            *cx._cheap_first_estimates(cheap, crossfit, costly, labels, person, correct.astype(np.float32), train, seed,
                                       30))
        for method, value in variants.items():
            out.setdefault(method, []).append(value)
        print(f"seed {seed}: " + ", ".join(f"{m} {100 * v[0]:.2f}" for m, v in variants.items()), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predictions", type=Path, default=ROOT / "results" / "hatespeech_costly_predictions.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--stage1-epochs", type=int, default=5)
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "hatespeech_cascade_probe.md")
    args = parser.parse_args(argv)
    from hf_defer.data.hatespeech import HATESPEECH_LABELS
    from hf_defer.experts.embeddings import add_embeddings
    from hf_defer.experts.simulated import annotator_expert

    torch.set_num_threads(1)
    payload = json.loads(args.predictions.read_text())
    data = cx.cascade_data().select(range(payload["settings"]["rows"]))
    features = np.asarray(add_embeddings(cx.cascade_data())["features"][: len(data)], dtype=np.float32)
    labels = np.asarray(data["labels"], dtype=np.int64)
    persons = {s: np.asarray(annotator_expert(data, list(HATESPEECH_LABELS), seed=s)["expert_labels"], dtype=np.int64)
               for s in args.seeds}
    out = probe(features, np.asarray(payload["probs"], dtype=np.float32), labels, persons, args.seeds,
                args.stage1_epochs)
    reference = np.asarray(out["confidence cascade"])[:, 0]
    cut = f"{PRICES[0] + PRICES[1]:g}"
    rows = ["| Method | area (%), validation halves | per seed | lower than the confidence cascade in | budgets up to "
            f"{cut} | above {cut} |", "|---|---|---|---|---|---|"]
    for method, values in out.items():
        values = np.asarray(values)
        per_seed = " ".join(f"{100 * v:.2f}" for v in values[:, 0])
        below = int((values[:, 0] < reference).sum())
        rows.append(f"| {method} | {100 * values[:, 0].mean():.2f} | {per_seed} | {below} of {len(values)} seeds | "
                    f"{100 * values[:, 1].mean():.2f} | {100 * values[:, 2].mean():.2f} |")
    text = "\n".join([
        "# HateSpeech cascade: a validation-only probe of learned cascades",
        "",
        f"Generated by `scripts/cascade_validation_probe.py` on {datetime.date.today().isoformat()} (seeds "
        f"{args.seeds}, stage-1 epochs {args.stage1_epochs}). Test tweets are never read.",
        "",
        __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0],
        "",
        *rows,
        ""])
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
