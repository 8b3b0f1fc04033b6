"""The route-only deferral model of the MMLU report with what a router knows beside the question: the subject, as a
side feature embedded inside the model (`DeferralConfig(side_features=...)`), its head chosen by cross-validation on
the training folds only. It plugs into [`~research.mmlu_routing.compare`] as `route_only_subject`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .mmlu_routing import subject_folds

__all__ = ["fit_route_only_side_features"]


def fit_route_only_side_features(features: np.ndarray, subjects: Sequence[str], correct: np.ndarray, seed: int,
                                 epochs: int = 30, hidden: Sequence[Sequence[int]] = ((), (64,)), inner_folds: int = 3,
                                 dim: int = 16) -> Callable[[np.ndarray, Sequence[str]], np.ndarray]:
    """The route-only deferral model with the subject as a side feature *inside* the model (an embedding of width
    `dim` joined to the features before the head: `DeferralConfig(side_features=...)`), trained as
    [`fit_route_only_deferral`] (full-batch L-BFGS, `epochs` iterations). The head (`hidden`: a linear head, or one
    hidden layer of 64) is chosen by `inner_folds`-fold cross-validation on the given (training) rows only, by the
    held-out loss; returns `(features, subjects) -> expert_accuracy` (`[m, 2]`)."""
    import torch

    from hf_defer.modeling.configuration_deferral import DeferralConfig
    from hf_defer.modeling.modeling_deferral import EncoderForRouting
    from hf_defer.modeling.side_features import side_feature_specs, side_feature_tensors

    subjects = [str(subject) for subject in subjects]
    specs = side_feature_specs({"subject": subjects}, dim=dim)

    def tensors(f: np.ndarray, names: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, _ = side_feature_tensors(specs, [{"subject": str(name)} for name in names])
        return torch.as_tensor(f, dtype=torch.float32), ids

    def train(rows: np.ndarray, sizes: Sequence[int]) -> Any:
        torch.manual_seed(seed)
        model = EncoderForRouting(DeferralConfig(feature_size=features.shape[1], route_only=True, num_experts=2,
                                                 expert_names=["mixtral", "gpt4"], side_features=specs,
                                                 head_hidden_sizes=list(sizes)))
        x, ids = tensors(features[rows], [subjects[i] for i in rows])
        c = torch.as_tensor(correct[rows], dtype=torch.float32)
        optimizer = torch.optim.LBFGS(model.parameters(), max_iter=epochs, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(features=x, side_categorical=ids, expert_correct=c).loss
            loss.backward()
            return loss

        optimizer.step(closure)
        return model.eval()

    inner = subject_folds(subjects, inner_folds, seed)
    losses = []
    for sizes in hidden:
        total = 0.0
        for k in range(inner_folds):
            model, held = train(np.flatnonzero(inner != k), sizes), np.flatnonzero(inner == k)
            x, ids = tensors(features[held], [subjects[i] for i in held])
            with torch.no_grad():
                total += float(model(features=x, side_categorical=ids, expert_correct=torch.as_tensor(
                    correct[held], dtype=torch.float32)).loss) * len(held)
        losses.append(total / len(subjects))
    model = train(np.arange(len(subjects)), hidden[int(np.argmin(losses))])
    model.chosen_head, model.inner_losses = list(hidden[int(np.argmin(losses))]), losses

    def estimate(rows: np.ndarray, names: Sequence[str]) -> np.ndarray:
        x, ids = tensors(rows, names)
        with torch.no_grad():
            return model(features=x, side_categorical=ids).expert_accuracy.double().numpy()

    estimate.model = model  # type: ignore[attr-defined]
    return estimate
