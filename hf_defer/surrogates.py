"""Surrogate losses for learning to defer, their probability estimators and the decision rule.

A deferral model scores ``K`` classes and ``M`` experts: ``logits`` has shape ``[B, K + M]``, columns
``0..K-1`` are the classes and ``K..K+M-1`` the experts. Each surrogate turns these logits into

* a training loss given the true label ``y`` and the experts' labels ``m_j``,
* estimates of the class posterior ``eta(x)`` and of each expert's accuracy ``Pr(M_j = Y | x)``,
* a decision (:meth:`DeferralSurrogate.decide`): defer iff ``max_j (a_j - c_j) - max_y p(y|x) > threshold``; with zero
  costs and threshold, iff the best expert logit beats every class logit (all four surrogates are maxima-preserving).

The four surrogates are those compared in Cao et al., NeurIPS 2023 ("In Defense of Softmax
Parametrization for Calibrated and Consistent Learning to Defer"):

``asm`` (asymmetric softmax, the paper's proposal) and ``aova`` (asymmetric one-vs-all, Verma & Nalisnick) have
bounded expert-accuracy estimators; ``ssm`` (softmax, Mozannar & Sontag) and ``sova`` (symmetric one-vs-all in
``L_phi``) unbounded ones, clipped into [0, 1] by :meth:`DeferralSurrogate.probabilities`.

This module only imports ``torch``: it is copied next to the model code for remote-code loading.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import torch
import torch.nn.functional as F

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


class DeferralSurrogate:
    """Base class of the deferral surrogates. Use :func:`get_surrogate` to build one.

    Subclasses implement ``_per_example_loss`` and ``_log_estimates`` (float32; float64 for the margin); the base class does
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
        per_example = torch.where(valid, self._per_example_loss(u, labels, correct), 0.0)
        if reduction == "none":
            return per_example
        if reduction == "sum":
            return per_example.sum()
        return per_example.sum() / valid.sum().clamp(min=1)

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
        return self._decide(self.check_logits(logits), expert_costs, defer_threshold)

    def deferral_margin(self, logits: torch.Tensor, expert_costs: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``max_j (a_j - c_j) - max_y p(y|x)`` on the raw estimates (float64) and ``argmax_j (a_j - c_j)``: see `decide`."""
        return self._margin(self.check_logits(logits), self.check_costs(expert_costs))

    def check_costs(self, expert_costs: Any) -> torch.Tensor | None:
        """Validates ``expert_costs`` (``M`` finite, non-negative numbers): float64 ``[M]``, or `None` when not given or
        all zero. A negative cost would pay for asking an expert; it is refused."""
        if expert_costs is None:
            return None
        costs = expert_costs.tolist() if hasattr(expert_costs, "tolist") else expert_costs  # np.ndarray, torch.Tensor
        if isinstance(costs, (str, bytes, dict)) or not hasattr(costs, "__len__"):
            raise TypeError(f"expert_costs must be a sequence of {self.num_experts} numbers, got {type(costs).__name__}.")
        costs = list(costs)
        if len(costs) != self.num_experts:
            raise ValueError(f"expert_costs must have one cost per expert (num_experts={self.num_experts}), got {costs!r}.")
        if not all(_is_finite_number(cost) and cost >= 0 for cost in costs):
            raise ValueError(f"expert_costs must be finite, non-negative numbers, got {costs!r}.")
        return torch.tensor(costs, dtype=torch.float64) if any(costs) else None

    # ------------------------------------------------------------------ on logits already checked (check_logits)
    def _probabilities(self, u: torch.Tensor, clip: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        log_classes, log_experts = self._log_estimates(u)
        if clip:
            log_classes, log_experts = log_classes.clamp(max=0.0), log_experts.clamp(max=0.0)
        return log_classes.exp(), log_experts.exp()

    def _margin(self, u: torch.Tensor, costs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        log_classes, log_experts = self._log_estimates(u.double())  # float64; e^700 keeps raw ssm/sova estimates finite
        gains = log_experts.clamp(max=700.0).exp()
        best, expert = (gains if costs is None else gains - costs.to(gains.device)).max(dim=1)
        return best - log_classes.clamp(max=700.0).exp().amax(dim=1), expert

    def _decide(self, u: torch.Tensor, expert_costs: Any = None, defer_threshold: float = 0.0) -> tuple[torch.Tensor, ...]:
        if not _is_finite_number(defer_threshold):
            raise ValueError(f"defer_threshold must be a finite number, got {defer_threshold!r}.")
        costs = self.check_costs(expert_costs)
        class_max, prediction = u[:, : self.num_classes].max(dim=1)
        if costs is None and defer_threshold == 0:
            expert_max, expert = u[:, self.num_classes :].max(dim=1)
            return expert_max > class_max, prediction, expert
        margin, expert = self._margin(u, costs)
        return margin > float(defer_threshold), prediction, expert

    # ------------------------------------------------------------------ to implement
    def _per_example_loss(self, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _log_estimates(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------------- kernels
# Each loss is a `torch.autograd.Function` with its gradient written out: one log-sum-exp (or softplus) pass over
# the logits in forward and one elementwise pass in backward, where autograd would record half a dozen passes each
# way for the composed formulas. Inputs: ``u`` float32 [B, K + M], ``labels`` long [B] in range (ignored rows set
# to 0 by `check_targets`), ``correct`` float [B, M]; output: the per-example loss [B].


def _asm_rest(u: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, ...]:
    """One log-sum-exp over every class but the top one ``y*``, shifted by the largest of them.

    Returns ``top [B, 1]`` (``max_{y<=K} u_y``), ``top_index [B, 1]`` (``y*``), ``second [B, 1]`` (the largest
    class logit but ``y*``), ``e [B, K + M]`` (``exp(u_k - second)`` on the classes but ``y*``, 0 on ``y*`` and on
    the experts) and ``s [B, 1] = sum e >= 1``, so that ``LSE(u_{[K] minus y*}) = second + log s``. The asymmetric
    softmax denominator ``sum_{y<=K+1} e^{u_y} - max_{y<=K} e^{u_y}`` is thus summed without forming the difference,
    and ``s >= 1`` cannot underflow, whatever the gap between the top class and the others (``K >= 2``).
    """
    top, top_index = u[:, :num_classes].max(dim=1, keepdim=True)
    rest = u.scatter(1, top_index, float("-inf"))
    rest[:, num_classes:] = float("-inf")
    second = rest.detach().amax(dim=1, keepdim=True)  # a shift: the log-sum-exp's gradient does not depend on it
    e = rest.sub_(second).exp_()
    return top, top_index, second, e, e.sum(dim=1, keepdim=True)


class _ASMLoss(torch.autograd.Function):
    """A-SM: ``(top - u_y) + softplus(d) + sum_j BCE(z_j, c_j)``, with ``r = LSE(u_{[K] minus y*})``, ``d = r - top``
    (so ``LSE(u_{[K]}) = top + softplus(d)``, no cancellation) and ``z_j = u_{K+j} - r``.

    Gradient, with ``q = softmax(u_{[K] minus y*})`` (0 at ``y*``), ``p = softmax(u_{[K]})`` (``p_{y*} = sigmoid(-d)``,
    ``p_k = sigmoid(d) q_k`` elsewhere) and ``G = sum_j (sigmoid(z_j) - c_j)``: ``p - onehot(y) - G q`` on the
    classes (``y*`` is piecewise constant, as in the masked formula) and ``sigmoid(z) - c`` on the experts.
    """

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, num_classes: int) -> torch.Tensor:
        top, top_index, second, e, s = _asm_rest(u, num_classes)
        rest = second + s.log()
        d = rest - top
        z = u[:, num_classes:] - rest
        ctx.save_for_backward(e, s, d, z, top_index, labels, correct)
        ctx.num_classes = num_classes
        class_loss = (top - u.gather(1, labels[:, None])) + F.softplus(d)
        expert_loss = F.binary_cross_entropy_with_logits(z, correct, reduction="none").sum(dim=1, keepdim=True)
        return (class_loss + expert_loss)[:, 0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        e, s, d, z, top_index, labels, correct = ctx.saved_tensors
        grad = grad[:, None]
        expert = torch.sigmoid(z) - correct
        out = e * ((torch.sigmoid(d) - expert.sum(dim=1, keepdim=True)) / s * grad)
        out.scatter_(1, top_index, torch.sigmoid(-d) * grad)
        out.scatter_add_(1, labels[:, None], -grad)
        out[:, ctx.num_classes :] = expert * grad
        return out, None, None, None


def _minus_targets(out: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, grad: torch.Tensor,
                   num_classes: int) -> torch.Tensor:
    """``out - grad * w`` in place, for the targets ``w = (onehot(y), c)``: touches ``B (1 + M)`` entries only."""
    out.scatter_add_(1, labels[:, None], -grad)
    out[:, num_classes:] -= correct * grad
    return out


class _SSMLoss(torch.autograd.Function):
    """S-SM: ``-sum_z w_z log softmax(u)_z`` with targets ``w = (onehot(y), c)``; gradient ``(1 + sum_j c_j) p - w``."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, num_classes: int) -> torch.Tensor:
        log_p = F.log_softmax(u, dim=1)
        ctx.save_for_backward(log_p, labels, correct)
        ctx.num_classes = num_classes
        return -(log_p.gather(1, labels[:, None])[:, 0] + (correct * log_p[:, num_classes:]).sum(dim=1))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        log_p, labels, correct = ctx.saved_tensors
        grad = grad[:, None]
        out = log_p.exp().mul_((1.0 + correct.sum(dim=1, keepdim=True)) * grad)
        return _minus_targets(out, labels, correct, grad, ctx.num_classes), None, None, None


def _ova_class_rest(u: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_{k<=K, k != y} xi(-u_k)`` (one softplus pass, the true class zeroed, not subtracted) and ``u_y``."""
    softplus = F.softplus(u[:, :num_classes]).scatter_(1, labels[:, None], 0.0)
    return softplus.sum(dim=1, keepdim=True), u.gather(1, labels[:, None])


class _SOvALoss(torch.autograd.Function):
    """S-OvA: ``sum_z [w_z xi(u_z) + (T - w_z) xi(-u_z)]``, ``w = (onehot(y), c)``, ``T = 1 + sum_j c_j``, every term
    non-negative; gradient ``T sigmoid(u) - w``."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, num_classes: int) -> torch.Tensor:
        rest, true = _ova_class_rest(u, labels, num_classes)
        total = 1.0 + correct.sum(dim=1, keepdim=True)
        experts = u[:, num_classes:]
        loss = total * rest + F.softplus(-true) + (total - 1.0) * F.softplus(true)
        experts = correct * F.softplus(-experts) + (total - correct) * F.softplus(experts)
        loss = loss + experts.sum(dim=1, keepdim=True)
        ctx.save_for_backward(u, labels, correct, total)
        ctx.num_classes = num_classes
        return loss[:, 0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        u, labels, correct, total = ctx.saved_tensors
        grad = grad[:, None]
        out = torch.sigmoid(u).mul_(total * grad)
        return _minus_targets(out, labels, correct, grad, ctx.num_classes), None, None, None


class _AOvALoss(torch.autograd.Function):
    """A-OvA: a binary logistic loss per output with targets ``w = (onehot(y), c)``; gradient ``sigmoid(u) - w``."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, num_classes: int) -> torch.Tensor:
        rest, true = _ova_class_rest(u, labels, num_classes)
        experts = F.binary_cross_entropy_with_logits(u[:, num_classes:], correct, reduction="none")
        ctx.save_for_backward(u, labels, correct)
        ctx.num_classes = num_classes
        return (rest + F.softplus(-true) + experts.sum(dim=1, keepdim=True))[:, 0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        u, labels, correct = ctx.saved_tensors
        grad = grad[:, None]
        out = torch.sigmoid(u).mul_(grad)
        return _minus_targets(out, labels, correct, grad, ctx.num_classes), None, None, None


class ASMSurrogate(DeferralSurrogate):
    r"""Asymmetric softmax surrogate (A-SM), the method of Cao et al. (2023). Consistent, with a bounded estimator.

    With ``y*`` the top class, the asymmetric softmax is ``psi_y = softmax(u_{1..K})_y`` for classes and, for
    expert ``j``, ``psi_{K+j} = e^{u_{K+j}} / (e^{u_{K+j}} + sum_{y<=K, y != y*} e^{u_y})`` (the paper's
    multi-expert extension; for ``M = 1`` it is its Definition 2). The loss is

        ``-log psi_y - sum_j [ c_j log psi_{K+j} + (1 - c_j) log(1 - psi_{K+j}) ]``,  ``c_j = [[m_j = y]]``,

    evaluated as a cross-entropy on ``u_{1..K}`` plus binary cross-entropies on the logits
    ``u_{K+j} - LSE(u_{[K] \\ y*})`` (masked log-sum-exp: finite for any finite logits, in any precision).
    Estimator, for one or many experts: ``eta_y = psi_y`` and ``Pr(M_j = Y | x) = psi_{K+j}``, in
    ``Delta^K x [0, 1]^M`` by construction.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer import get_surrogate
    >>> asm = get_surrogate("asm", num_classes=3)
    >>> logits = torch.tensor([[2.0, 0.0, -1.0, 0.5], [0.0, 0.1, 0.0, 3.0]])
    >>> loss = asm(logits, torch.tensor([0, 1]), torch.tensor([0, 2]))
    >>> class_probs, expert_accuracy = asm.probabilities(logits)
    >>> asm.decide(logits)[0]
    tensor([False,  True])
    ```
    """

    name = "asm"
    display_name = "A-SM"
    description = "asymmetric softmax"
    citation = "Cao et al., NeurIPS 2023"
    bounded = True

    def _per_example_loss(self, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        return _ASMLoss.apply(u, labels, correct, self.num_classes)

    def _log_estimates(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        K = self.num_classes
        _, _, second, _, s = _asm_rest(u, K)
        return F.log_softmax(u[:, :K], dim=1), F.logsigmoid(u[:, K:] - (second + s.log()))


class SSMSurrogate(DeferralSurrogate):
    r"""Softmax cross-entropy surrogate (S-SM) of Mozannar & Sontag (2020); multi-expert form of Verma et al. (2023).

    Loss: ``-log softmax(u)_y - sum_j c_j log softmax(u)_{K+j}``, softmax over all ``K + M`` outputs.
    At the optimum ``softmax(u) = (eta, a) / (1 + sum_j a_j)`` with ``a_j = Pr(M_j = Y | x)``, so the
    estimator is ``eta_y = p_y / (1 - sum_j p_{K+j}) = softmax(u_{1..K})_y`` and
    ``a_j = p_{K+j} / (1 - sum_j p_{K+j}) = exp(u_{K+j} - LSE(u_{1..K}))`` (for ``M = 1``,
    ``p_{K+1} / (1 - p_{K+1})``). The expert estimate is unbounded above (Theorem 1 of the paper); it is
    clipped to [0, 1] unless ``probabilities(..., clip=False)``.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer import get_surrogate
    >>> ssm = get_surrogate("ssm", num_classes=2)
    >>> ssm.probabilities(torch.tensor([[0.0, 0.0, 2.0]]), clip=False)[1]  # exp(2 - log 2) > 1
    tensor([[3.6945]])
    ```
    """

    name = "ssm"
    display_name = "S-SM"
    description = "softmax cross-entropy over classes and experts"
    citation = "Mozannar & Sontag, 2020"
    bounded = False

    def _per_example_loss(self, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        return _SSMLoss.apply(u, labels, correct, self.num_classes)

    def _log_estimates(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        K = self.num_classes
        classes = u[:, :K]
        return F.log_softmax(classes, dim=1), u[:, K:] - torch.logsumexp(classes, dim=1, keepdim=True)


class SOvASurrogate(DeferralSurrogate):
    r"""Symmetric one-vs-all surrogate (S-OvA): the ``L_phi`` construction of Charusaie et al. with the OvA logistic loss.

    Loss: ``l(u, y) + sum_j c_j l(u, K+j)`` with ``l(u, z) = xi(u_z) + sum_{z' != z} xi(-u_{z'})`` over all
    ``K + M`` outputs and ``xi(t) = log(1 + e^{-t})``. Collecting terms, output ``z'`` carries
    ``w_{z'} xi(u_{z'}) + (T - w_{z'}) xi(-u_{z'})`` with ``w = (onehot(y), c)`` and ``T = 1 + sum_j c_j``, which is
    how it is computed (every term non-negative, no cancellation). At the optimum
    ``sigmoid(u) = (eta, a) / (1 + sum_j a_j)``.

    Estimator, ``M = 1``: ``eta_y = sigmoid(u_y) / (1 - sigmoid(u_{K+1})) = sigmoid(u_y) (1 + e^{u_{K+1}})`` and
    ``a = e^{u_{K+1}}``. ``M > 1``: ``eta_y = sigmoid(u_y) / sum_{k<=K} sigmoid(u_k)`` and
    ``a_j = sigmoid(u_{K+j}) / sum_{k<=K} sigmoid(u_k)`` (the class mass estimates ``1 / (1 + sum_j a_j)``).
    Both are unbounded above and clipped to [0, 1] unless ``probabilities(..., clip=False)``.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer import get_surrogate
    >>> sova = get_surrogate("sova", num_classes=3)
    >>> loss = sova(torch.zeros(2, 4), torch.tensor([0, 2]), torch.tensor([0, 1]))
    ```
    """

    name = "sova"
    display_name = "S-OvA"
    description = "symmetric one-vs-all logistic loss in the consistent L_phi construction"
    citation = "baseline of Cao et al., NeurIPS 2023"
    bounded = False

    def _per_example_loss(self, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        return _SOvALoss.apply(u, labels, correct, self.num_classes)

    def _log_estimates(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        K = self.num_classes
        log_sig = F.logsigmoid(u)
        if self.num_experts == 1:
            return log_sig[:, :K] + F.softplus(u[:, K:]), u[:, K:]
        log_class_mass = torch.logsumexp(log_sig[:, :K], dim=1, keepdim=True)
        return log_sig[:, :K] - log_class_mass, log_sig[:, K:] - log_class_mass


class AOvASurrogate(DeferralSurrogate):
    r"""Asymmetric one-vs-all surrogate (A-OvA) of Verma & Nalisnick (2022). Consistent, with a bounded estimator.

    Loss: ``xi(u_y) + sum_{k<=K, k != y} xi(-u_k) + sum_j [ c_j xi(u_{K+j}) + (1 - c_j) xi(-u_{K+j}) ]``, i.e. a
    binary logistic loss per output with targets ``(onehot(y), c)``. Estimator, for one or many experts:
    ``eta_y = sigmoid(u_y)`` (one-vs-all: the class estimates need not sum to 1) and
    ``Pr(M_j = Y | x) = sigmoid(u_{K+j})``.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer import get_surrogate
    >>> aova = get_surrogate("aova", num_classes=3, num_experts=2)
    >>> loss = aova(torch.zeros(1, 5), torch.tensor([1]), torch.tensor([[1, 0]]))
    >>> round(loss.item(), 4)  # five binary log losses at 0: 5 log 2
    3.4657
    ```
    """

    name = "aova"
    display_name = "A-OvA"
    description = "asymmetric one-vs-all"
    citation = "Verma & Nalisnick, 2022"
    bounded = True

    def _per_example_loss(self, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        return _AOvALoss.apply(u, labels, correct, self.num_classes)

    def _log_estimates(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_sig = F.logsigmoid(u)
        return log_sig[:, : self.num_classes], log_sig[:, self.num_classes :]


_REGISTRY: dict[str, type[DeferralSurrogate]] = {
    cls.name: cls for cls in (ASMSurrogate, SSMSurrogate, SOvASurrogate, AOvASurrogate)
}

SURROGATES: tuple[str, ...] = tuple(_REGISTRY)
"""Names accepted by :func:`get_surrogate` (the one list of surrogates); ``"asm"`` is the default."""


def surrogate_class(name: str) -> type[DeferralSurrogate]:
    """The class of a surrogate, for its ``display_name``, ``description``, ``citation`` and ``bounded``.

    Example:

    ```python
    >>> from hf_defer.surrogates import surrogate_class
    >>> surrogate_class("ssm").display_name, surrogate_class("ssm").bounded
    ('S-SM', False)

    ```
    """
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"surrogate must be one of {SURROGATES}, got {name!r}.")
    return _REGISTRY[name]


def get_surrogate(name: str, num_classes: int, num_experts: int = 1) -> DeferralSurrogate:
    """Builds a deferral surrogate by name.

    Args:
        name (`str`): one of ``"asm"`` (asymmetric softmax, the default elsewhere), ``"ssm"``, ``"sova"``, ``"aova"``.
        num_classes (`int`): number of classes ``K`` (at least 2).
        num_experts (`int`, *optional*, defaults to 1): number of experts ``M``.

    Returns:
        [`DeferralSurrogate`]: callable as ``(logits, labels, expert_labels) -> mean loss``, with
        ``.probabilities(logits)`` and ``.decide(logits)``.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer import get_surrogate
    >>> surrogate = get_surrogate("asm", num_classes=3, num_experts=1)
    >>> logits = torch.randn(4, 4, requires_grad=True)
    >>> loss = surrogate(logits, torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 1, 1]))
    >>> loss.backward()
    >>> defer, prediction, expert = surrogate.decide(logits)
    ```
    """
    return surrogate_class(name)(num_classes, num_experts)
