"""The base class of the deferral surrogates: input validation, ``-100`` masking, reduction and the decision rule.

The four surrogates (:mod:`surrogates`) subclass :class:`DeferralSurrogate` and implement only their loss and
estimator. This module only imports ``torch``: it is copied next to the model code for remote-code loading.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import torch

IGNORE_INDEX = -100
"""Label value that marks a row to ignore (the Hugging Face padding convention)."""

MAX_ABS_LOGIT = 1e30
"""The largest logit magnitude accepted: beyond it, differences and sums of logits overflow float32 in the losses."""


def _as_target_tensor(name: str, values: object, device: torch.device | None) -> torch.Tensor:
    """``torch.as_tensor(values)``, with an error naming ``name`` for ragged lists, strings and other non-numbers."""
    try:
        return torch.as_tensor(values, device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(
            f"{name} must be integer class ids (a tensor, array or list of ints, one row per example), got a "
            f"{type(values).__name__} that is not a rectangular array of numbers ({err})."
        ) from None


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def estimate_margin(class_probs: torch.Tensor, expert_accuracy: torch.Tensor,
                    costs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The deferral margin on estimates, ``max_j (a_j - c_j) - max_y p_y``, and ``argmax_j (a_j - c_j)``: the one rule
    behind [`DeferralSurrogate.decide`] (defer iff the margin exceeds the threshold), which other code that already
    holds estimates (error-cost sweeps) calls too.

    Args:
        class_probs (`torch.Tensor` `[N, K]`), expert_accuracy (`torch.Tensor` `[N, M]`): the estimates.
        costs (`torch.Tensor` `[M]`, *optional*): one cost per expert; zeros when `None`.
    """
    gains = expert_accuracy if costs is None else expert_accuracy - costs.to(expert_accuracy)
    best, expert = gains.max(dim=1)
    return best - class_probs.amax(dim=1), expert


def check_expert_costs(costs: Any, num_experts: int, argument: str = "expert_costs") -> list[float]:
    """One finite, non-negative cost per expert, as floats (zeros when `costs` is None): the one check of costs, for
    the config, the decision, the pipeline and the error-cost sweeps. A negative cost would pay for asking an expert.

    Raises:
        TypeError: `costs` is not a sequence (a string, a number, a dict...).
        ValueError: not one cost per expert, or a cost that is negative, NaN, infinite or not a number.
    """
    if costs is None:
        return [0.0] * num_experts
    if hasattr(costs, "tolist"):  # np.ndarray, torch.Tensor
        costs = costs.tolist()
    if isinstance(costs, (str, bytes, dict)) or not hasattr(costs, "__len__"):
        raise TypeError(f"{argument} must be a sequence of {num_experts} numbers (one per expert), got "
                        f"{type(costs).__name__} {costs!r}.")
    costs = list(costs)
    if len(costs) != num_experts:
        raise ValueError(f"{argument} must have one cost per expert (num_experts={num_experts}), got {costs!r}.")
    if not all(_is_finite_number(cost) and cost >= 0 for cost in costs):
        raise ValueError(f"{argument} must be finite, non-negative numbers, got {costs!r}.")
    return [float(cost) for cost in costs]


def check_defer_threshold(value: Any) -> float:
    """The margin to defer (`defer_threshold`): a finite number, as a float; the one check for the config, the
    decision and the pipeline."""
    if not _is_finite_number(value):
        raise ValueError(f"defer_threshold must be a finite number, got {value!r}.")
    return float(value)


