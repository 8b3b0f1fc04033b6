"""The base class of the deferral surrogates: input validation, ``-100`` masking (of ignored rows and of missing expert
answers), reduction and the decision rule (with the experts available at decision time).

The four surrogates (:mod:`surrogates`) subclass :class:`DeferralSurrogate` and implement only their loss and
estimator. This module only imports ``torch`` and ``.validators``: it is copied next to the model code for remote-code loading.
"""

from __future__ import annotations

from typing import Any

import torch

from .validators import is_finite_number, is_int

IGNORE_INDEX = -100
"""Label value that marks a row to ignore (the Hugging Face padding convention)."""

MAX_ABS_LOGIT = 1e30
"""The largest logit magnitude accepted: beyond it, differences and sums of logits overflow float32 in the losses."""


def as_target_tensor(name: str, values: object, device: torch.device | None) -> torch.Tensor:
    """``torch.as_tensor(values)``, with an error naming ``name`` for ragged lists, strings and other non-numbers: how
    every surrogate (the route-only one too) reads ``labels``, ``expert_labels`` and ``expert_correct``."""
    if isinstance(values, torch.Tensor) and (device is None or values.device == device):
        return values  # what as_tensor returns, without its call: a training step's loss counts its PyTorch calls
    try:
        return torch.as_tensor(values, device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        what = "numbers in [0, 1] (-100: none)" if name == "expert_correct" else "integer class ids"
        raise ValueError(
            f"{name} must be {what} (a tensor, array or list of them, one row per example), got a "
            f"{type(values).__name__} that is not a rectangular array of numbers ({err})."
        ) from None


def estimate_margin(class_probs: torch.Tensor, expert_accuracy: torch.Tensor, costs: torch.Tensor | None = None,
                    available: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The deferral margin on estimates, ``max_j (a_j - c_j) - max_y p_y``, and ``argmax_j (a_j - c_j)``: the one rule
    behind [`DeferralSurrogate.decide`] (defer iff the margin exceeds the threshold), which other code that already
    holds estimates (error-cost sweeps) calls too.

    Args:
        class_probs (`torch.Tensor` `[N, K]`), expert_accuracy (`torch.Tensor` `[N, M]`): the estimates.
        costs (`torch.Tensor` `[M]`, *optional*): one cost per expert; zeros when `None`.
        available (`torch.Tensor` of `bool` `[N, M]`, *optional*): the experts who can answer each input; the max runs
            over those only, and the margin is ``-inf`` (never deferred) where none can. All when `None`.
    """
    best, expert = expert_gains(expert_accuracy, costs, available).max(dim=1)
    return best - class_probs.amax(dim=1), expert


def expert_gains(expert_accuracy: torch.Tensor, costs: torch.Tensor | None = None,
                 available: torch.Tensor | None = None) -> torch.Tensor:
    """``a_j - c_j`` per input and expert, ``-inf`` for an expert who cannot answer: what [`estimate_margin`]
    maximises to pick the expert (arguments as there)."""
    gains = expert_accuracy if costs is None else expert_accuracy - costs.to(expert_accuracy)
    return gains if available is None else gains.masked_fill(~available, float("-inf"))


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
    if any(isinstance(cost, (list, tuple)) or getattr(cost, "ndim", 0) >= 1 for cost in costs):
        raise ValueError(f"{argument} must be a flat sequence of {num_experts} numbers (one per expert), got a nested "
                         f"or ragged one: {costs!r}.")
    if len(costs) != num_experts:
        raise ValueError(f"{argument} must have one cost per expert (num_experts={num_experts}), got {costs!r}.")
    if not all(is_finite_number(cost) and cost >= 0 for cost in costs):
        raise ValueError(f"{argument} must be finite, non-negative numbers, got {costs!r}.")
    return [float(cost) for cost in costs]


def check_defer_threshold(value: Any) -> float:
    """The margin to defer (`defer_threshold`): a finite number, as a float; the one check for the config, the
    decision and the pipeline."""
    if not is_finite_number(value):
        raise ValueError(f"defer_threshold must be a finite number, got {value!r}.")
    return float(value)


class DeferralSurrogate:
    """Base class of the deferral surrogates. Use :func:`get_surrogate` to build one.

    Subclasses set ``kernel`` and implement ``_log_estimates`` (float32; float64 for the margin); the base class does
    the validation, the ``-100`` masking, the reduction and the decision rule (:meth:`decide`).

    Expert targets come as answers (``expert_labels``, class ids; ``-100`` where an expert did not answer), turned
    into ``c_j = [[m_j = y]]``, or directly as ``expert_correct`` (floats in [0, 1]: was the expert right, or a score
    such as a judge's grade or a pass rate; ``-100`` where there is none). A missing answer (``o_j = 0``) removes
    expert ``j``'s terms from that row and keeps the class term and the other experts' terms; a row with a label and
    no answer at all trains the classifier alone. What the estimators then estimate is in each surrogate's docstring.

    Args:
        num_classes (`int`): number of classes ``K`` (at least 2).
        num_experts (`int`, *optional*, defaults to 1): number of experts ``M`` (at least 1).

    Example:

    ```python
    >>> import torch
    >>> from hf_defer.modeling import DeferralSurrogate, get_surrogate
    >>> surrogate = get_surrogate("asm", num_classes=3, num_experts=1)
    >>> isinstance(surrogate, DeferralSurrogate), surrogate.display_name
    (True, 'A-SM')
    >>> logits = torch.tensor([[2.0, 0.0, 0.0, -1.0],   # class 0 clearly ahead of the expert: keep, answer 0
    ...                        [0.0, 0.0, 0.0, 3.0]])   # the expert's logit beats every class logit: defer
    >>> defer, prediction, expert = surrogate.decide(logits)
    >>> defer.tolist(), prediction[0].item(), expert[1].item()
    ([False, True], 0, 0)

    ```
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
    """The `torch.autograd.Function` computing the per-example loss and its gradient (the kernels in `surrogates.py`)."""

    def __init__(self, num_classes: int, num_experts: int = 1) -> None:
        if not is_int(num_classes) or num_classes < 2:
            raise ValueError(
                f"num_classes must be an integer >= 2 (learning to defer needs at least two classes), got {num_classes!r}."
            )
        if not is_int(num_experts) or num_experts < 1:
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
        return logits if logits.dtype == torch.float32 else logits.float()

    def _check_labels(self, labels: Any, batch_size: int, device: torch.device | None,
                      check_values: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``labels`` as long ``[B]`` with ignored rows set to 0, and the mask ``[B]`` of rows that count."""
        labels = self._label_tensor(labels, batch_size, device)
        valid = labels != IGNORE_INDEX
        if check_values:
            bad = valid & ((labels < 0) | (labels >= self.num_classes))
            if bad.any():
                raise ValueError(f"labels must lie in [0, {self.num_classes}) or be {IGNORE_INDEX} (ignored), got "
                                 f"{labels[bad][:5].tolist()}.")
        return torch.where(valid, labels, 0), valid

    def _label_tensor(self, labels: Any, batch_size: int, device: torch.device | None) -> torch.Tensor:
        """``labels`` as long ``[B]``, -100 kept: the checks of `_check_labels` that read only metadata."""
        labels = as_target_tensor("labels", labels, device)
        if labels.dim() == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.dim() != 1 or labels.shape[0] != batch_size:
            raise ValueError(f"labels must have shape [batch] = [{batch_size}], got {tuple(labels.shape)}.")
        if labels.is_floating_point() or labels.dtype == torch.bool:
            raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
        return labels if labels.dtype == torch.long else labels.long()

    def _expert_label_tensor(self, expert_labels: Any, batch_size: int, device: torch.device | None) -> torch.Tensor:
        """``expert_labels`` as long ``[B, M]``, -100 kept: the checks of `check_targets` that read only metadata."""
        expert_labels = self._expert_shape("expert_labels", as_target_tensor("expert_labels", expert_labels, device),
                                           batch_size)
        if expert_labels.is_floating_point() or expert_labels.dtype == torch.bool:
            raise ValueError(f"expert_labels must be integers (class ids, {IGNORE_INDEX} where an expert did not "
                             f"answer), got dtype {expert_labels.dtype}; correctness or scores go in expert_correct.")
        return expert_labels if expert_labels.dtype == torch.long else expert_labels.long()

    def _expert_shape(self, name: str, values: torch.Tensor, batch_size: int) -> torch.Tensor:
        M = self.num_experts
        if values.dim() == 1 and M == 1:
            values = values[:, None]
        if values.dim() != 2 or values.shape != (batch_size, M):
            raise ValueError(
                f"{name} must have shape [batch, num_experts] = [{batch_size}, {M}]"
                f"{' (or [batch] for one expert)' if M == 1 else ''}, got {tuple(values.shape)}."
            )
        return values

    def check_targets(
        self,
        labels: torch.Tensor,
        expert_labels: torch.Tensor,
        batch_size: int,
        device: torch.device | None = None,
        check_values: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Validates the targets of a batch given as the experts' answers.

        ``expert_labels`` holds each expert's class id, or ``-100`` where that expert did not answer (its terms are
        then left out of that row's loss; see [`check_expert_targets`]). Shapes and dtypes are always checked
        (metadata only). ``check_values=False`` skips the checks of the values (labels and answers in range): each is a
        pass over the targets and, on an accelerator, a device sync. Use it only on data checked before, e.g. once for
        a whole dataset as [`DeferralTrainer`] does; an out-of-range label then fails inside the kernel or silently
        counts wrong.

        Returns:
            `tuple`: ``labels`` as long ``[B]`` with ignored rows set to 0, ``expert_labels`` as long
            ``[B, M]`` (``-100`` kept), and the boolean mask ``[B]`` of rows that count (label != -100).
        """
        labels, valid = self._check_labels(labels, batch_size, device, check_values)
        expert_labels = self._expert_label_tensor(expert_labels, batch_size, device)
        if check_values:
            bad = valid[:, None] & (expert_labels != IGNORE_INDEX) & ((expert_labels < 0) | (expert_labels >= self.num_classes))
            if bad.any():
                raise ValueError(f"expert_labels must lie in [0, {self.num_classes}) or be {IGNORE_INDEX} (no answer), "
                                 f"got {expert_labels[bad][:5].tolist()}.")
        return labels, expert_labels, valid

    def check_expert_targets(
        self,
        labels: Any,
        expert_labels: Any = None,
        batch_size: int | None = None,
        device: torch.device | None = None,
        check_values: bool = True,
        *,
        expert_correct: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The targets of the loss and the metrics, from the experts' answers or from their correctness / scores.

        Exactly one of ``expert_labels`` (class ids ``[B, M]``, ``-100``: no answer; through [`check_targets`]) and
        ``expert_correct`` (``[B, M]`` numbers in [0, 1], or bools: whether the expert was right, or a score whose
        expectation the estimator then learns; ``-100``: no answer; NaN is refused, not read as missing) must be given.

        Returns:
            `tuple`: ``labels`` (long ``[B]``, ignored rows set to 0), ``correct`` (float32 ``[B, M]``: the target
            ``c_j``, 0 where not answered), ``observed`` (bool ``[B, M]``: answered) and ``valid`` (bool ``[B]``).
        """
        if (expert_labels is None) == (expert_correct is None):
            raise ValueError("give the experts' targets as expert_labels (their answers) or as expert_correct (whether "
                             "they were right, or a score in [0, 1]), exactly one of the two; got "
                             f"{'both' if expert_labels is not None else 'neither'}.")
        if batch_size is None:
            batch_size = len(labels)
        if expert_correct is None:
            labels, expert_labels, valid = self.check_targets(labels, expert_labels, batch_size, device, check_values)
            return labels, (expert_labels == labels[:, None]).float(), expert_labels != IGNORE_INDEX, valid
        labels, valid = self._check_labels(labels, batch_size, device, check_values)
        scores = self._expert_shape("expert_correct", as_target_tensor("expert_correct", expert_correct, device),
                                    batch_size).float()
        observed = scores != IGNORE_INDEX
        if check_values:
            bad = valid[:, None] & observed & ~((scores >= 0) & (scores <= 1))  # NaN too
            if bad.any():
                raise ValueError(f"expert_correct must lie in [0, 1] (1: right, 0: wrong, or a score) or be "
                                 f"{IGNORE_INDEX} (no answer), got {scores[bad][:5].tolist()}.")
        return labels, torch.where(observed, scores, 0.0), observed, valid

    def check_available(self, available: Any, batch_size: int, device: torch.device | None = None) -> torch.Tensor | None:
        """Validates an availability mask: bool (or 0/1) ``[B, M]``, or ``[M]`` for every row (``[B]`` for one expert).

        Returns:
            `torch.Tensor` or `None`: bool ``[B, M]``, or `None` when ``available`` is `None` (every expert can answer).
        """
        if available is None:
            return None
        try:
            mask = torch.as_tensor(available, device=device)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"available must be a bool mask [batch, num_experts], got {type(available).__name__} that "
                             f"is not a rectangular array ({err}).") from None
        M = self.num_experts
        if mask.dim() == 1 and mask.shape[0] == M:
            mask = mask[None].expand(batch_size, M)
        elif mask.dim() == 1 and M == 1:
            mask = mask[:, None]
        if mask.shape != (batch_size, M):
            raise ValueError(f"available must have shape [batch, num_experts] = [{batch_size}, {M}] (or [{M}] for every "
                             f"row), got {tuple(mask.shape)}.")
        if mask.dtype != torch.bool:
            if mask.is_floating_point() or mask.is_complex() or not ((mask == 0) | (mask == 1)).all():
                raise ValueError(f"available must hold booleans (or 0/1), got dtype {mask.dtype}.")
            mask = mask.bool()
        return mask

    # ------------------------------------------------------------------ public API
    def loss(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        expert_labels: torch.Tensor | None = None,
        reduction: str = "mean",
        check: bool = True,
        *,
        expert_correct: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The surrogate loss.

        Args:
            logits (`torch.Tensor` of shape `[B, K + M]`): class logits then expert logits.
            labels (`torch.Tensor` of shape `[B]`): true classes; rows equal to -100 are ignored.
            expert_labels (`torch.Tensor` of shape `[B]` or `[B, M]`): each expert's predicted class, -100 where the
                expert did not answer (its terms leave that row, the rest stays).
            reduction (`str`, *optional*, defaults to `"mean"`): `"mean"` over the counted rows (0 when
                none counts), `"sum"`, or `"none"` for the per-example loss (0 on ignored rows).
            check (`bool`, *optional*, defaults to `True`): check the values of the inputs (finite logits, labels
                and targets in range); shapes and dtypes are checked either way. `False` skips the
                passes over the data and, on an accelerator, the device syncs they cost: for a training loop over
                data checked once beforehand (as [`DeferralTrainer`] does). The loss then also compiles with
                `torch.compile(fullgraph=True)`. On a CPU, a batch with every row counted and every expert answered
                then builds its targets in one pass or none (same values, less time).
            expert_correct (`torch.Tensor` of shape `[B]` or `[B, M]`, *optional*): instead of `expert_labels`, each
                expert's target itself: 1/0 (right/wrong) or a score in [0, 1], -100 where there is none.

        Returns:
            `torch.Tensor`: float32 loss.
        """
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
        u = self.check_logits(logits, check_values=check)
        holes = False  # known to miss an answer (or to hold some other negative id): the mask goes in unread
        if (not check and (expert_labels is None) != (expert_correct is None) and u.device.type == "cpu"
                and not torch.compiler.is_compiling()):
            # the common training batch: every row counted and every expert answered (no label or target below 0, two
            # sync-free min's on a CPU). Its targets then take one comparison (none for scores), where the general path
            # below takes about eight passes (masks, ignored rows, weights), a fifth of a small-K loss's time; anything
            # else (NaN scores too) goes that way, an answers' min below 0 telling it a mask is needed
            B = u.shape[0]
            plain_labels = self._label_tensor(labels, B, u.device)
            if expert_labels is not None:
                targets = expert_labels = self._expert_label_tensor(expert_labels, B, u.device)
            else:
                targets = expert_correct = self._expert_shape(
                    "expert_correct", as_target_tensor("expert_correct", expert_correct, u.device), B).float()
            lowest = float(targets.min()) if B > 0 else -1.0
            holes = lowest < 0
            if lowest >= 0 and int(plain_labels.min()) >= 0:
                correct = targets if expert_labels is None else torch.eq(
                    targets, plain_labels[:, None], out=torch.empty(B, self.num_experts, device=u.device))
                weight = torch.full((B,), 1.0 / B if reduction == "mean" else 1.0, device=u.device)
                return self._per_example_loss(u, plain_labels, correct, None, weight, reduction != "none")
            labels = plain_labels
        labels, correct, observed, valid = self.check_expert_targets(labels, expert_labels, u.shape[0], u.device,
                                                                     check, expert_correct=expert_correct)
        # 0 on ignored rows; the kernel weights each row, and sums them when asked (a reduction is one dot product)
        weight = valid / valid.sum().clamp_(min=1) if reduction == "mean" else valid.float()
        # a batch with every answer pays nothing for the mask (one cheap pass to know it; skipped, with the mask kept,
        # where it would cost a device sync or break a compiled graph)
        unmasked = ((check or u.device.type == "cpu") and not torch.compiler.is_compiling() and not holes
                    and bool(observed.all()))
        return self._per_example_loss(u, labels, correct, None if unmasked else observed.float(), weight,
                                      reduction != "none")

    __call__ = loss

    def probabilities(self, logits: torch.Tensor, clip: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Estimates of the class posterior and of each expert's accuracy.

        Args:
            logits (`torch.Tensor` of shape `[B, K + M]`): the model's outputs.
            clip (`bool`, *optional*, defaults to `True`): clip the estimates into [0, 1]. Only the unbounded
                estimators (``ssm``, ``sova``) can leave [0, 1]; ``clip=False`` shows them raw.

        Returns:
            `tuple(torch.Tensor, torch.Tensor)`: ``class_probs [B, K]`` and ``expert_accuracy [B, M]``, float32.
        """
        return self._probabilities(self.check_logits(logits), clip)

    def decide(self, logits: torch.Tensor, expert_costs: Any = None, defer_threshold: float = 0.0,
               available: Any = None) -> tuple[torch.Tensor, ...]:
        r"""The deferral decision, the one rule of the model output, the pipeline, the metrics and calibration.

        Defer iff ``max_j (a_j - c_j) - max_y p(y|x) > defer_threshold`` (:meth:`deferral_margin`, on the estimates
        *before clipping*), to ``argmax_j (a_j - c_j)``; the prediction is ``argmax_y u_y``. With zero costs and
        threshold this is exactly the logit rule ``max_j u_{K+j} > max_{y<=K} u_y`` and is evaluated so (no rounding):
        each estimate increases with its own logit over a normaliser shared with its rivals (``asm``:
        ``sigmoid(u - LSE(u_{[K] minus y*}))`` for the top class and the experts; ``ssm``: ``exp(u - LSE(u_{1..K}))``;
        ``sova``: ``a > p_y`` iff ``sigmoid(u_{K+1}) > sigmoid(u_y)`` (one expert), ``sigmoid(u) / sum_k sigmoid(u_k)``
        (several); ``aova``: ``sigmoid(u)``). Clipped at 1, the ``ssm``/``sova`` estimates could tie where the logits do
        not, hence the raw ones: their margin is in units of an unbounded estimator, a probability only below 1.

        With ``available``, only the experts who can answer an input enter its max (``max_{j: A_j}``), and an input
        with none of them is answered by the model; with every expert available this is the rule above, exactly.

        Args:
            logits (`torch.Tensor` of shape `[B, K + M]`): the model's outputs.
            expert_costs (sequence of `float`, *optional*): ``c_j``, one per expert, zeros when `None`.
            defer_threshold (`float`, *optional*, defaults to 0.0): margin to defer.
            available (bool `[B, M]` or `[M]`, *optional*): who can answer each input (all when `None`).

        Returns:
            `tuple`: ``defer [B]`` (bool), ``prediction [B]`` and ``expert [B]`` (meaningful where deferring).

        Example:

        ```python
        >>> import torch
        >>> from hf_defer.modeling import get_surrogate
        >>> aova = get_surrogate("aova", num_classes=2, num_experts=2)
        >>> logits = torch.tensor([[0.0, -1.0, 2.0, 1.0], [0.0, -1.0, 2.0, 1.0]])
        >>> defer, _, expert = aova.decide(logits, available=[[True, True], [False, True]])
        >>> defer.tolist(), expert.tolist()  # the second input goes to expert 1: expert 0 cannot answer it
        ([True, True], [0, 1])

        ```
        """
        u = self.check_logits(logits)
        return self._decide(u, self.check_costs(expert_costs), defer_threshold,
                            self.check_available(available, u.shape[0], u.device))

    def deferral_margin(self, logits: torch.Tensor, expert_costs: Any = None,
                        available: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``max_j (a_j - c_j) - max_y p(y|x)`` on the raw estimates (float64) and ``argmax_j (a_j - c_j)``, the max over
        the available experts (``-inf`` where none is): see `decide`."""
        u = self.check_logits(logits)
        return self._margin(u, self.check_costs(expert_costs), self.check_available(available, u.shape[0], u.device))

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

    def _margin(self, u: torch.Tensor, costs: torch.Tensor | None,
                available: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        log_classes, log_experts = self._log_estimates(u.double())  # float64; e^700 keeps raw ssm/sova estimates finite
        return estimate_margin(log_classes.clamp(max=700.0).exp(), log_experts.clamp(max=700.0).exp(), costs,
                               available)

    def _decide(self, u: torch.Tensor, costs: torch.Tensor | None = None, defer_threshold: float = 0.0,
                available: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """`decide` on checked logits, costs (`check_costs`' output: float64 ``[M]`` or `None`) and availability
        (`check_available`'s: bool ``[B, M]`` or `None`)."""
        defer_threshold = check_defer_threshold(defer_threshold)
        class_max, prediction = u[:, : self.num_classes].max(dim=1)
        if costs is None and defer_threshold == 0:
            experts = u[:, self.num_classes :]
            if available is not None:  # -inf never beats a class logit: no available expert, no deferral
                experts = experts.masked_fill(~available, float("-inf"))
            expert_max, expert = experts.max(dim=1)
            return expert_max > class_max, prediction, expert
        margin, expert = self._margin(u, costs, available)
        return margin > defer_threshold, prediction, expert

    # ------------------------------------------------------------------ to implement
    def _per_example_loss(self, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor,
                          observed: torch.Tensor | None, weight: torch.Tensor, reduce: bool = False) -> torch.Tensor:
        """``weight * loss`` per example ``[B]``, or its sum with ``reduce`` (one autograd node less than ``.sum()``)."""
        if self.kernel is None:
            raise NotImplementedError(f"{type(self).__name__} sets no `kernel` (a torch.autograd.Function).")
        return self.kernel.apply(u, labels, correct, observed, weight, self.num_classes, reduce)

    def _log_estimates(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError
