"""The HateSpeech cascade experiment: a cheap model, a costly model and a person, routed eight ways.

Two stages, run by `scripts/cascade_hatespeech.py`:

- [`costly_predictions`] (`--stage costly`): cross-fitted, out-of-sample class probabilities of a text classifier
  fine-tuned end to end (MiniLM by default) for every tweet: the tweets are split into K folds and fold k is
  predicted by a model trained on (a sample of) the other folds, so no tweet is ever answered by a model that saw it.
- [`compare`] (`--stage compare`): per seed, on the same test tweets in the error-cost plane
  (`hf_defer.evaluation.costs`), the confidence cascade, a RouteLLM-style router, deferral models, a route-only model
  and two learned cascades (`hf_defer.cascade`).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

# Only numpy, torch and transformers at import time: `costly_predictions` also runs where hf_defer is not installed
# (a GPU machine given this file alone); the compare stage imports the library inside its functions.

__all__ = ["cascade_data", "compare", "costly_predictions", "fold_of_rows", "summarize", "texts_digest"]

METHODS = ("cheap-first cascade", "learned cascade", "route-only", "A-SM", "S-SM", "A-OvA", "confidence cascade",
           "router")
REFERENCES = ("cheap-first cascade", "learned cascade", "A-SM")  # tested against every other one (paired t-tests)
FIRST_STAGE_EPOCHS = 5  # the cheap-first cascade's stage 1: the setting of scripts/cascade_validation_probe.py
SURROGATE_OF = {"A-SM": "asm", "S-SM": "ssm", "A-OvA": "aova"}


def cascade_data() -> Any:
    """All HateSpeech tweets in one fixed order (the train, validation and test splits of `load_hatespeech(seed=0)`
    one after the other) as a `datasets.Dataset`; both stages index rows in this order."""
    import datasets

    from hf_defer.data.hatespeech import load_hatespeech

    splits = load_hatespeech(seed=0)
    return datasets.concatenate_datasets([splits[name] for name in ("train", "validation", "test")])


def texts_digest(texts: Sequence[str]) -> str:
    """SHA-256 of the texts in order: the compare stage checks that the predictions belong to the same rows."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


def fold_of_rows(num_rows: int, folds: int, seed: int) -> np.ndarray:
    """Fold index (0..folds-1) of each row: a seeded permutation cut into `folds` nearly equal parts."""
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(f"`folds` must be an integer >= 2 (cross-fitting needs held-out rows), got {folds!r}.")
    fold = np.empty(num_rows, dtype=np.int64)
    fold[np.random.default_rng(seed).permutation(num_rows)] = np.arange(num_rows) % folds
    return fold


def _batches(order: np.ndarray, size: int) -> list[np.ndarray]:
    return [order[start : start + size] for start in range(0, len(order), size)]