class DeferralSurrogate:
    """Base class of the deferral surrogates. Use :func:`get_surrogate` to build one.

    Subclasses set ``kernel`` and implement ``_log_estimates`` (float32; float64 for the margin); the base class does
    the validation, the ``-100`` masking, the reduction and the decision rule (:meth:`decide`).

    Args:
        num_classes (`int`): number of classes ``K`` (at least 2).
        num_experts (`int`, *optional*, defaults to 1): number of experts ``M`` (at least 1).
    """

    name: str = ""
    """The key of :func:`get_surrogate` (``"asm"``, ...)."""
    display_name: str = ""
    """How papers and reports write it (``"A-SM"``, ...)."""
    description: str = ""
    """What the loss is, in a few words (for model cards)."""
    citation: str = ""
    """Where it comes from (authors, venue, year)."""
    bounded: bool = True
    """Whether the expert-accuracy estimator lies in [0, 1] by construction (unbounded ones are clipped)."""
    kernel: Any = None
    """The `torch.autograd.Function` computing the per-example loss and its gradient (`surrogate_kernels`)."""

    def __init__(self, num_classes: int, num_experts: int = 1) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, Integral) or num_classes < 2:
            raise ValueError(
                f"num_classes must be an integer >= 2 (learning to defer needs at least two classes), got {num_classes!r}."
            )
        if isinstance(num_experts, bool) or not isinstance(num_experts, Integral) or num_experts < 1:
            raise ValueError(f"num_experts must be an integer >= 1, got {num_experts!r}.")
        self.num_classes = int(num_classes)
        self.num_experts = int(num_experts)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, num_classes={self.num_classes}, num_experts={self.num_experts})"

    # ------------------------------------------------------------------ validation
    def check_logits(self, logits: torch.Tensor, check_values: bool = True) -> torch.Tensor:
        """Validates ``logits`` and returns them as float32 (gradients still flow to the input dtype).

        The type, shape and dtype checks read only metadata. With ``check_values`` (the default), every value must
        also be finite and at most `MAX_ABS_LOGIT` (1e30) in magnitude: beyond that the losses would overflow float32
        and turn NaN. One reduction checks both; it costs a pass over the logits and, on an accelerator, a device
        sync, which ``check_values=False`` skips (for data a training loop has already checked).
        """
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}.")
        width = self.num_classes + self.num_experts
        if logits.dim() != 2 or logits.shape[1] != width:
            raise ValueError(
                f"logits must have shape [batch, num_classes + num_experts] = [B, {self.num_classes} + {self.num_experts}], "
                f"got {tuple(logits.shape)}."
            )
        if not logits.is_floating_point():
            raise ValueError(f"logits must be a floating-point tensor, got dtype {logits.dtype}.")
        if check_values and not (logits.abs() <= MAX_ABS_LOGIT).all():  # False for NaN too
            bad = int((~(logits.abs() <= MAX_ABS_LOGIT)).any(dim=1).sum())
            if not torch.isfinite(logits).all():
                raise ValueError(f"logits must be finite, got NaN or inf in {bad} of {logits.shape[0]} rows.")
            raise ValueError(
                f"logits must lie within +-{MAX_ABS_LOGIT:g} (larger ones overflow float32 in the loss), got "
                f"{float(logits.abs().max()):.3g} in {bad} of {logits.shape[0]} rows."
            )
        return logits.float()

    def check_targets(
        self,
        labels: torch.Tensor,
        expert_labels: torch.Tensor,
        batch_size: int,
        device: torch.device | None = None,
        check_values: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Validates the targets of a batch.

        Shapes and dtypes are always checked (metadata only). ``check_values=False`` skips the checks of the values
        (labels in range, no missing expert label on a counted row): each is a pass over the targets and, on an
        accelerator, a device sync. Use it only on data checked before, e.g. once for a whole dataset as
        [`DeferralTrainer`] does; an out-of-range label then fails inside the kernel or silently counts wrong.

        Returns:
            `tuple`: ``labels`` as long ``[B]`` with ignored rows set to 0, ``expert_labels`` as long
            ``[B, M]``, and the boolean mask ``[B]`` of rows that count (label != -100).
        """
        labels = _as_target_tensor("labels", labels, device)
        expert_labels = _as_target_tensor("expert_labels", expert_labels, device)
        K, M = self.num_classes, self.num_experts
        if labels.dim() == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.dim() != 1 or labels.shape[0] != batch_size:
            raise ValueError(f"labels must have shape [batch] = [{batch_size}], got {tuple(labels.shape)}.")
        if labels.is_floating_point() or labels.dtype == torch.bool:
            raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
        if expert_labels.dim() == 1 and M == 1:
            expert_labels = expert_labels[:, None]
        if expert_labels.dim() != 2 or expert_labels.shape != (batch_size, M):
            raise ValueError(
                f"expert_labels must have shape [batch, num_experts] = [{batch_size}, {M}]"
                f"{' (or [batch] for one expert)' if M == 1 else ''}, got {tuple(expert_labels.shape)}."
            )
        if expert_labels.is_floating_point() or expert_labels.dtype == torch.bool:
            raise ValueError(f"expert_labels must be integers, got dtype {expert_labels.dtype}.")
        labels, expert_labels = labels.long(), expert_labels.long()
        valid = labels != IGNORE_INDEX
        if not check_values:
            return torch.where(valid, labels, 0), expert_labels, valid
        bad = valid & ((labels < 0) | (labels >= K))
        if bad.any():
            raise ValueError(
                f"labels must lie in [0, {K}) or be {IGNORE_INDEX} (ignored), got {labels[bad][:5].tolist()}."
            )
        missing = valid[:, None] & (expert_labels == IGNORE_INDEX)
        if missing.any():
            rows = missing.any(dim=1).nonzero()[:5, 0].tolist()
            raise ValueError(
                f"expert_labels are missing ({IGNORE_INDEX}) on rows {rows} whose label is valid; every counted "
                "example needs a label from every expert."
            )
        bad = valid[:, None] & ((expert_labels < 0) | (expert_labels >= K))
        if bad.any():
            raise ValueError(f"expert_labels must lie in [0, {K}), got {expert_labels[bad][:5].tolist()}.")
        return torch.where(valid, labels, 0), expert_labels, valid

    # ------------------------------------------------------------------ public API
    def loss(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        expert_labels: torch.Tensor,
        reduction: str = "mean",
        check: bool = True,
    ) -> torch.Tensor:
        """The surrogate loss.

        Args:
            logits (`torch.Tensor` of shape `[B, K + M]`): class logits then expert logits.
            labels (`torch.Tensor` of shape `[B]`): true classes; rows equal to -100 are ignored.
            expert_labels (`torch.Tensor` of shape `[B]` or `[B, M]`): each expert's predicted class.
            reduction (`str`, *optional*, defaults to `"mean"`): `"mean"` over the counted rows (0 when
                none counts), `"sum"`, or `"none"` for the per-example loss (0 on ignored rows).
            check (`bool`, *optional*, defaults to `True`): check the values of the inputs (finite logits, labels
                in range, no missing expert label); shapes and dtypes are checked either way. `False` skips the
                passes over the data and, on an accelerator, the device syncs they cost: for a training loop over
                data checked once beforehand (as [`DeferralTrainer`] does). The loss then also compiles with
                `torch.compile(fullgraph=True)`.

        Returns:
            `torch.Tensor`: float32 loss.
        """
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
        u = self.check_logits(logits, check_values=check)
        labels, expert_labels, valid = self.check_targets(labels, expert_labels, u.shape[0], u.device, check)
        correct = (expert_labels == labels[:, None]).float()
        weight = valid.float()  # 0 on ignored rows; the kernel weights each row, so a reduction is one sum
        if reduction == "mean":
            weight = weight.div_(weight.sum().clamp_(min=1.0))
        per_example = self._per_example_loss(u, labels, correct, weight)
        return per_example if reduction == "none" else per_example.sum()

    __call__ = loss

    def probabilities(self, logits: torch.Tensor, clip: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Estimates of the class posterior and of each expert's accuracy.

        Args:
            logits (`torch.Tensor` of shape `[B, K + M]`).
            clip (`bool`, *optional*, defaults to `True`): clip the estimates into [0, 1]. Only the unbounded
                estimators (``ssm``, ``sova``) can leave [0, 1]; ``clip=False`` shows them raw.

        Returns:
            `tuple(torch.Tensor, torch.Tensor)`: ``class_probs [B, K]`` and ``expert_accuracy [B, M]``, float32.
        """
        return self._probabilities(self.check_logits(logits), clip)

    def decide(self, logits: torch.Tensor, expert_costs: Any = None, defer_threshold: float = 0.0) -> tuple[torch.Tensor, ...]:
        r"""The deferral decision, the one rule of the model output, the pipeline, the metrics and calibration.

        Defer iff ``max_j (a_j - c_j) - max_y p(y|x) > defer_threshold`` (:meth:`deferral_margin`, on the estimates
        *before clipping*), to ``argmax_j (a_j - c_j)``; the prediction is ``argmax_y u_y``. With zero costs and
        threshold this is exactly the logit rule ``max_j u_{K+j} > max_{y<=K} u_y`` and is evaluated so (no rounding):
        each estimate increases with its own logit over a normaliser shared with its rivals (``asm``:
        ``sigmoid(u - LSE(u_{[K] minus y*}))`` for the top class and the experts; ``ssm``: ``exp(u - LSE(u_{1..K}))``;
        ``sova``: ``a > p_y`` iff ``sigmoid(u_{K+1}) > sigmoid(u_y)`` (one expert), ``sigmoid(u) / sum_k sigmoid(u_k)``
        (several); ``aova``: ``sigmoid(u)``). Clipped at 1, the ``ssm``/``sova`` estimates could tie where the logits do
        not, hence the raw ones: their margin is in units of an unbounded estimator, a probability only below 1.

        Args:
            logits (`torch.Tensor` of shape `[B, K + M]`); expert_costs (sequence of `float`, *optional*): ``c_j``, one
            per expert, zeros when `None`; defer_threshold (`float`, *optional*, defaults to 0.0): margin to defer.

        Returns:
            `tuple`: ``defer [B]`` (bool), ``prediction [B]`` and ``expert [B]`` (meaningful where deferring).
        """
        return self._decide(self.check_logits(logits), self.check_costs(expert_costs), defer_threshold)

    def deferral_margin(self, logits: torch.Tensor, expert_costs: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``max_j (a_j - c_j) - max_y p(y|x)`` on the raw estimates (float64) and ``argmax_j (a_j - c_j)``: see `decide`."""
        return self._margin(self.check_logits(logits), self.check_costs(expert_costs))

    def check_costs(self, expert_costs: Any) -> torch.Tensor | None:
        """Validates ``expert_costs`` with [`check_expert_costs`]: float64 ``[M]``, or `None` when not given or all
        zero (the exact logit rule)."""
        if expert_costs is None:
            return None
        costs = check_expert_costs(expert_costs, self.num_experts)
        return torch.tensor(costs, dtype=torch.float64) if any(costs) else None

    # ------------------------------------------------------------------ on logits already checked (check_logits)
    def _probabilities(self, u: torch.Tensor, clip: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        log_classes, log_experts = self._log_estimates(u)
        if clip:
            log_classes, log_experts = log_classes.clamp(max=0.0), log_experts.clamp(max=0.0)
        return log_classes.exp(), log_experts.exp()

    def _margin(self, u: torch.Tensor, costs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        log_classes, log_experts = self._log_estimates(u.double())  # float64; e^700 keeps raw ssm/sova estimates finite
        return estimate_margin(log_classes.clamp(max=700.0).exp(), log_experts.clamp(max=700.0).exp(), costs)

    def _decide(self, u: torch.Tensor, costs: torch.Tensor | None = None,
                defer_threshold: float = 0.0) -> tuple[torch.Tensor, ...]:
        """`decide` on checked logits and costs (`check_costs`' output: float64 ``[M]`` or `None`)."""
        defer_threshold = check_defer_threshold(defer_threshold)
        class_max, prediction = u[:, : self.num_classes].max(dim=1)
        if costs is None and defer_threshold == 0:
            expert_max, expert = u[:, self.num_classes :].max(dim=1)
            return expert_max > class_max, prediction, expert
        margin, expert = self._margin(u, costs)
        return margin > defer_threshold, prediction, expert

    # ------------------------------------------------------------------ to implement
    def _per_example_loss(self, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor,
                          weight: torch.Tensor) -> torch.Tensor:
        if self.kernel is None:
            raise NotImplementedError(f"{type(self).__name__} sets no `kernel` (a torch.autograd.Function).")
        return self.kernel.apply(u, labels, correct, weight, self.num_classes)

    def _log_estimates(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError
