"""A learned cascade: a deferral model decides from the input, then a route-only model decides after a model expert
has answered whether to accept its answer or pay the next expert.

Stage 1 is a deferral model over feature vectors (`DeferralConfig(feature_size=D, num_labels=K, expert_names=[...])`):
its classifier answers cheaply, or it defers to one of its experts. When it defers to the *escalation expert* (a model
whose answer comes with class probabilities), stage 2 — a route-only model (`DeferralConfig(route_only=True,
feature_size=D + K + 3, expert_names=[escalation expert, next expert, ...], default_expert=escalation expert)`) —
reads [`escalation_features`] (the input's features, that expert's K class probabilities, their max, their entropy and
the log-odds of the max) and accepts the answer unless another expert's estimated accuracy, less its decision cost,
beats it. Each input's amount paid is the classifier's price plus the price of every expert called.

Both stages are ordinary saved deferral models. A cascade folder holds stage 1 at its root (`config.json`, the weights
and the code files: the folder transformers' `pipeline()` reads, so `pipeline("deferral-cascade", model=folder,
experts=...)` loads it, see [`~hf_defer.experts.cascade_pipeline.DeferralCascadePipeline`]), stage 2 in `stage2/`, and
`cascade_config.json` (the escalation expert, the prices and the stages' subfolders). Folders saved before this layout
(stage 1 in `stage1/`) still load with [`DeferralCascade.from_pretrained`]. Decision costs of both stages are set per
call, so one training run serves every point of the error-cost curve.
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

from ..modeling.modeling_deferral import EncoderForDeferral
from ..modeling.pipeline_options import CASCADE_CONFIG_NAME
from ..modeling.surrogate_base import check_defer_threshold, check_expert_costs
from .model_experts import answers_to_ids

__all__ = ["CASCADE_CONFIG_NAME", "MODEL_ANSWER", "DeferralCascade", "cascade_stage_folders", "escalation_features",
           "read_cascade_config"]

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
    >>> from hf_defer.experts.deferral_cascade import escalation_features
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


class DeferralCascade:
    r"""Two saved deferral models run as one pipeline, with per-input accounting of the experts called and the price
    paid.

    Args:
        stage1 ([`EncoderForDeferral`]): a head-only deferral model (classifier + experts) over feature vectors.
        stage2 ([`EncoderForDeferral`]): a head-only route-only model whose default expert is `escalation_expert`
            and whose `feature_size` is stage 1's plus `K + 3` ([`escalation_features`]).
        escalation_expert (`str`): the stage-1 expert that answers with class probabilities and is checked by stage 2.
        prices (`Mapping[str, float]`): price per input of `"model"` (stage 1's classifier, always paid) and of every
            expert of both stages; finite and non-negative.

    Example:

    ```python
    >>> import numpy as np, torch
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> from hf_defer.experts.deferral_cascade import DeferralCascade
    >>> stage1 = EncoderForDeferral(DeferralConfig(feature_size=2, num_labels=2, num_experts=2, surrogate="aova",
    ...                                            expert_names=["llm", "person"]))
    >>> stage2 = EncoderForDeferral(DeferralConfig(feature_size=2 + 2 + 3, route_only=True, num_experts=2,
    ...                                            expert_names=["llm", "person"], default_expert="llm"))
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
                 prices: Mapping[str, float]) -> None:
        c1, c2 = stage1.config, stage2.config
        if c1.encoder is not None or c1.route_only is True:
            raise ValueError("stage1 must be a head-only deferral model with a classifier (feature_size=D, "
                             f"num_labels=K), got encoder={c1.encoder is not None}, route_only={c1.route_only}.")
        if c2.encoder is not None or c2.route_only is not True:
            raise ValueError("stage2 must be a head-only route-only model (route_only=True, feature_size=...), got "
                             f"encoder={c2.encoder is not None}, route_only={c2.route_only}.")
        if escalation_expert not in c1.expert_names:
            raise ValueError(f"escalation_expert must be one of stage1's experts {c1.expert_names}, got "
                             f"{escalation_expert!r}.")
        if c2.default_expert != escalation_expert:
            raise ValueError(f"stage2's default_expert must be the escalation expert {escalation_expert!r} (stage 2 "
                             f"accepts its answer unless another expert is worth paying), got {c2.default_expert!r}.")
        expected = c1.feature_size + c1.num_labels + SUMMARY_SIZE
        if c2.feature_size != expected:
            raise ValueError(
                f"stage2 expects {c2.feature_size} input features, but stage1's {c1.feature_size} features plus the "
                f"escalation expert's {c1.num_labels} class probabilities and {SUMMARY_SIZE} summaries make "
                f"{expected}: "
                "stage2 must be trained on escalation_features of stage1's inputs and that expert's outputs.")
        self.stage1, self.stage2 = stage1.eval(), stage2.eval()
        self.escalation_expert = escalation_expert
        self.expert_names = list(dict.fromkeys([*c1.expert_names, *c2.expert_names]))
        self.prices = _check_prices(prices, self.expert_names)

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, save_directory: str | os.PathLike, overwrite: bool = False) -> None:
        """Writes stage 1 at the folder's root and stage 2 in `stage2/` (each a deferral folder, see
        [`EncoderForDeferral.save_pretrained`]), then `cascade_config.json` (escalation expert, prices, stages).

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
        config = {"escalation_expert": self.escalation_expert, "prices": self.prices, "stages": list(STAGE_FOLDERS)}
        (folder / CASCADE_CONFIG_NAME).write_text(json.dumps(config, indent=1) + "\n")

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> DeferralCascade:
        """Loads a folder written by [`save_pretrained`]: stage 1 at the root, or in `stage1/` (the old layout)."""
        config = read_cascade_config(folder)
        first, second = cascade_stage_folders(folder, config)
        stage1 = EncoderForDeferral.from_pretrained(first)
        stage2 = EncoderForDeferral.from_pretrained(second)
        return cls(stage1, stage2, config["escalation_expert"], config["prices"])

    # ------------------------------------------------------------------ running
    @torch.no_grad()
    def decide(self, features: Any, expert_probs: Callable[[np.ndarray], Any], stage1_costs: Any = None,
               stage2_costs: Any = None, stage2_threshold: float = 0.0,
               stage1_threshold: float = 0.0) -> dict[str, np.ndarray]:
        """The decisions alone: ``stage1`` (``-1`` the classifier, else the stage-1 expert's index), ``prediction``
        (the classifier's class), ``escalate`` (bool: stage 2 pays another expert), ``stage2`` (its expert's index in
        stage 2's experts) and ``probs`` (the escalation expert's probabilities, NaN where not called).
        `expert_probs(rows)` returns the escalation expert's `[len(rows), K]` probabilities for those row indices."""
        x = torch.as_tensor(np.asarray(features, dtype=np.float32))
        c1, c2 = self.stage1.config, self.stage2.config
        if x.ndim != 2 or x.shape[1] != c1.feature_size:
            raise ValueError(f"features must have shape [N, {c1.feature_size}], got {tuple(x.shape)}.")
        costs1 = check_expert_costs(stage1_costs, c1.num_experts, "stage1_costs") if stage1_costs is not None else \
            getattr(c1, "expert_costs", None)
        costs2 = check_expert_costs(stage2_costs, c2.num_experts, "stage2_costs") if stage2_costs is not None else \
            getattr(c2, "expert_costs", None)
        threshold, threshold1 = check_defer_threshold(stage2_threshold), check_defer_threshold(stage1_threshold)
        logits = self.stage1(features=x.to(self.stage1.device, self.stage1.dtype)).logits.float().cpu()
        defer, prediction, expert = self.stage1.surrogate.decide(logits, expert_costs=costs1,
                                                                 defer_threshold=threshold1)
        stage1 = torch.where(defer, expert, torch.full_like(expert, -1)).numpy()
        n, k = len(x), c1.num_labels
        probs = np.full((n, k), np.nan)
        escalate = np.zeros(n, dtype=bool)
        stage2 = np.full(n, -1)
        rows = np.flatnonzero(stage1 == c1.expert_names.index(self.escalation_expert))
        if len(rows):
            answered = np.asarray(expert_probs(rows), dtype=np.float64)
            if answered.shape != (len(rows), k):
                raise ValueError(f"the escalation expert {self.escalation_expert!r} must return [{len(rows)}, {k}] "
                                 f"class probabilities (stage 2 reads {k}), got shape {answered.shape}.")
            probs[rows] = answered
            z = torch.as_tensor(escalation_features(x[rows].numpy(), answered))
            z = self.stage2(features=z.to(self.stage2.device, self.stage2.dtype)).logits.float().cpu()
            up, chosen, _ = self.stage2.surrogate.decide(z, expert_costs=costs2, defer_threshold=threshold)
            escalate[rows], stage2[rows] = up.numpy(), chosen.numpy()
        return {"stage1": stage1, "prediction": prediction.numpy(), "escalate": escalate, "stage2": stage2,
                "probs": probs}

    def __call__(self, features: Any, experts: Mapping[str, Callable[[list[Any]], Any]], inputs: Sequence[Any] | None
                 = None, stage1_costs: Any = None, stage2_costs: Any = None, stage2_threshold: float = 0.0,
                 stage1_threshold: float = 0.0) -> list[dict[str, Any]]:
        """Runs the cascade: stage 1 on every input, each called expert once on the batch of inputs routed to it.

        Args:
            features (array-like `[N, D]`): what stage 1 reads.
            experts (`Mapping[str, Callable]`): per expert name, a function from a list of inputs to answers: class
                probabilities `[n, K]` for the escalation expert, class ids or names for the others.
            inputs (`Sequence`, *optional*): what the experts read (texts, images...); the feature rows by default.
            stage1_costs, stage2_costs (sequences of `float`, *optional*): decision costs per expert of each stage
                (the models' configured `expert_costs` when `None`); stage1_threshold, stage2_threshold (`float`):
                each stage's margin to defer (negative: defer more; decision costs `d` of either sign are costs
                `d - min(d)` with threshold `min(d)`).

        Returns:
            `list[dict]`, per input: ``label`` (class name), ``answered_by`` (`"model"` or an expert's name),
            ``experts_called`` (in order), ``paid`` (the classifier's price plus each called expert's).
        """
        missing = sorted(set(self.expert_names) - set(experts))
        if missing:
            raise ValueError(f"experts must give a function for every expert {self.expert_names}, missing {missing}.")
        items = list(inputs) if inputs is not None else list(np.asarray(features))
        config = self.stage1.config
        label2id = {name: i for i, name in config.id2label.items()}
        decision = self.decide(features, lambda rows: experts[self.escalation_expert]([items[i] for i in rows]),
                               stage1_costs, stage2_costs, stage2_threshold, stage1_threshold)
        n = len(items)
        answer = decision["prediction"].copy()
        answered_by = [MODEL_ANSWER] * n
        called: list[list[str]] = [[] for _ in range(n)]
        final = {}  # row -> expert whose answer counts, other than the escalation expert
        for i in range(n):
            if decision["stage1"][i] >= 0:
                first = config.expert_names[decision["stage1"][i]]
                called[i].append(first)
                answered_by[i] = first
                if first == self.escalation_expert:
                    answer[i] = int(np.argmax(decision["probs"][i]))
                    if decision["escalate"][i]:
                        final[i] = self.stage2.config.expert_names[decision["stage2"][i]]
                else:
                    final[i] = first
        for i, name in final.items():
            if name != called[i][-1]:
                called[i].append(name)
            answered_by[i] = name
        for name in dict.fromkeys(final.values()):
            rows = [i for i, who in final.items() if who == name]
            ids = answers_to_ids(list(experts[name]([items[i] for i in rows])), label2id, expert=name)
            answer[rows] = ids
        return [{"label": config.id2label[int(answer[i])], "answered_by": answered_by[i], "experts_called": called[i],
                 "paid": self.prices[MODEL_ANSWER] + math.fsum(self.prices[e] for e in called[i])} for i in range(n)]


def read_cascade_config(folder: str | os.PathLike) -> dict[str, Any]:
    """The checked `cascade_config.json` of a cascade folder: ``escalation_expert``, ``prices`` and ``stages`` (stage
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
    `None`)."""
    stages = (config if config is not None else read_cascade_config(folder))["stages"]
    root = Path(folder)
    return root / stages[0], root / stages[1]  # Path("cascade") / "." is Path("cascade")
