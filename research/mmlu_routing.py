"""MMLU routing on RouteLLM's data: GPT-4 or Mixtral per question, cross-fitted routers judged by RouteLLM's measures.

`hf_defer.data.load_routellm_mmlu` gives, for 14,037 MMLU questions, whether GPT-4-1106 (strong, costly) and
Mixtral-8x7B (weak, cheap) answered correctly. Every router here is **cross-fitted**: the questions are cut into 5
folds stratified by subject ([`subject_folds`]) and each fold is scored by a router fitted on the other four
([`cross_fit`]), so no question is ever scored by a router that saw it. The routers:

- the random router and the oracle (RouteLLM's definitions, `hf_defer.evaluation.routellm_metrics`);
- a subject-only router: the per-subject gain `P(strong right) - P(weak right)` on the training folds;
- RouteLLM-style classifier routers on MiniLM embeddings of the question: logistic regression predicting that the
  weak model is wrong, and one predicting "strong wins" (strong right, weak wrong) against tie / loss, as RouteLLM's
  BERT router predicts the preferred model;
- estimate routers, with one accuracy estimate per model and the route-only rule `argmax_j (a_j - c_j)` as the price
  of a GPT-4 call is swept: two correctness classifiers (on MiniLM, and on MiniLM + the subject), and the route-only
  deferral model ([`fit_route_only_deferral`], **the plug-in point**: `compare(route_only=...)`, the script's
  `--route-only`; without it its row is marked pending).

[`compare`] runs them all and returns the record that scripts/mmlu_routing.py writes to results/mmlu_routing.json and
renders with [`report_markdown`] into results/mmlu_routing.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hf_defer.evaluation.reliability import expected_calibration_error
from hf_defer.evaluation.routellm_metrics import (apgr, call_performance_curve, cost_swept_curve, cpt, oracle_curve,
                                                 random_router_curve, routing_summary)
from .hatespeech_cascade import _fit_linear

__all__ = ["ROUTERS", "RouteOnlyFit", "compare", "cross_fit", "fit_correctness_classifiers", "fit_route_only_deferral",
           "mmlu_routing_data", "report_markdown", "subject_folds"]

Scorer = Callable[[np.ndarray], np.ndarray]
"""Row indices -> a score per row (`[m]`) or accuracy estimates (`[m, 2]`)."""
RouteOnlyFit = Callable[[np.ndarray, np.ndarray, int], Callable[[np.ndarray], np.ndarray]]
"""`(features [n, D], correct [n, 2] float 0/1 with columns (weak, strong), seed) -> (features [m, D] -> [m, 2]
accuracy estimates (weak, strong))`: how any route-only model plugs into [`compare`]."""

ROUTERS = {
    "random": "Random (RouteLLM: uniform scores, 10 draws averaged)",
    "subject": "Subject only (per-subject gain of GPT-4 over Mixtral on the other folds)",
    "weak_wrong": "Classifier: P(Mixtral wrong), logistic regression on MiniLM",
    "strong_wins": "Classifier: P(GPT-4 right, Mixtral wrong) vs tie / loss, logistic regression on MiniLM",
    "correctness": "Two correctness classifiers (logistic regressions on MiniLM), route by a_GPT-4 - a_Mixtral",
    "correctness_subject": "Two correctness classifiers on MiniLM + the subject (one-hot)",
    "route_only": "Route-only deferral model (DeferralConfig(route_only=True)) on MiniLM",
    "route_only_subject": "Route-only deferral model on MiniLM + the subject as a side feature embedded in the model "
                          "(head and weight decay chosen by inner cross-validation)",
    "route_only_e2e": "Route-only deferral model fine-tuned end to end (MiniLM + subject side feature)",
    "oracle": "Oracle (RouteLLM's optimum)",
}
"""Row names of the report, in its order."""
STRONG_CALL_PRICES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
"""Prices of a GPT-4 call (accuracy points given up per call; a Mixtral call costs 0) swept for the estimate routers."""
LEVELS = (0.2, 0.5, 0.8)


def subject_folds(subjects: Sequence[str], folds: int = 5, seed: int = 0) -> np.ndarray:
    """Fold index per row, stratified by subject: each subject's rows are shuffled and dealt out to the folds in turn
    (the dealing starts where the previous subject's stopped), so every subject is split as evenly as possible and
    the folds differ in size by at most one row.

    Example:

    ```python
    >>> from research.mmlu_routing import subject_folds
    >>> fold = subject_folds(["a"] * 4 + ["b"] * 3, folds=2, seed=0)
    >>> sorted(fold[:4].tolist()), sorted(fold[4:].tolist())
    ([0, 0, 1, 1], [0, 0, 1])

    ```
    """
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(f"`folds` must be an integer >= 2 (cross-fitting needs held-out rows), got {folds!r}.")
    subjects = np.asarray(list(subjects), dtype=object)
    rng = np.random.default_rng(seed)
    fold, dealt = np.empty(len(subjects), dtype=np.int64), 0
    for subject in sorted(set(subjects.tolist())):
        rows = rng.permutation(np.flatnonzero(subjects == subject))
        fold[rows] = (dealt + np.arange(len(rows))) % folds
        dealt += len(rows)
    return fold


def cross_fit(fit: Callable[[np.ndarray], Scorer], fold: np.ndarray) -> np.ndarray:
    """Out-of-fold scores: for each fold k, `fit(rows outside k)` returns a scorer that scores the rows of fold k.

    `fit` only ever receives the training rows' indices and its scorer only the held-out ones, so a router written as
    a `fit` never scores a row it was fitted on.

    Example:

    ```python
    >>> import numpy as np
    >>> from research.mmlu_routing import cross_fit
    >>> y = np.array([1.0, 2.0, 3.0, 4.0])
    >>> cross_fit(lambda train: (lambda rows: np.full(len(rows), y[train].mean())), np.array([0, 0, 1, 1])).tolist()
    [3.5, 3.5, 1.5, 1.5]

    ```
    """
    fold = np.asarray(fold)
    out: np.ndarray | None = None
    for k in np.unique(fold):
        held_out = np.flatnonzero(fold == k)
        scores = np.asarray(fit(np.flatnonzero(fold != k))(held_out), dtype=np.float64)
        if out is None:
            out = np.full((len(fold), *scores.shape[1:]), np.nan)
        out[held_out] = scores
    return out


def subject_router(subjects: Sequence[str], strong: np.ndarray, weak: np.ndarray) -> Callable[[np.ndarray], Scorer]:
    """Score = mean of `strong - weak` over the training rows of the row's subject (the overall mean if unseen)."""
    subjects, gain = np.asarray(list(subjects), dtype=object), strong.astype(np.float64) - weak

    def fit(train: np.ndarray) -> Scorer:
        means = {s: gain[train][subjects[train] == s].mean() for s in set(subjects[train].tolist())}
        overall = gain[train].mean()
        return lambda rows: np.array([means.get(s, overall) for s in subjects[rows]])

    return fit


def classifier_router(features: np.ndarray, target: np.ndarray, num_classes: int, column: int, seed: int,
                      epochs: int = 30) -> Callable[[np.ndarray], Scorer]:
    """Score = P(target == column) of a logistic regression on the features (the HateSpeech router's `_fit_linear`)."""

    def fit(train: np.ndarray) -> Scorer:
        probabilities = _fit_linear(features[train], target[train], num_classes, seed, epochs)
        return lambda rows: probabilities(features[rows])[:, column]

    return fit


def fit_correctness_classifiers(features: np.ndarray, correct: np.ndarray, seed: int,
                                epochs: int = 30) -> Callable[[np.ndarray], np.ndarray]:
    """A [`RouteOnlyFit`] without a deferral loss: one logistic regression per model predicting that it is right."""
    fits = [_fit_linear(features, correct[:, j].astype(np.int64), 2, seed + j, epochs) for j in range(correct.shape[1])]
    return lambda f: np.stack([fit(f)[:, 1] for fit in fits], axis=1)


def fit_route_only_deferral(features: np.ndarray, correct: np.ndarray, seed: int,
                            epochs: int = 30) -> Callable[[np.ndarray], np.ndarray]:
    """The route-only deferral model as a [`RouteOnlyFit`]: a linear head-only `EncoderForRouting(DeferralConfig(
    feature_size=D, route_only=True, num_experts=2))` on the features, trained with its per-expert binary log loss
    on the correctness targets `correct` (columns: Mixtral, GPT-4; Mixtral the default expert) by full-batch L-BFGS,
    `epochs` iterations; returns `features -> expert_accuracy` (`[m, 2]`)."""
    import torch

    from hf_defer.modeling.configuration_deferral import DeferralConfig
    from hf_defer.modeling.modeling_deferral import EncoderForRouting

    torch.manual_seed(seed)
    model = EncoderForRouting(DeferralConfig(feature_size=features.shape[1], route_only=True, num_experts=2,
                                             expert_names=["mixtral", "gpt4"]))
    x, c = torch.as_tensor(features, dtype=torch.float32), torch.as_tensor(correct, dtype=torch.float32)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=epochs, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(features=x, expert_correct=c).loss
        loss.backward()
        return loss

    optimizer.step(closure)
    model.eval()

    def estimate(rows: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(features=torch.as_tensor(rows, dtype=torch.float32)).expert_accuracy.double().numpy()

    return estimate


def _estimates_router(route_only: RouteOnlyFit, features: np.ndarray, correct: np.ndarray,
                      seed: int) -> Callable[[np.ndarray], Scorer]:
    def fit(train: np.ndarray) -> Scorer:
        estimate = route_only(features[train], correct[train], seed)
        return lambda rows: np.asarray(estimate(features[rows]), dtype=np.float64).reshape(len(rows), 2)

    return fit


def _curve_record(curve: Any) -> dict[str, list[float]]:
    return {"strong_fraction": np.round(curve.strong_fraction, 6).tolist(), "accuracy": np.round(curve.accuracy, 6).tolist()}


def _evaluate(score: np.ndarray, strong: np.ndarray, weak: np.ndarray, samples: np.ndarray) -> dict[str, Any]:
    curve = call_performance_curve(score, strong, weak)
    record = routing_summary(curve, LEVELS) | {"apgr_exact": apgr(call_performance_curve(score, strong, weak, None)),
                                               "curve": _curve_record(curve)}
    record["cpt_first_crossing"] = {f"cpt_{round(100 * x)}": cpt(curve, x, "first_crossing") for x in LEVELS}
    curves = [call_performance_curve(score[rows], strong[rows], weak[rows]) for rows in samples]
    record["bootstrap_apgr"] = [apgr(resampled) for resampled in curves]
    record["bootstrap_cpt_50"] = [cpt(resampled, 0.5) for resampled in curves]
    return record


def _evaluate_estimates(estimates: np.ndarray, strong: np.ndarray, weak: np.ndarray,
                        samples: np.ndarray) -> dict[str, Any]:
    record = _evaluate(estimates[:, 1] - estimates[:, 0], strong, weak, samples)
    swept = cost_swept_curve(estimates, strong, weak, STRONG_CALL_PRICES)
    record["cost_sweep"] = [{"price": float(p), "strong_fraction": float(f), "accuracy": float(a)}
                            for p, f, a in zip(swept.settings, swept.strong_fraction, swept.accuracy)]
    record["ece"] = {"weak": expected_calibration_error(estimates[:, 0], weak),
                     "strong": expected_calibration_error(estimates[:, 1], strong)}
    return record


def _pair(routers: dict[str, Any], name: str) -> None:
    """`routers[name]["paired"]`: its bootstrap APGR and CPT(50 %) minus those of the subject-only router and of the
    two correctness classifiers on MiniLM + the subject, resample by resample."""
    result = routers[name]
    result["paired"] = {other: {measure: (np.asarray(result[f"bootstrap_{measure}"]) - np.asarray(
        routers[other][f"bootstrap_{measure}"])).tolist() for measure in ("apgr", "cpt_50")}
        for other in ("subject", "correctness_subject") if "bootstrap_apgr" in routers.get(other, {})}


def compare(features: np.ndarray, subjects: Sequence[str], strong_correct: Any, weak_correct: Any, folds: int = 5,
            fold_seed: int = 0, bootstrap: int = 200, epochs: int = 30, route_only: RouteOnlyFit | None = None,
            log: Callable[[str], None] = print, route_only_subject: Callable[..., Any] | None = None,
            route_only_e2e: np.ndarray | None = None) -> dict[str, Any]:
    """Every router of [`ROUTERS`], cross-fitted on the same folds, measured as RouteLLM measures (APGR, CPT).

    Args:
        features (`np.ndarray` `[N, D]`): the question embeddings.
        subjects (`Sequence[str]`): each question's subject (folds are stratified by it).
        strong_correct / weak_correct (array-like `[N]`): whether GPT-4 / Mixtral answered correctly.
        folds (`int`), fold_seed (`int`): the cross-fitting folds.
        bootstrap (`int`): resamples of the questions for the APGR intervals (the routers' scores are kept fixed).
        epochs (`int`): training epochs of each logistic regression.
        route_only ([`RouteOnlyFit`], *optional*): the route-only deferral model; `None` marks its row pending.
        route_only_subject (*optional*): `(features, subjects, correct, seed) -> ((features, subjects) -> [m, 2])`,
            the route-only model with the subject as a side feature (`mmlu_side_features.fit_route_only_side_features`); its row is
            pending without it. Its APGR and CPT(50 %) are compared, paired, with the subject-only router and the two
            correctness classifiers on MiniLM + the subject.
        route_only_e2e (`np.ndarray` `[N, 2]`, *optional*): out-of-fold estimates (Mixtral, GPT-4) of the route-only
            model fine-tuned end to end (research/mmlu_e2e_router.py, on a GPU), made on exactly these folds (the
            caller checks that: `mmlu_e2e_router.check_predictions`); its row is pending without them. Compared,
            paired, as `route_only_subject`.
        log (`Callable[[str], None]`): progress messages.

    Returns:
        `dict`: `routers` (name -> APGR, CPT(20/50/80 %), exact-curve APGR, bootstrap APGRs, curve, and for the
        estimate routers the cost sweep and calibration), `accuracy` of each model, `settings`.
    """
    strong, weak = (np.asarray(v).astype(bool) for v in (strong_correct, weak_correct))
    subjects = [str(subject) for subject in subjects]
    features, n = np.asarray(features, dtype=np.float32), len(strong)
    fold = subject_folds(subjects, folds, fold_seed)
    samples = np.random.default_rng(fold_seed).integers(0, n, size=(bootstrap, n))
    correct = np.stack([weak, strong], axis=1).astype(np.float32)
    outcome = 1 + strong.astype(np.int64) - weak.astype(np.int64)  # 0 Mixtral wins, 1 tie, 2 GPT-4 wins
    routers: dict[str, Any] = {}
    start = time.perf_counter()
    random = [routing_summary(random_router_curve(strong, weak, iterations=10, seed=fold_seed + i), LEVELS)
              for i in range(100)]
    draws = np.random.default_rng(fold_seed).uniform(size=(10, n))
    routers["random"] = routing_summary(random_router_curve(strong, weak, iterations=10, seed=fold_seed), LEVELS) | {
        "apgr_exact": float(np.mean([apgr(call_performance_curve(d, strong, weak, None)) for d in draws])),
        "repeats_apgr": [r["apgr"] for r in random],
        "curve": _curve_record(random_router_curve(strong, weak, iterations=10, seed=fold_seed))}
    scored = {
        "subject": cross_fit(subject_router(subjects, strong, weak), fold),
        "weak_wrong": cross_fit(classifier_router(features, (~weak).astype(np.int64), 2, 1, fold_seed, epochs), fold),
        "strong_wins": cross_fit(classifier_router(features, outcome, 3, 2, fold_seed, epochs), fold),
    }
    for name, score in scored.items():
        routers[name] = _evaluate(score, strong, weak, samples)
        log(f"{name}: APGR {routers[name]['apgr']:.3f}, {time.perf_counter() - start:.0f} s")
    names = sorted(set(subjects))  # the subject is known when a question arrives: an input like the text
    with_subject = np.hstack([features, np.eye(len(names), dtype=np.float32)[[names.index(s) for s in subjects]]])
    correctness = lambda f, c, s: fit_correctness_classifiers(f, c, s, epochs)  # noqa: E731
    estimate_routers = {"correctness": (correctness, features), "correctness_subject": (correctness, with_subject),
                        "route_only": (route_only, features)}
    for name, (fit, inputs) in estimate_routers.items():
        if fit is None:
            routers[name] = {"pending": True}
            continue
        estimates = cross_fit(_estimates_router(fit, inputs, correct, fold_seed), fold)
        routers[name] = _evaluate_estimates(estimates, strong, weak, samples)
        scored[name] = estimates[:, 1] - estimates[:, 0]
        log(f"{name}: APGR {routers[name]['apgr']:.3f}, {time.perf_counter() - start:.0f} s")
    if route_only_subject is None:
        routers["route_only_subject"] = {"pending": True}
    else:
        subject_array = np.asarray(subjects, dtype=object)

        def fit_with_subject(train: np.ndarray) -> Scorer:
            estimate = route_only_subject(features[train], subject_array[train], correct[train], fold_seed)
            return lambda rows: np.asarray(estimate(features[rows], subject_array[rows]), dtype=np.float64)

        estimates = cross_fit(fit_with_subject, fold)
        routers["route_only_subject"] = _evaluate_estimates(estimates, strong, weak, samples)
        scored["route_only_subject"] = estimates[:, 1] - estimates[:, 0]
        _pair(routers, "route_only_subject")
        log(f"route_only_subject: APGR {routers['route_only_subject']['apgr']:.3f}, {time.perf_counter() - start:.0f} s")
    if route_only_e2e is None:
        routers["route_only_e2e"] = {"pending": True}
    else:
        estimates = np.asarray(route_only_e2e, dtype=np.float64)
        if estimates.shape != (n, 2) or not np.all((estimates >= 0) & (estimates <= 1)):
            raise ValueError(f"`route_only_e2e` must be [{n}, 2] accuracy estimates in [0, 1] (Mixtral, GPT-4), got "
                             f"shape {estimates.shape}" + ("" if estimates.shape != (n, 2) else " with values outside")
                             + ".")
        routers["route_only_e2e"] = _evaluate_estimates(estimates, strong, weak, samples)
        scored["route_only_e2e"] = estimates[:, 1] - estimates[:, 0]
        _pair(routers, "route_only_e2e")
        log(f"route_only_e2e: APGR {routers['route_only_e2e']['apgr']:.3f}")
    routers["oracle"] = routing_summary(oracle_curve(strong, weak), LEVELS) | {
        "apgr_exact": apgr(oracle_curve(strong, weak, np.arange(n + 1) / n)), "curve": _curve_record(oracle_curve(strong, weak))}
    for name in scored:  # paired bootstrap: the same resamples for every router
        routers[name]["bootstrap_minus_subject"] = (np.asarray(routers[name]["bootstrap_apgr"])
                                                    - np.asarray(routers["subject"]["bootstrap_apgr"])).tolist()
    return {"routers": routers, "accuracy": {"strong": float(strong.mean()), "weak": float(weak.mean())},
            "outcomes": {"both_right": int((strong & weak).sum()), "only_strong": int((strong & ~weak).sum()),
                         "only_weak": int((~strong & weak).sum()), "neither": int((~strong & ~weak).sum())},
            "settings": {"folds": folds, "fold_seed": fold_seed, "bootstrap": bootstrap, "epochs": epochs,
                         "rows": n, "prices": list(STRONG_CALL_PRICES), "seconds": round(time.perf_counter() - start, 1)}}


def selected_rows(num_rows: int, max_rows: int | None = None, seed: int = 0) -> np.ndarray:
    """The dataset rows of a run: all `num_rows`, or a seeded random subset of `max_rows` in the dataset's order (the
    subset of `mmlu_routing_data`, and of research/mmlu_e2e_router.py with the same `max_rows` and seed)."""
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
        raise ValueError(f"`max_rows` must be a positive integer or None, got {max_rows!r}.")
    if max_rows is None or max_rows >= num_rows:
        return np.arange(num_rows)
    return np.sort(np.random.default_rng(seed).choice(num_rows, max_rows, replace=False))


def mmlu_routing_data(max_rows: int | None = None, seed: int = 0, model: str | None = None, device: str | None = None,
                      cache_dir: str | None = None) -> tuple[Any, np.ndarray]:
    """The questions (`load_routellm_mmlu()`, or a seeded random subset of `max_rows`) and their sentence embeddings
    (`hf_defer.experts.embed_texts`, cached on disk)."""
    from hf_defer.data.routellm_mmlu import load_routellm_mmlu
    from hf_defer.experts.embeddings import DEFAULT_SENTENCE_ENCODER, embed_texts

    data = load_routellm_mmlu()
    if max_rows is not None and max_rows < data.num_rows:
        data = data.select(selected_rows(data.num_rows, max_rows, seed))
    features = embed_texts(data["prompt"], model or DEFAULT_SENTENCE_ENCODER, cache_dir=cache_dir, device=device,
                           show_progress_bar=False)
    return data, features


def _interval(values: Sequence[float]) -> str:
    low, high = np.percentile(values, [2.5, 97.5])
    return f"[{low:.3f}, {high:.3f}]"


def _percent(value: float) -> str:
    return "—" if value is None or not np.isfinite(value) else f"{100 * value:.1f} %"


def _findings(record: dict[str, Any]) -> list[str]:
    """What the table says, in words: every number from `record`."""
    routers, findings = record["routers"], []
    fitted = {n: r for n, r in routers.items() if "bootstrap_apgr" in r}
    best = max(fitted, key=lambda n: fitted[n]["apgr"])
    findings.append(f"The best cross-fitted router by APGR is {ROUTERS[best]} ({fitted[best]['apgr']:.3f}), against "
                    f"{routers['random']['apgr']:.3f} for the random router and {routers['oracle']['apgr']:.3f} for "
                    "the oracle.")
    for name, result in fitted.items():
        if name == "subject":
            continue
        low, high = np.percentile(result["bootstrap_minus_subject"], [2.5, 97.5])
        verdict = ("below" if high < 0 else "above" if low > 0 else "not distinguishable from")
        findings.append(f"{ROUTERS[name]}: APGR {result['apgr'] - routers['subject']['apgr']:+.3f} against the "
                        f"subject-only router, {verdict} it (paired 95 % interval [{low:.3f}, {high:.3f}]).")
    for name, other, paired in [(name, other, paired) for name in ("route_only_subject", "route_only_e2e")
                                for other, paired in fitted.get(name, {}).get("paired", {}).items()]:
        for measure, better, label in (("apgr", "above", "APGR"), ("cpt_50", "below", "CPT(50 %)")):
            low, high = np.percentile(paired[measure], [2.5, 97.5])
            mean = float(np.mean(paired[measure]))
            wins = (low > 0) if better == "above" else (high < 0)
            findings.append(f"{ROUTERS[name]} against {ROUTERS[other]}: {label} difference "
                            f"{mean:+.3f} (paired 95 % interval [{low:.3f}, {high:.3f}]): "
                            + ("ahead, the interval excludes 0." if wins else "**not ahead**: the interval does not "
                               "exclude 0 on the side that would make it better (lower CPT, higher APGR is better)."))
    for name, result in fitted.items():
        free = [p for p in result.get("cost_sweep", []) if p["price"] == 0]
        if free:
            findings.append(f"{ROUTERS[name]}, with a free GPT-4 call (c = 0): {_percent(free[0]['strong_fraction'])} "
                            f"GPT-4 calls, accuracy {_percent(free[0]['accuracy'])} (GPT-4 alone: "
                            f"{_percent(record['accuracy']['strong'])}).")
    return findings


def report_markdown(record: dict[str, Any]) -> str:
    """The text of results/mmlu_routing.md from the record of [`compare`] (plus `settings` added by the script)."""
    from .reporting import markdown_table, render_template

    rows, sweep_rows, calibration_rows, not_monotone = [], [], [], []
    for name, label in ROUTERS.items():
        result = record["routers"].get(name, {"pending": True})  # a record from before the row existed
        if result.get("pending"):
            rows.append([label, "pending", "", "pending", "pending", "pending", "pending", "not run"])
            continue
        interval = _interval(result["bootstrap_apgr"]) if "bootstrap_apgr" in result else (
            f"sd {np.std(result['repeats_apgr']):.3f} over 100 repeats" if "repeats_apgr" in result else "")
        versus = (_interval(result["bootstrap_minus_subject"]) if "bootstrap_minus_subject" in result
                  and name != "subject" else "")
        rows.append([label, f"{result['apgr']:.3f}", interval, *(_percent(result[f"cpt_{round(100 * x)}"]) for x in
                                                                 LEVELS), f"{result['apgr_exact']:.3f}", versus])
        crossing = result.get("cpt_first_crossing", {})
        if any(not np.isclose(value, result[key], equal_nan=True) for key, value in crossing.items()):
            not_monotone.append(f"{label}: " + ", ".join(f"{key.upper()} {_percent(value)}"
                                                          for key, value in crossing.items()))
        for point in result.get("cost_sweep", []):
            sweep_rows.append([label, f"{point['price']:g}", _percent(point["strong_fraction"]),
                               _percent(point["accuracy"])])
        if "ece" in result:
            calibration_rows.append([label, f"{result['ece']['weak']:.3f}", f"{result['ece']['strong']:.3f}"])
    table = markdown_table(["Router", "APGR", "95 % interval", "CPT(20%)", "CPT(50%)", "CPT(80%)", "APGR, exact curve",
                            "APGR minus subject-only, 95 % interval"], rows)
    return render_template(
        "report_mmlu_routing.md", record=record, settings=record["settings"], accuracy=record["accuracy"],
        outcomes=record["outcomes"], table=table, not_monotone=not_monotone, findings=_findings(record),
        sweep_table=markdown_table(["Router", "price of a GPT-4 call", "GPT-4 calls", "accuracy"], sweep_rows)
        if sweep_rows else "", calibration_table=markdown_table(["Router", "ECE of a_Mixtral", "ECE of a_GPT-4"],
                                                                calibration_rows) if calibration_rows else "")