def costly_predictions(
    texts: Sequence[str],
    labels: Sequence[int],
    model_path: str,
    folds: int = 5,
    train_rows_per_fold: int | None = None,
    epochs: float = 1.0,
    max_length: int = 64,
    batch_size: int = 32,
    learning_rate: float = 1e-4,
    device: str = "cpu",
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> np.ndarray:
    """Cross-fitted class probabilities of a classifier fine-tuned end to end, for every row.

    For each fold k, `AutoModelForSequenceClassification.from_pretrained(model_path)` is fine-tuned (AdamW, linear
    decay after 10 % warm-up) on `train_rows_per_fold` random rows outside fold k (all of them when `None`) and
    predicts the rows of fold k. Every row's probabilities thus come from a model that never saw it: they are valid
    expert answers on training rows too (see [`hf_defer.experts.model_expert`]).

    Args:
        texts (`Sequence[str]`) / labels (`Sequence[int]`): the rows, in a fixed order.
        model_path (`str`): a local encoder directory with its tokenizer (e.g. the MiniLM copy).
        folds (`int`): number of folds K (>= 2).
        train_rows_per_fold (`int`, *optional*): cap on the training rows of each fold's model.
        epochs (`float`), max_length (`int`), batch_size (`int`), learning_rate (`float`): fine-tuning settings.
        device (`str`): `"cpu"`, `"cuda"`, ...
        seed (`int`): seed of the folds, the samples and the initialisation.
        log (`Callable[[str], None]`): progress messages.

    Returns:
        `np.ndarray` of shape `[N, K]`: float32 probabilities, row i predicted by the model of row i's fold.
    """
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

    texts, labels = list(texts), np.asarray(labels, dtype=np.int64)
    num_labels = int(labels.max()) + 1
    fold = fold_of_rows(len(texts), folds, seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    encoded = tokenizer(texts, truncation=True, max_length=max_length)  # once: batches only pad
    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    probs = np.zeros((len(texts), num_labels), dtype=np.float32)
    rng = np.random.default_rng(seed)

    def encode(rows: np.ndarray) -> dict[str, torch.Tensor]:
        batch = tokenizer.pad({key: [values[i] for i in rows] for key, values in encoded.items()}, return_tensors="pt")
        return {key: value.to(device) for key, value in batch.items()}

    transformers.logging.set_verbosity_error()  # one "classifier newly initialised" report per fold is noise
    for k in range(folds):
        start = time.perf_counter()
        train_rows = np.flatnonzero(fold != k)
        if train_rows_per_fold is not None and train_rows_per_fold < len(train_rows):
            train_rows = rng.choice(train_rows, size=train_rows_per_fold, replace=False)
        torch.manual_seed(seed * 1000 + k)
        model = AutoModelForSequenceClassification.from_pretrained(  # float32 even from a float16 copy of the weights
            model_path, num_labels=num_labels, dtype=torch.float32).to(device)
        steps_per_epoch = math.ceil(len(train_rows) / batch_size)
        total = max(1, math.ceil(epochs * steps_per_epoch))
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
        schedule = get_linear_schedule_with_warmup(optimizer, int(0.1 * total), total)
        model.train()
        step = 0
        while step < total:
            for rows in _batches(rng.permutation(train_rows), batch_size):
                if step == total:
                    break
                loss = model(**encode(rows), labels=torch.as_tensor(labels[rows], device=device)).loss
                loss.backward()
                optimizer.step(), schedule.step(), optimizer.zero_grad()
                step += 1
        model.eval()
        held_out = np.flatnonzero(fold == k)
        by_length = held_out[np.argsort(lengths[held_out], kind="stable")]  # little padding per batch
        with torch.inference_mode():
            for rows in _batches(by_length, 4 * batch_size):
                probs[rows] = torch.softmax(model(**encode(rows)).logits.float(), -1).cpu().numpy()
        accuracy = float(np.mean(probs[held_out].argmax(1) == labels[held_out]))
        log(f"fold {k + 1}/{folds}: trained on {len(train_rows)} rows, accuracy {accuracy:.4f} on its "
            f"{len(held_out)} held-out rows, {time.perf_counter() - start:.0f} s")
        del model, optimizer
    return probs


# --------------------------------------------------------------------------------------------------- compare stage
def _adam(module: torch.nn.Module, loss_of: Callable[[torch.Tensor], torch.Tensor], rows: int, seed: int,
          epochs: int) -> None:
    """Trains `module` in place: Adam (learning rate 1e-2), seeded shuffles into batches of 256 row indices, each
    batch's loss `loss_of(indices)`; leaves it in eval mode."""
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    module.train()
    for _ in range(epochs):
        for batch in torch.randperm(rows, generator=generator).split(256):
            loss = loss_of(batch)
            optimizer.zero_grad(), loss.backward(), optimizer.step()
    module.eval()


def _fit_linear(features: np.ndarray, targets: np.ndarray, num_classes: int, seed: int, epochs: int = 30) -> Any:
    """Multinomial logistic regression (Adam, batch 256); returns a function features -> probabilities."""
    torch.manual_seed(seed)
    x, y = torch.as_tensor(features), torch.as_tensor(targets)
    layer = torch.nn.Linear(x.shape[1], num_classes)
    _adam(layer, lambda rows: torch.nn.functional.cross_entropy(layer(x[rows]), y[rows]), len(y), seed, epochs)
    return lambda f: torch.softmax(layer(torch.as_tensor(f)), -1).detach().numpy()


def _fit_deferral(features: np.ndarray, labels: np.ndarray, expert_labels: np.ndarray, surrogate: str, seed: int,
                  epochs: int) -> Any:
    """A linear `EncoderForDeferral` head with M = 2 experts (Adam, batch 256); returns features -> (p, a)."""
    from hf_defer.modeling.configuration_deferral import DeferralConfig
    from hf_defer.modeling.modeling_deferral import EncoderForDeferral

    torch.manual_seed(seed)
    model = EncoderForDeferral(DeferralConfig(feature_size=features.shape[1], num_labels=int(labels.max()) + 1,
                                              num_experts=expert_labels.shape[1], surrogate=surrogate))
    x, y, m = (torch.as_tensor(a) for a in (features, labels, expert_labels))
    _adam(model, lambda rows: model(features=x[rows], labels=y[rows], expert_labels=m[rows]).loss, len(y), seed,
          epochs)

    def estimates(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            out = model(features=torch.as_tensor(f))
        return out.class_probs.double().numpy(), out.expert_accuracy.double().numpy()

    return estimates


def _fit_route_only(features: np.ndarray, correct: np.ndarray, names: Sequence[str], seed: int,
                    epochs: int) -> Any:
    """A linear `EncoderForRouting` head (per-expert binary log loss on `correct`, Adam, batch 256);
    returns features -> estimated accuracy of each expert `[N, M]`."""
    from hf_defer.modeling.configuration_deferral import DeferralConfig
    from hf_defer.modeling.modeling_deferral import EncoderForRouting

    torch.manual_seed(seed)
    model = EncoderForRouting(DeferralConfig(feature_size=features.shape[1], route_only=True, num_experts=len(names),
                                             expert_names=list(names), default_expert=names[0]))
    x, c = torch.as_tensor(features), torch.as_tensor(correct, dtype=torch.float32)
    _adam(model, lambda rows: model(features=x[rows], expert_correct=c[rows]).loss, len(c), seed, epochs)
    with torch.no_grad():
        return lambda f: model(features=torch.as_tensor(f)).expert_accuracy.double().numpy()


def _learned_cascade_curve(top: np.ndarray, accuracy: np.ndarray, gain: np.ndarray, wrong: np.ndarray,
                           prices: Sequence[float], grid: np.ndarray) -> Any:
    """Test/validation points of the learned cascade for each setting ``(d_costly, d_person, t)`` of `grid`.

    Stage 1 (a deferral model: ``top`` = max_y p_y, ``accuracy`` = its two experts' estimates): defer iff
    ``max_j (a_j - d_j) > top``, to the argmax (0: costly model, 1: person). Stage 2, where the costly model answered:
    pay the person iff ``gain`` (its estimated accuracy less the costly model's) ``> t``. ``wrong`` `[N, 3]`: whether
    the classifier, the costly model and the person are wrong; paid = cheap + costly if called + person if called.
    """
    from hf_defer.evaluation.costs import ErrorCostCurve

    cheap, costly, person = prices
    pairs, pair_of = np.unique(grid[:, :2], axis=0, return_inverse=True)
    levels, level_of = np.unique(grid[:, 2], return_inverse=True)
    net = accuracy[None] - pairs[:, None, :]  # [G, N, 2]
    defer = net.max(2) > top[None]
    to_costly, to_person = defer & (net.argmax(2) == 0), defer & (net.argmax(2) == 1)
    escalate = (gain[None] > levels[:, None]).astype(np.float64)  # [T, N]
    n = len(top)
    base = ((~defer) * wrong[:, 0] + to_person * wrong[:, 2]).mean(1)
    after = escalate * wrong[:, 2] + (1 - escalate) * wrong[:, 1]
    error = base[:, None] + to_costly.astype(np.float64) @ after.T / n
    cost = (cheap + costly * to_costly.mean(1) + person * to_person.mean(1))[:, None] \
        + person * (to_costly.astype(np.float64) @ escalate.T) / n
    pair_of, level_of = pair_of.reshape(-1), level_of.reshape(-1)
    return ErrorCostCurve.from_points(cost[pair_of, level_of], error[pair_of, level_of], grid)


def _route_only_curve(accuracy: np.ndarray, wrong: np.ndarray, prices: Sequence[float], grid: np.ndarray) -> Any:
    """Points of a route-only model over (cheap, costly, person) for each setting ``(d_costly, d_person)``: route to
    ``argmax_j (a_j - d_j)`` with ``d_cheap = 0`` (ties to the cheap model); paid = cheap + the chosen one if not it."""
    from hf_defer.evaluation.costs import ErrorCostCurve

    net = accuracy[None] - np.concatenate([np.zeros((len(grid), 1)), grid], axis=1)[:, None, :]  # [S, N, 3]
    chosen = np.where(net[..., 1:].max(2) > net[..., 0], 1 + net[..., 1:].argmax(2), 0)
    error = np.take_along_axis(np.broadcast_to(wrong, net.shape), chosen[..., None], 2)[..., 0].mean(1)
    cost = prices[0] + prices[1] * (chosen == 1).mean(1) + prices[2] * (chosen == 2).mean(1)
    return ErrorCostCurve.from_points(cost, error, grid)


def _levels(values: np.ndarray, count: int = 24) -> np.ndarray:
    """Thresholds for a probability: 0 (always), its `count` quantiles, and 2 (never)."""
    return np.unique(np.concatenate([[0.0], np.quantile(values, np.linspace(0, 1, count)), [2.0]]))


def _select_on_validation(curve_of: Any, grid: np.ndarray, validation: np.ndarray, test: np.ndarray,
                          base: Sequence[float]) -> Any:
    """The settings on the validation Pareto front, plus `base` (the setting that never escalates, so every curve
    starts at the cheapest cost), evaluated on the test rows: no choice is made on test."""
    chosen = np.vstack([grid[curve_of(validation, grid).pareto], np.asarray(base, dtype=np.float64)[None]])
    return curve_of(test, chosen)


def compare(data: Any, features: np.ndarray, costly_probs: np.ndarray, seeds: Sequence[int], prices: Sequence[float],
            head_epochs: int = 30, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Eight ways to route between a cheap model, a costly model and a person, per seed, on the same test tweets.

    Per seed: a 70/10/20 split of the rows, annotator labels drawn with that seed, the cheap model (linear head on
    `features`), the router (linear, trained on 5-fold cross-fitted mistakes of the cheap model on the training
    rows), A-SM / S-SM / A-OvA heads with two experts (the costly model's out-of-sample answers, the annotator), a
    route-only head over the three members (the cheap model's correctness cross-fitted on the training rows), the
    learned cascade (the A-SM head as stage 1; stage 2 a route-only head over (costly model, annotator) on
    [`escalation_features`] of the features and the costly model's probabilities) and the cheap-first cascade
    ([`_cheap_first_estimates`]). Every method's settings (decision costs, thresholds) are swept on the validation
    rows; those on the validation Pareto front are evaluated on the test rows. Prices: `prices = (cheap, costly,
    person)` per tweet; the cheap model's features are paid by every method that reads them.

    Returns:
        `dict`: per seed and method, the test (cost, error) points; the members alone.
    """
    from hf_defer.data.hatespeech import HATESPEECH_LABELS
    from hf_defer.evaluation.costs import error_cost_curve
    from .routing_baselines import confidence_cascade_curve, router_curve
    from hf_defer.cascade import escalation_features
    from hf_defer.experts.simulated import annotator_expert

    cheap_price, costly_price, person_price = (float(p) for p in prices)
    labels = np.asarray(data["labels"], dtype=np.int64)
    n, num_classes = len(labels), costly_probs.shape[1]
    costly_answer = costly_probs.argmax(1)
    escalation_all = escalation_features(features, costly_probs)
    prices = (cheap_price, costly_price, person_price)
    runs = []
    for seed in seeds:
        start = time.perf_counter()
        person = np.asarray(annotator_expert(data, list(HATESPEECH_LABELS), seed=seed)["expert_labels"], dtype=np.int64)
        order = np.random.default_rng(seed).permutation(n)
        n_test, n_val = round(0.2 * n), round(0.1 * n)
        test, val, train = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]
        cheap = _fit_linear(features[train], labels[train], num_classes, seed)
        cheap_probs = cheap(features)
        # The router learns where the cheap model errs, from cross-fitted (out-of-sample) cheap answers.
        crossfit = cheap_probs.copy()  # on training rows: out of sample
        inner = fold_of_rows(len(train), 5, seed)
        for k in range(5):
            fit = _fit_linear(features[train[inner != k]], labels[train[inner != k]], num_classes, seed)
            crossfit[train[inner == k]] = fit(features[train[inner == k]])
        wrong = np.zeros(n, dtype=np.int64)
        wrong[train] = crossfit[train].argmax(1) != labels[train]
        router_score = _fit_linear(features[train], wrong[train], 2, seed)(features)[:, 1]
        answers = np.stack([cheap_probs.argmax(1), costly_answer, person], axis=1)
        confidence = np.stack([cheap_probs.max(1), costly_probs.max(1)], axis=1)
        curves: dict[str, Any] = {}
        grid = np.array([(a, b) for a in _levels(confidence[:, 0]) for b in _levels(confidence[:, 1])])
        curves["confidence cascade"] = _select_on_validation(
            lambda rows, g: confidence_cascade_curve(confidence[rows], answers[rows], labels[rows],
                                                     [cheap_price, costly_price, person_price], g),
            grid, val, test, base=[0.0, 0.0])
        levels = _levels(router_score)
        grid = np.array([(a, b) for a in levels for b in levels if a <= b])
        curves["router"] = _select_on_validation(
            lambda rows, g: router_curve(router_score[rows], answers[rows], labels[rows],
                                         [0.0, costly_price, person_price], g, router_cost=cheap_price),
            grid, val, test, base=[2.0, 2.0])
        experts = np.stack([costly_answer, person], axis=1)
        # Decision costs of either sign: max_j (a_j - d_j) > max_y p_y with every d_j < 0 shifted by min(d) is the
        # rule with a negative defer threshold, so the deferral models can also send (nearly) everything on.
        steps = np.concatenate([-np.geomspace(1e-2, 1.0, 12)[::-1], [0.0], np.geomspace(1e-3, 1.0, 24)])
        grid = np.array([(a, b) for a in steps for b in steps])
        for method, surrogate in SURROGATE_OF.items():
            estimate = _fit_deferral(features[train], labels[train], experts[train], surrogate, seed, head_epochs)
            probs, accuracy = estimate(features)
            curves[method] = _select_on_validation(
                lambda rows, g: error_cost_curve(probs[rows], accuracy[rows], labels[rows], experts[rows],
                                                 [costly_price, person_price], decision_costs=g,
                                                 model_cost=cheap_price),
                grid, val, test, base=[1.0, 1.0])
            if method == "A-SM":
                stage1 = (probs, accuracy)
        # The route-only model over the three members: the cheap model's correctness on training rows is cross-fitted.
        correct = np.stack([1 - wrong, costly_answer == labels, person == labels], axis=1).astype(np.float32)
        wrong_of = np.stack([answers[:, 0] != labels, costly_answer != labels, person != labels], axis=1)
        accuracy = _fit_route_only(features[train], correct[train], ["cheap", "costly", "person"], seed,
                                   head_epochs)(features)
        curves["route-only"] = _select_on_validation(
            lambda rows, g: _route_only_curve(accuracy[rows], wrong_of[rows], prices, g), grid, val, test,
            base=[1.0, 1.0])
        # The learned cascade: stage 1 = the A-SM model above; stage 2 = a route-only model over (costly, person)
        # reading the cheap features and the costly model's probabilities (out-of-sample on every row).
        stage2 = _fit_route_only(escalation_all[train], correct[train, 1:], ["costly", "person"], seed, head_epochs)
        gain = np.diff(stage2(escalation_all), axis=1)[:, 0]  # a_person - a_costly
        probs, accuracy = stage1
        stage1_wrong = np.stack([probs.argmax(1) != labels, wrong_of[:, 1], wrong_of[:, 2]], axis=1)
        curves["learned cascade"] = _select_on_validation(
            lambda rows, g: _learned_cascade_curve(probs[rows].max(1), accuracy[rows], gain[rows], stage1_wrong[rows],
                                                   prices, g), _escalation_grid(grid, gain), val, test,
            base=[1.0, 1.0, 2.0])
        first = _cheap_first_estimates(cheap_probs, crossfit, costly_probs, labels, person, correct, train, seed,
                                       head_epochs)
        curves["cheap-first cascade"] = _select_on_validation(
            lambda rows, g: _learned_cascade_curve(*(a[rows] for a in first), prices, g),
            _escalation_grid(grid, first[2]), val, test, base=[1.0, 1.0, 2.0])
        members = {"cheap model alone": (cheap_price, float(np.mean(answers[test, 0] != labels[test]))),
                   "costly model alone": (costly_price, float(np.mean(costly_answer[test] != labels[test]))),
                   "annotator alone": (person_price, float(np.mean(person[test] != labels[test])))}
        runs.append({"seed": seed, "members": members,
                     "curves": {name: {"cost": c.cost.tolist(), "error": c.error.tolist()}
                                for name, c in curves.items()}})
        log(f"seed {seed}: {time.perf_counter() - start:.0f} s; " + ", ".join(
            f"{name} min error {min(c.error):.4f}" for name, c in curves.items()))
    return {"runs": runs, "prices": {"cheap": cheap_price, "costly": costly_price, "person": person_price},
            "rows": n}


def _escalation_grid(pairs: np.ndarray, gain: np.ndarray) -> np.ndarray:
    """A cascade's settings ``(d_costly, d_person, t)``: each pair of stage-1 decision costs with the stage-2 levels
    of `gain` (always: -2, its 24 quantiles, never: 2)."""
    levels = np.unique(np.concatenate([[-2.0], np.quantile(gain, np.linspace(0, 1, 24)), [2.0]]))
    return np.array([(a, b, t) for a, b in pairs for t in levels])


def _cheap_first_estimates(cheap: np.ndarray, crossfit: np.ndarray, costly: np.ndarray, labels: np.ndarray,
                           person: np.ndarray, correct: np.ndarray, train: np.ndarray, seed: int,
                           epochs: int) -> tuple[np.ndarray, ...]:
    """The cheap-first cascade (a [`DeferralCascade`] with `first_expert`) trained on `train`, as the arguments
    ``top, accuracy, gain, wrong`` of [`_learned_cascade_curve`]. Stage 1: route-only over (cheap, costly, person) on
    [`escalation_features`] of the cheap probabilities (`crossfit` on training rows), `FIRST_STAGE_EPOCHS`. Stage 2:
    A-SM with classes and the person on those and the costly probabilities; its classifier stacks both models, the
    person is paid below a confidence threshold (`stage2_min_confidence`), so ``gain = -max p``."""
    from hf_defer.cascade import escalation_features

    nothing = np.zeros((len(labels), 0), dtype=np.float32)
    first_train, first_all = escalation_features(nothing, crossfit), escalation_features(nothing, cheap)
    estimate = _fit_route_only(first_train[train], correct[train], ["cheap", "costly", "person"], seed,
                               FIRST_STAGE_EPOCHS)(first_all)
    stacked, _ = _fit_deferral(escalation_features(first_train[train], costly[train]), labels[train],
                               person[train, None], "asm", seed, epochs)(escalation_features(first_all, costly))
    wrong = np.stack([cheap.argmax(1) != labels, stacked.argmax(1) != labels, person != labels], axis=1)
    return estimate[:, 0], estimate[:, 1:], -stacked.max(1), wrong  # escalate iff -max p > -threshold


def _best_error_at(cost: Sequence[float], error: Sequence[float], budgets: np.ndarray) -> np.ndarray:
    """The lowest error with cost <= b, for each budget b (NaN below the cheapest point)."""
    cost, error = np.asarray(cost), np.asarray(error)
    return np.array([error[cost <= b].min() if (cost <= b).any() else np.nan for b in budgets])


def summarize(result: dict[str, Any], budgets: int = 200) -> dict[str, Any]:
    """Areas under each method's test error-cost staircase (budgets log-uniform from the cheap price to the person's),
    their mean and standard error over seeds, paired t-tests of each of `REFERENCES` against the others, and the mean
    curves."""
    from scipy import stats

    from hf_defer.evaluation.costs import area_under_error_cost
    from .statistics import mean_and_standard_error

    low, high = result["prices"]["cheap"], result["prices"]["person"]
    grid = np.geomspace(low, high, budgets)
    # Budgets log-uniform on [low, high], as the figure's axis: the staircase in log cost.
    area = {m: [area_under_error_cost(np.log(r["curves"][m]["cost"]), r["curves"][m]["error"], np.log(low),
                                      np.log(high)) for r in result["runs"]] for m in METHODS}
    mean_curve = {m: np.nanmean([_best_error_at(r["curves"][m]["cost"], r["curves"][m]["error"], grid)
                                 for r in result["runs"]], axis=0) for m in METHODS}
    seeds = len(result["runs"])
    summary: dict[str, Any] = {"budgets": grid.tolist(), "range": [low, high], "seeds": seeds,
                               "mean_curve": {m: v.tolist() for m, v in mean_curve.items()}, "area": {}, "versus": {}}
    for m in METHODS:
        mean, error = mean_and_standard_error(area[m])
        summary["area"][m] = {"per_seed": np.asarray(area[m]).tolist(), "mean": mean, "se": error}
    for reference in REFERENCES:
        versus = summary["versus"].setdefault(reference, {})
        for m in METHODS:
            if m == reference:
                continue
            difference = np.asarray(area[reference]) - np.asarray(area[m])
            p = (float(stats.ttest_rel(area[reference], area[m]).pvalue) if seeds > 1 and difference.std() > 0
                 else float("nan"))
            versus[m] = {"mean_difference": float(difference.mean()), "p_value": p,
                         "seeds_below": int((difference < 0).sum()),
                         "share_of_budgets_below": float(np.mean(mean_curve[reference] < mean_curve[m])),
                         "share_of_budgets_above": float(np.mean(mean_curve[reference] > mean_curve[m]))}
    members = {name: (float(np.mean([r["members"][name][0] for r in result["runs"]])),
                      float(np.mean([r["members"][name][1] for r in result["runs"]])))
               for name in result["runs"][0]["members"]}
    summary["members"] = members
    return summary
