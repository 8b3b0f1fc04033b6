"""A learned cascade: stage 1 decides from the input who answers; after a model expert has answered, stage 2 decides
whether its answer stands or the next expert is paid.

Stage 1 is either a deferral model over feature vectors (`DeferralConfig(feature_size=D, num_labels=K,
expert_names=[...])`: its classifier answers cheaply, or it defers to one of its experts), or, with `first_expert`, a
route-only model that reads a cheap model expert's class probabilities (every input is first answered by that expert,
and stage 1 keeps its answer or sends the input on; [`escalation_features`] of the features and those probabilities).
When stage 1 sends an input to the *escalation expert* (a model whose answer comes with class probabilities), stage 2
reads [`escalation_features`] of stage 1's input and that expert's probabilities (their max, their entropy and the
log-odds of the max). Stage 2 is either a route-only model (`route_only=True, default_expert=escalation expert`: the
expert's answer stands unless another expert's estimated accuracy, less its decision cost, beats it) or a deferral
model with a classifier (its classifier *stacks* the answers read so far into the final answer, unless one of its
experts is worth paying). Each input's amount paid is the price of `"model"` (the cascade's own heads) plus the price
of every expert called.

Both stages are ordinary saved deferral models. A cascade folder holds stage 1 at its root (`config.json`, the weights
and the code files: the folder transformers' `pipeline()` reads, so `pipeline("deferral-cascade", model=folder,
experts=...)` loads it, see [`~hf_defer.cascade.pipeline_cascade.DeferralCascadePipeline`]), stage 2 in `stage2/`, and
`cascade_config.json` (the escalation expert, the first expert, the class names, the prices and the stages'
subfolders). Folders saved before this layout (stage 1 in `stage1/`) still load with
[`DeferralCascade.from_pretrained`]. Decision costs and thresholds of both stages are set per call, so one training
run serves every point of the error-cost curve.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..experts.model_experts import answers_to_ids, one_answer_per_input
from ..modeling.cascade_folder import CASCADE_CONFIG_NAME
from ..modeling.modeling_deferral import EncoderForDeferral
from ..modeling.surrogate_base import check_defer_threshold, check_expert_costs

# The cascade's public names; the folder helpers (cascade_options, cascade_stage_folders, check_min_confidence,
# read_cascade_config) are shared with pipeline_cascade only.
__all__ = ["CASCADE_CONFIG_NAME", "MODEL_ANSWER", "DeferralCascade", "escalation_features"]

STAGE_FOLDERS = (".", "stage2")
"""Where `save_pretrained` puts stage 1 (the folder's root) and stage 2, relative to the cascade folder."""
OLD_STAGE_FOLDERS = ("stage1", "stage2")
"""The layout written before stage 1 moved to the root (no config.json at the root)."""
MODEL_ANSWER = "model"
"""The key of the stage-1 classifier's price in `prices`, and the ``answered_by`` of the inputs it answers."""
SUMMARY_SIZE = 3  # max probability, entropy, log-odds of the max


def escalation_features(features: Any, expert_probs: Any) -> np.ndarray:
    """Stage 2's input: ``[features ; p_1..p_K ; max_k p_k ; entropy (nats) ; log(max / (1 - max))]`` per row.

    The max is what a confidence cascade thresholds; the entropy and the log-odds (clipped to ±12) let a linear head
    separate confident answers from one another where the max saturates near 1.

    Args:
        features (array-like `[N, D]`): the inputs' feature vectors (those stage 1 reads).
        expert_probs (array-like `[N, K]`): the escalation expert's class probabilities (rows sum to 1).

    Returns:
        `np.ndarray` of shape `[N, D + K + 3]`, float32.

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.cascade import escalation_features
    >>> row = escalation_features([[0.5, -0.5]], [[0.5, 0.5]])[0]
    >>> [round(float(v), 4) for v in row]  # features, probs, max, entropy log 2, log-odds 0
    [0.5, -0.5, 0.5, 0.5, 0.5, 0.6931, 0.0]

    ```
    """
    x = np.asarray(features, dtype=np.float64)
    p = np.asarray(expert_probs, dtype=np.float64)
    if x.ndim != 2 or p.ndim != 2 or len(x) != len(p):
        raise ValueError(f"features and expert_probs must be 2-D with one row per input, got shapes {x.shape} and "
                         f"{p.shape}.")
    if not (np.isfinite(p).all() and (p >= 0).all() and np.allclose(p.sum(1), 1.0, atol=1e-3)):
        raise ValueError("expert_probs must hold class probabilities: finite, non-negative rows summing to 1.")
    top = p.max(1, keepdims=True)
    entropy = -(p * np.log(np.clip(p, 1e-12, None))).sum(1, keepdims=True)
    clipped = np.clip(top, 1e-6, 1 - 1e-6)
    log_odds = np.clip(np.log(clipped) - np.log1p(-clipped), -12.0, 12.0)
    return np.concatenate([x, p, top, entropy, log_odds], axis=1).astype(np.float32)


def check_min_confidence(value: Any) -> float | None:
    """`stage2_min_confidence`: `None`, or a probability in [0, 1] (not a bool), as a float."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                              not 0.0 <= value <= 1.0):
        raise ValueError(f"stage2_min_confidence must be a probability in [0, 1], got {value!r}.")
    return None if value is None else float(value)


def _check_prices(prices: Any, names: Sequence[str]) -> dict[str, float]:
    if not isinstance(prices, Mapping):
        raise TypeError(f"prices must be a mapping from {[MODEL_ANSWER, *names]} to a price per input, got "
                        f"{type(prices).__name__}.")
    missing = sorted(set([MODEL_ANSWER, *names]) - set(prices))
    unknown = sorted(set(prices) - set([MODEL_ANSWER, *names]))
    if missing or unknown:
        raise ValueError(f"prices must name exactly {[MODEL_ANSWER, *names]} (missing {missing}, unknown {unknown}).")
    keys = [MODEL_ANSWER, *names]
    values = check_expert_costs([prices[k] for k in keys], len(keys), argument="prices")
    return dict(zip(keys, values))


def _class_names(config: Any) -> list[str]:
    return [str(config.id2label[i]) for i in range(config.num_labels)]


class DeferralCascade:
    r"""Two saved deferral models run as one pipeline, with per-input accounting of the experts called and the price
    paid.

    Args:
        stage1 ([`EncoderForDeferral`]): a head-only deferral model over feature vectors: with a classifier (the
            default), or route-only over the experts with `first_expert` as its default expert.
        stage2 ([`EncoderForDeferral`]): a head-only model over `stage1.config.feature_size + K + 3` features
            ([`escalation_features`] of stage 1's input and the escalation expert's probabilities): route-only with the
            escalation expert as default, or with a classifier (the stacked answer) and experts other than it.
        escalation_expert (`str`): the stage-1 expert that answers with class probabilities and is checked by stage 2.
        prices (`Mapping[str, float]`): price per input of `"model"` (the cascade's heads, always paid) and of every
            expert of both stages; finite and non-negative.
        first_expert (`str`, *optional*): the model expert that answers every input first, with class probabilities
            stage 1 reads (stage 1 must then be route-only with it as default expert); always paid.
        labels (`Sequence[str]`, *optional*): the class names, needed only where no stage has a classifier (otherwise
            taken from it; given, they must agree).

    Example:

    ```python
    >>> import numpy as np, torch
    >>> from hf_defer import DeferralConfig, EncoderForDeferral, EncoderForRouting
    >>> from hf_defer.cascade import DeferralCascade
    >>> stage1 = EncoderForDeferral(DeferralConfig(feature_size=2, num_labels=2, num_experts=2, surrogate="aova",
    ...                                            expert_names=["llm", "person"]))
    >>> stage2 = EncoderForRouting(DeferralConfig(feature_size=2 + 2 + 3, route_only=True, num_experts=2,
    ...                                           expert_names=["llm", "person"], default_expert="llm"))
    >>> for model, bias in ((stage1, [0.0, 0.0, 2.0, 0.0]), (stage2, [0.0, 0.0])):  # stage 1: a_llm 0.88 > p 0.5
    ...     _ = torch.nn.init.zeros_(model.head[1].weight), model.head[1].bias.data.copy_(torch.tensor(bias))
    >>> cascade = DeferralCascade(stage1, stage2, "llm", {"model": 1, "llm": 10, "person": 100})
    >>> experts = {"llm": lambda rows: np.tile([0.1, 0.9], (len(rows), 1)), "person": lambda rows: [0] * len(rows)}
    >>> out = cascade(np.zeros((1, 2)), experts, stage2_costs=[0.0, 0.1])[0]  # stage 2: 0.5 - 0.1 < 0.5, keep
    >>> out["answered_by"], out["experts_called"], out["paid"], out["label"]
    ('llm', ['llm'], 11.0, 'LABEL_1')

    ```
    """

    def __init__(self, stage1: EncoderForDeferral, stage2: EncoderForDeferral, escalation_expert: str,
                 prices: Mapping[str, float], first_expert: str | None = None,
                 labels: Sequence[str] | None = None) -> None:
        c1, c2 = stage1.config, stage2.config
        if first_expert is None and (c1.encoder is not None or c1.route_only is True):
            raise ValueError("stage1 must be a head-only deferral model with a classifier (feature_size=D, "
                             f"num_labels=K), got encoder={c1.encoder is not None}, route_only={c1.route_only} (a "
                             "route-only stage 1 needs first_expert: the model expert whose probabilities it reads).")
        if first_expert is not None and (c1.encoder is not None or c1.route_only is not True
                                         or c1.default_expert != first_expert):
            raise ValueError(f"with first_expert={first_expert!r}, stage1 must be a head-only route-only model whose "
                             f"default_expert is {first_expert!r}, got encoder={c1.encoder is not None}, "
                             f"route_only={c1.route_only}, default_expert={getattr(c1, 'default_expert', None)!r}.")
        if c2.encoder is not None:
            raise ValueError("stage2 must be a head-only model (feature_size=...), got one with an encoder.")
        if escalation_expert not in c1.expert_names or escalation_expert == first_expert:
            raise ValueError(f"escalation_expert must be one of stage1's experts {c1.expert_names} other than the "
                             f"first expert, got {escalation_expert!r}.")
        if c2.route_only is True and c2.default_expert != escalation_expert:
            raise ValueError(f"a route-only stage2's default_expert must be the escalation expert "
                             f"{escalation_expert!r} (stage 2 accepts its answer unless another expert is worth "
                             f"paying), got {c2.default_expert!r}.")
        if c2.route_only is not True and escalation_expert in c2.expert_names:
            raise ValueError(f"a stage2 with a classifier stacks the escalation expert's answer (it reads its "
                             f"probabilities), so its experts {c2.expert_names} must not include "
                             f"{escalation_expert!r}.")
        named = [_class_names(c) for c in (c1, c2) if c.route_only is not True]
        if isinstance(labels, (str, bytes)) or not (labels is None or isinstance(labels, Sequence)):
            raise TypeError(f"labels must be a sequence of class names, got {type(labels).__name__}.")
        if labels is not None:
            named.append([str(name) for name in labels])
        if not named:
            raise ValueError("labels: neither stage has a classifier, so the cascade needs the class names (labels=["
                             "...], in the order of the experts' probabilities), got None.")
        if any(names != named[0] for names in named) or len(named[0]) < 2:
            raise ValueError(f"labels: the stages' classifiers and `labels` must name the same K >= 2 classes in the "
                             f"same order, got {named}.")
        self.labels = named[0]
        k = len(self.labels)
        self.input_size = c1.feature_size - (k + SUMMARY_SIZE if first_expert is not None else 0)
        if self.input_size < 0:
            raise ValueError(f"stage1 reads {c1.feature_size} features, fewer than the first expert's {k} class "
                             f"probabilities and {SUMMARY_SIZE} summaries: it must be trained on escalation_features "
                             "of the inputs' features and the first expert's probabilities.")
        expected = c1.feature_size + k + SUMMARY_SIZE
        if c2.feature_size != expected:
            raise ValueError(
                f"stage2 expects {c2.feature_size} input features, but stage1's {c1.feature_size} features plus the "
                f"escalation expert's {k} class probabilities and {SUMMARY_SIZE} summaries make {expected}: "
                "stage2 must be trained on escalation_features of stage1's inputs and that expert's outputs.")
        self.stage1, self.stage2 = stage1.eval(), stage2.eval()
        self.escalation_expert, self.first_expert = escalation_expert, first_expert
        self.expert_names = list(dict.fromkeys([*c1.expert_names, *c2.expert_names]))
        self.prices = _check_prices(prices, self.expert_names)

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, save_directory: str | os.PathLike, overwrite: bool = False) -> None:
        """Writes stage 1 at the folder's root and stage 2 in `stage2/` (each a deferral folder, see
        [`EncoderForDeferral.save_pretrained`]), then `cascade_config.json` (escalation and first experts, class
        names, prices, stages).

        Args:
            save_directory (`str` or `os.PathLike`): the folder; created if missing.
            overwrite (`bool`, *optional*, defaults to `False`): replace a model or cascade already saved there
                (otherwise a `FileExistsError` lists its files and nothing is written); a cascade of the old layout
                loses its `stage1/` folder.
        """
        folder = Path(save_directory)
        if folder.is_file():
            raise ValueError(f"save_directory must be a directory, got the file {str(folder)!r}.")
        taken = sorted(name for name in ("config.json", CASCADE_CONFIG_NAME, *OLD_STAGE_FOLDERS)
                       if (folder / name).exists()) + sorted(path.name for path in folder.glob("*.safetensors"))
        if taken and not overwrite:
            raise FileExistsError(f"{str(folder)!r} already holds a saved model or cascade ({taken}); pass "
                                  "overwrite=True to replace it, or save into another folder.")
        old = folder / OLD_STAGE_FOLDERS[0]
        if overwrite and (folder / CASCADE_CONFIG_NAME).is_file() and (old / "config.json").is_file():
            shutil.rmtree(old)  # the old layout's stage 1: the root replaces it
        self.stage1.save_pretrained(folder, overwrite=overwrite)
        self.stage2.save_pretrained(folder / STAGE_FOLDERS[1], overwrite=overwrite)
        config = {"escalation_expert": self.escalation_expert, "first_expert": self.first_expert,
                  "labels": self.labels, "prices": self.prices, "stages": list(STAGE_FOLDERS)}
        (folder / CASCADE_CONFIG_NAME).write_text(json.dumps(config, indent=1) + "\n")

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> DeferralCascade:
        """Loads a folder written by [`save_pretrained`]: stage 1 at the root, or in `stage1/` (the old layout)."""
        config = read_cascade_config(folder)
        first, second = cascade_stage_folders(folder, config)
        return cls(EncoderForDeferral.from_pretrained(first), EncoderForDeferral.from_pretrained(second),
                   **cascade_options(config))

    # ------------------------------------------------------------------ running
    def _answers(self, name: str, expert_probs: Callable[[np.ndarray], Any], rows: np.ndarray) -> np.ndarray:
        answered = np.asarray(expert_probs(rows), dtype=np.float64)
        k = len(self.labels)
        if answered.shape != (len(rows), k):
            raise ValueError(f"the model expert {name!r} must return [{len(rows)}, {k}] class probabilities (the "
                             f"cascade reads {k}), got shape {answered.shape}.")
        return answered

    @torch.no_grad()
    def decide(self, features: Any, expert_probs: Callable[[np.ndarray], Any], stage1_costs: Any = None,
               stage2_costs: Any = None, stage2_threshold: float = 0.0, stage1_threshold: float = 0.0,
               first_probs: Callable[[np.ndarray], Any] | None = None,
               stage2_min_confidence: float | None = None) -> dict[str, np.ndarray]:
        """The decisions alone: ``stage1`` (``-1`` the classifier, else the stage-1 expert's index: the first expert's
        where it answers), ``prediction`` (the class stage 1 answers: its classifier's or the first expert's),
        ``escalate`` (bool: stage 2 pays another expert), ``stage2`` (that expert's index in stage 2's experts),
        ``stage2_prediction`` (the class that stands after the escalation expert: stage 2's classifier's, or that
        expert's; ``-1`` where not called), ``stage2_margin`` (stage 2's deferral margin, ``-inf`` where not reached)
        and ``probs`` (the escalation expert's probabilities, NaN where not called).
        `expert_probs(rows)` and `first_probs(rows)` return the escalation and first experts' `[len(rows), K]`
        probabilities for those row indices. With `stage2_min_confidence`, stage 2 pays its best expert (by estimated
        accuracy less decision cost) exactly where the answer's max probability is below it, instead of the cost rule.
        """
        x = np.asarray(features, dtype=np.float32)
        c1, c2 = self.stage1.config, self.stage2.config
        if x.ndim != 2 or x.shape[1] != self.input_size:
            raise ValueError(f"features must have shape [N, {self.input_size}], got {x.shape}.")
        costs1 = check_expert_costs(stage1_costs, c1.num_experts, "stage1_costs") if stage1_costs is not None else \
            getattr(c1, "expert_costs", None)
        costs2 = check_expert_costs(stage2_costs, c2.num_experts, "stage2_costs") if stage2_costs is not None else \
            getattr(c2, "expert_costs", None)
        threshold, threshold1 = check_defer_threshold(stage2_threshold), check_defer_threshold(stage1_threshold)
        stage2_min_confidence = check_min_confidence(stage2_min_confidence)
        n, k = len(x), len(self.labels)
        if self.first_expert is not None:
            if first_probs is None:
                raise ValueError(f"first_probs is required: stage 1 reads the first expert {self.first_expert!r}'s "
                                 "class probabilities.")
            first = self._answers(self.first_expert, first_probs, np.arange(n))
            x = escalation_features(x, first)
        u = self.stage1(features=torch.as_tensor(x).to(self.stage1.device, self.stage1.dtype)).logits.float().cpu()
        defer, prediction, expert = self.stage1.surrogate.decide(u, expert_costs=costs1, defer_threshold=threshold1)
        stage1 = torch.where(defer, expert, torch.full_like(expert, -1)).numpy()
        if self.first_expert is not None:  # route-only: `prediction` is the chosen expert, the default where kept
            stage1, prediction = prediction.numpy(), torch.as_tensor(first.argmax(1))
        probs = np.full((n, k), np.nan)
        escalate = np.zeros(n, dtype=bool)
        stage2, answer2, margin2 = np.full(n, -1), np.full(n, -1), np.full(n, -np.inf)
        rows = np.flatnonzero(stage1 == c1.expert_names.index(self.escalation_expert))
        if len(rows):
            probs[rows] = answered = self._answers(self.escalation_expert, expert_probs, rows)
            z = torch.as_tensor(escalation_features(x[rows], answered))
            z = self.stage2(features=z.to(self.stage2.device, self.stage2.dtype)).logits.float().cpu()
            up, second, chosen = self.stage2.surrogate.decide(z, expert_costs=costs2, defer_threshold=threshold)
            margin2[rows] = self.stage2.surrogate.deferral_margin(z, costs2)[0].numpy()
            stacked = c2.route_only is not True
            answer2[rows] = second.numpy() if stacked else answered.argmax(1)
            if stage2_min_confidence is not None:
                confidence = self.stage2.surrogate.probabilities(z)[0].max(1).values.numpy() if stacked else \
                    answered.max(1)
                up = torch.as_tensor(confidence < stage2_min_confidence)
                chosen = self.stage2.surrogate.deferral_margin(z, costs2)[1]
            escalate[rows], stage2[rows] = up.numpy(), torch.where(up, chosen, -1).numpy()
        return {"stage1": stage1, "prediction": prediction.numpy(), "escalate": escalate, "stage2": stage2,
                "stage2_prediction": answer2, "probs": probs, "stage2_margin": margin2}

    def calibrate_escalation(self, features: Any, expert_probs: Callable[[np.ndarray], Any],
                             max_escalation_rate: float, confidence: float | None = 0.9, **decide_kwargs: Any) -> float:
        """The ``stage2_threshold`` under which stage 2 pays another expert (the costly call: a person) on at most
        ``max_escalation_rate`` of new inputs, with probability at least ``confidence`` over the draw of these
        calibration inputs ([`budget_threshold`] on stage 2's margins; inputs stage 1 keeps count, never escalated;
        never below 0); ``confidence=None``: the empirical rule. Calls the escalation expert (`expert_probs`) on the
        inputs stage 1 sends it; `decide_kwargs` are [`decide`]'s (the costs and stage-1 threshold to decide with)."""
        from ..evaluation.guarantees import budget_threshold

        if decide_kwargs.pop("stage2_min_confidence", None) is not None:
            raise ValueError("calibrate_escalation budgets the cost rule's threshold; stage2_min_confidence replaces it.")
        decide_kwargs.pop("stage2_threshold", None)
        margins = self.decide(features, expert_probs, **decide_kwargs)["stage2_margin"]
        return budget_threshold(margins, max_escalation_rate, confidence)

    def __call__(self, features: Any, experts: Mapping[str, Callable[[list[Any]], Any]], inputs: Sequence[Any] | None
                 = None, stage1_costs: Any = None, stage2_costs: Any = None, stage2_threshold: float = 0.0,
                 stage1_threshold: float = 0.0, stage2_min_confidence: float | None = None) -> list[dict[str, Any]]:
        """Runs the cascade: stage 1 on every input, each called expert once on the batch of inputs routed to it.

        Args:
            features (array-like `[N, D]`): what stage 1 reads (with the first expert's probabilities, if any; `D` may
                then be 0: `np.zeros((N, 0))`).
            experts (`Mapping[str, Callable]`): per expert name, a function from a list of inputs to answers: class
                probabilities `[n, K]` for the escalation and first experts, class ids or names for the others.
            inputs (`Sequence`, *optional*): what the experts read (texts, images...); the feature rows by default.
            stage1_costs, stage2_costs (sequences of `float`, *optional*): decision costs per expert of each stage
                (the models' configured `expert_costs` when `None`); stage1_threshold, stage2_threshold (`float`):
                each stage's margin to defer (negative: defer more; decision costs `d` of either sign are costs
                `d - min(d)` with threshold `min(d)`).
            stage2_min_confidence (`float`, *optional*): stage 2 pays another expert exactly where the max probability
                of the answer that would stand (stage 2's classifier's, or the escalation expert's) is below this
                (the confidence cascade's rule), instead of the cost rule; the expert paid is still the best by
                estimated accuracy less decision cost.

        Returns:
            `list[dict]`, per input: ``label`` (class name), ``answered_by`` (`"model"` where a classifier of the
            cascade gave the answer, stage 2's stacking the experts' probabilities included, else the expert's name),
            ``experts_called`` (in order), ``paid`` (the price of `"model"` plus each called expert's).
        """
        missing = sorted(set(self.expert_names) - set(experts))
        if missing:
            raise ValueError(f"experts must give a function for every expert {self.expert_names}, missing {missing}.")
        items = list(inputs) if inputs is not None else list(np.asarray(features))
        ask = lambda name: lambda rows: experts[name]([items[i] for i in rows])  # noqa: E731
        decision = self.decide(features, ask(self.escalation_expert), stage1_costs, stage2_costs, stage2_threshold,
                               stage1_threshold, ask(self.first_expert) if self.first_expert else None,
                               stage2_min_confidence)
        names1, names2 = self.stage1.config.expert_names, self.stage2.config.expert_names
        stacked = self.stage2.config.route_only is not True
        n = len(items)
        answer = decision["prediction"].copy()
        answered_by = [self.first_expert or MODEL_ANSWER] * n
        called: list[list[str]] = [[self.first_expert] if self.first_expert else [] for _ in range(n)]
        final = {}  # row -> expert whose answer counts, other than the first and the escalation expert
        for i in range(n):
            first = names1[decision["stage1"][i]] if decision["stage1"][i] >= 0 else None
            if first is None or first == self.first_expert:
                continue
            called[i].append(first)
            answered_by[i] = first
            if first == self.escalation_expert:
                answer[i] = decision["stage2_prediction"][i]
                answered_by[i] = MODEL_ANSWER if stacked else first
                if decision["escalate"][i]:
                    final[i] = names2[decision["stage2"][i]]
            else:
                final[i] = first
        for i, name in final.items():
            if name != called[i][-1]:
                called[i].append(name)
            answered_by[i] = name
        label2id = {name: i for i, name in enumerate(self.labels)}
        for name in dict.fromkeys(final.values()):
            rows = [i for i, who in final.items() if who == name]
            given = one_answer_per_input(experts[name]([items[i] for i in rows]), len(rows), name, rows)
            answer[rows] = answers_to_ids(given, label2id, expert=name, rows=rows)
        return [{"label": self.labels[int(answer[i])], "answered_by": answered_by[i], "experts_called": called[i],
                 "paid": self.prices[MODEL_ANSWER] + math.fsum(self.prices[e] for e in called[i])} for i in range(n)]


def cascade_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The [`DeferralCascade`] arguments other than the stages, from a [`read_cascade_config`] result."""
    return {key: config.get(key) for key in ("escalation_expert", "prices", "first_expert", "labels")}


def read_cascade_config(folder: str | os.PathLike) -> dict[str, Any]:
    """The checked `cascade_config.json` of a cascade folder: ``escalation_expert``, ``prices``, ``first_expert`` and
    ``labels`` (absent, or `None`, for a cascade whose stage 1 has a classifier) and ``stages`` (stage
    1's and stage 2's subfolders, ``["stage1", "stage2"]`` where a folder of the old layout lacks the key and has no
    `config.json` at its root). A folder without the file raises a `FileNotFoundError` naming it."""
    root = Path(folder)
    path = root / CASCADE_CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"folder {str(root)!r} is not a deferral cascade: it has no {CASCADE_CONFIG_NAME} "
                                "(DeferralCascade.save_pretrained writes one).")
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{str(path)!r} is not valid JSON: {err}.") from None
    if not isinstance(config, dict) or not {"escalation_expert", "prices"} <= set(config):
        raise ValueError(f"{str(path)!r} must be a JSON object with 'escalation_expert' and 'prices', got "
                         f"{config!r:.120}.")
    default = STAGE_FOLDERS if (root / "config.json").is_file() else OLD_STAGE_FOLDERS
    stages = config.setdefault("stages", list(default))
    if not (isinstance(stages, list) and len(stages) == 2 and all(isinstance(stage, str) for stage in stages)
            and all(not Path(stage).is_absolute() and ".." not in Path(stage).parts for stage in stages)):
        raise ValueError(f"'stages' of {str(path)!r} must be two subfolders of the cascade folder (stage 1's, stage "
                         f"2's), such as {list(STAGE_FOLDERS)}, got {stages!r}.")
    return config


def cascade_stage_folders(folder: str | os.PathLike, config: Mapping[str, Any] | None = None) -> tuple[Path, Path]:
    """Stage 1's and stage 2's folders inside a cascade folder (`config`: its [`read_cascade_config`], read when
    `None`). A stage whose folder holds no `config.json` is a `FileNotFoundError` naming the cascade folder and the
    missing stage (before any loading, which would report it as a problem of the stage's config)."""
    stages = (config if config is not None else read_cascade_config(folder))["stages"]
    root = Path(folder)
    paths = (root / stages[0], root / stages[1])  # Path("cascade") / "." is Path("cascade")
    for number, (stage, path) in enumerate(zip(stages, paths), start=1):
        if not (path / "config.json").is_file():
            where = "at its root" if Path(stage) == Path(".") else f"in {stage}/"
            if number == 1 and list(stages) == list(OLD_STAGE_FOLDERS):  # neither layout's stage 1
                where = f"at its root (or {where}, where cascades saved before stage 1 moved to the root keep it)"
            raise FileNotFoundError(f"cascade folder {str(root)!r} is missing stage {number}: no config.json {where}. "
                                    "Restore the stage's files, or save the cascade again "
                                    "(DeferralCascade.save_pretrained).")
    return paths
