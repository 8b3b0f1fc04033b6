"""The route-only deferral model of the MMLU report with what a router knows beside the question: the subject, as a
side feature embedded inside the model (`DeferralConfig(side_features=...)`), its head and the L2 penalty on what it
reads of the text chosen by cross-validation on the training folds only. It plugs into [`~research.mmlu_routing.compare`] as `route_only_subject`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hf_defer.evaluation.routellm_metrics import apgr, call_performance_curve
from .mmlu_routing import subject_folds

__all__ = ["WEIGHT_DECAYS", "fit_route_only_side_features"]

WEIGHT_DECAYS = (0.0, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
"""The L2 penalties the inner cross-validation chooses from (with the head)."""


def fit_route_only_side_features(features: np.ndarray, subjects: Sequence[str], correct: np.ndarray, seed: int,
                                 epochs: int = 30, hidden: Sequence[Sequence[int]] = ((), (64,)), inner_folds: int = 3,
                                 dim: int = 16, weight_decays: Sequence[float] = WEIGHT_DECAYS,
                                 select_by: str = "loss") -> Callable[[np.ndarray, Sequence[str]], np.ndarray]:
    """The route-only deferral model with the subject as a side feature *inside* the model (an embedding of width
    `dim` joined to the features before the head: `DeferralConfig(side_features=...)`), trained as
    [`fit_route_only_deferral`] (full-batch L-BFGS, `epochs` iterations) on its loss plus an L2 penalty
    `weight_decay / 2 * ||W_text||^2` on the head's first-layer weights that read the features (the text), not on
    those of the subject, so that shrinking what the text says leaves the subject's effect free. The head
    (`hidden`: a linear head, or one hidden layer of 64) and the `weight_decay` (`weight_decays`) are chosen together,
    on the grid of both, by `inner_folds`-fold cross-validation on the given (training) rows only: by `select_by`,
    `"loss"` (the held-out loss, without the penalty: a proper score, less noisy than a ranking measure on a few
    hundred rows) or `"apgr"` (the report's measure: RouteLLM's APGR of the out-of-fold score `a_GPT-4 - a_Mixtral`
    of the inner folds pooled; ties broken by the loss; the columns of `correct` must be (Mixtral, GPT-4)). The grid
    of penalties reaches 10, where the text is all but switched off (the subject alone), so that the choice can fall
    back on the subject when the text does not help. Returns `(features, subjects) -> expert_accuracy` (`[m, 2]`), with
    `.model.chosen_head`, `.model.chosen_weight_decay` and `.model.inner_losses` (per grid point: head, weight decay,
    held-out loss and APGR)."""
    import torch

    from hf_defer.modeling.configuration_deferral import DeferralConfig
    from hf_defer.modeling.modeling_deferral import EncoderForRouting
    from hf_defer.modeling.side_features import side_feature_specs, side_feature_tensors

    subjects = [str(subject) for subject in subjects]
    specs = side_feature_specs({"subject": subjects}, dim=dim)

    def tensors(f: np.ndarray, names: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, _ = side_feature_tensors(specs, [{"subject": str(name)} for name in names])
        return torch.as_tensor(f, dtype=torch.float32), ids

    def train(rows: np.ndarray, sizes: Sequence[int], weight_decay: float) -> Any:
        torch.manual_seed(seed)
        model = EncoderForRouting(DeferralConfig(feature_size=features.shape[1], route_only=True, num_experts=2,
                                                 expert_names=["mixtral", "gpt4"], side_features=specs,
                                                 head_hidden_sizes=list(sizes)))
        x, ids = tensors(features[rows], [subjects[i] for i in rows])
        c = torch.as_tensor(correct[rows], dtype=torch.float32)
        optimizer = torch.optim.LBFGS(model.parameters(), max_iter=epochs, line_search_fn="strong_wolfe")
        first = next(module for module in model.head.modules() if isinstance(module, torch.nn.Linear))
        width = features.shape[1]  # the head reads [features, subject embedding]: the text's columns come first

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(features=x, side_categorical=ids, expert_correct=c).loss
            if weight_decay:
                loss = loss + weight_decay / 2 * (first.weight[:, :width] ** 2).sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        return model.eval()

    if not weight_decays or any(not np.isfinite(w) or w < 0 for w in weight_decays):
        raise ValueError(f"`weight_decays` must be a non-empty sequence of finite numbers >= 0, got {weight_decays!r}.")
    if select_by not in ("apgr", "loss"):
        raise ValueError(f"`select_by` must be 'apgr' or 'loss', got {select_by!r}.")
    inner = subject_folds(subjects, inner_folds, seed)
    grid = [(tuple(sizes), float(weight_decay)) for sizes in hidden for weight_decay in weight_decays]
    losses, apgrs = [], []
    for sizes, weight_decay in grid:
        total, scores = 0.0, np.empty(len(subjects))
        for k in range(inner_folds):
            model, held = train(np.flatnonzero(inner != k), sizes, weight_decay), np.flatnonzero(inner == k)
            x, ids = tensors(features[held], [subjects[i] for i in held])
            with torch.no_grad():
                output = model(features=x, side_categorical=ids,
                               expert_correct=torch.as_tensor(correct[held], dtype=torch.float32))
            total += float(output.loss) * len(held)
            scores[held] = (output.expert_accuracy[:, 1] - output.expert_accuracy[:, 0]).double().numpy()
        losses.append(total / len(subjects))
        apgrs.append(apgr(call_performance_curve(scores, correct[:, 1] > 0.5, correct[:, 0] > 0.5)))
    # the highest APGR (the lowest loss among equals), or the lowest loss
    best = min(range(len(grid)), key=lambda i: (-apgrs[i], losses[i]) if select_by == "apgr" else losses[i])
    sizes, weight_decay = grid[best]
    model = train(np.arange(len(subjects)), sizes, weight_decay)
    model.chosen_head, model.chosen_weight_decay = list(sizes), weight_decay
    model.inner_losses = [{"head": list(h), "weight_decay": w, "loss": loss, "apgr": a}
                          for (h, w), loss, a in zip(grid, losses, apgrs)]

    def estimate(rows: np.ndarray, names: Sequence[str]) -> np.ndarray:
        x, ids = tensors(rows, names)
        with torch.no_grad():
            return model(features=x, side_categorical=ids).expert_accuracy.double().numpy()

    estimate.model = model  # type: ignore[attr-defined]
    return estimate
