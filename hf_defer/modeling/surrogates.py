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

Missing answers and scores. Expert ``j``'s target ``c_j`` may be ``[[m_j = y]]``, whether it was right, or a score
``q_j`` in [0, 1] (a judge's grade, a pass rate); where it did not answer (``o_j = 0``) its terms leave the row. Write
``pi_j(x) = Pr(o_j = 1 | x)``. Answers are *missing at random* when ``o_j`` is independent of ``(y, m_j)`` given ``x``.

* ``asm`` and ``aova`` give each expert its own binary log loss on its own logit, times ``o_j``. Its conditional risk
  is ``pi_j(x) BCE(a_j, E[c_j | x, o_j = 1]) + const``, minimised at ``a_j = E[c_j | x, o_j = 1]`` wherever
  ``pi_j(x) > 0``, whatever the other terms do: a proper loss weighted by whether it was observed. At random, that is
  ``Pr(M_j = Y | x)`` (or ``E[q_j | x]``): the estimator stays consistent. Otherwise (an annotator who picks the easy
  inputs) it is the expert's accuracy *on the inputs it chooses to answer*, not on all of them.
* ``ssm`` and ``sova`` are linear in ``c``: masking sets the target weight of output ``K + j`` to 0 while the logit
  ``u_{K+j}`` stays in the shared normaliser (the softmax's denominator; ``T`` of ``sova``). Their minimiser is that of
  the full loss with ``a_j`` replaced by ``E[o_j c_j | x]``, so their expert estimate becomes
  ``pi_j(x) Pr(M_j = Y | x)`` at random: the chance that the expert answers *and* is right, biased low by the
  answer rate; the class estimates are unaffected. Prefer ``asm`` / ``aova`` for experts who answer some inputs only.
* A soft target enters each binary log loss as its target: ``E[BCE(a, q) | x] = BCE(a, E[q | x]) + const``, minimised
  at ``a = E[q | x]``; the symmetric losses, linear in ``c``, likewise put ``E[q_j | x]`` in place of ``a_j``. The
  estimate is the expected score, and ``q`` in {0, 1} is the hard case exactly.

This module holds the four surrogates and their registry; their base class (validation, masking, reduction, the
decision rule) is in ``surrogate_base.py``; their autograd kernels are below. Both only import ``torch`` and each
other: they are copied next to the model code for remote-code loading.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .surrogate_base import IGNORE_INDEX, MAX_ABS_LOGIT, DeferralSurrogate
from .surrogate_routing import RouteOnlySurrogate, is_route_only

__all__ = [
    "IGNORE_INDEX", "MAX_ABS_LOGIT", "SURROGATES", "AOvASurrogate", "ASMSurrogate", "DeferralSurrogate",
    "RouteOnlySurrogate", "SOvASurrogate", "SSMSurrogate", "get_surrogate", "surrogate_class", "surrogate_for_config",
]


# The autograd kernels: one ``torch.autograd.Function`` per loss.
#
# Each loss is a `torch.autograd.Function` with its gradient written out: one log-sum-exp (or softplus) pass over
# the logits in forward and one elementwise pass in backward, where autograd would record half a dozen passes each
# way for the composed formulas. Each allocates one [B, K + M] tensor: the forward computes into it and the backward
# writes the gradient over it and returns it (`_keep_buffer`), where cross-entropy allocates three; on a CPU a fresh
# large tensor costs about a pass (its pages are faulted in).
#
# Inputs: ``u`` float32 [B, K + M], ``labels`` long [B] in range (ignored rows set to 0 by `check_targets`),
# ``correct`` float [B, M] (expert ``j``'s target ``c_j`` in [0, 1]: ``[[m_j = y]]``, a correctness or a score; 0
# where the expert did not answer), ``observed`` float [B, M] (``o_j``: 1 where expert ``j`` answered, 0 where not;
# None when every expert answered in every row: no mask to apply), ``weight`` float [B] (0 on ignored rows, ``1 / n``
# for a mean), ``reduce`` bool; output: the weighted per-example loss ``weight * loss`` [B], or with ``reduce`` its
# sum (a dot product with ``weight``), the reduced loss. Weighting and summing inside the kernel spare the masking,
# the division and the sum their own autograd nodes: at small batches the cost of a loss is the number of PyTorch
# calls, not the passes over the logits.
#
# A missing answer removes that expert's terms from the row and nothing else: every expert term carries the factor
# ``o_j``. In the symmetric losses (S-SM, S-OvA) expert ``j`` enters only through ``c_j`` (a weight of the target
# ``K + j``), so ``c_j = 0`` on a missing answer is the mask; the asymmetric ones (A-SM, A-OvA) weight expert ``j``'s
# binary term by ``o_j``. With every answer present (``o = 1``) the multiplications by 1 are exact: the loss and its
# gradient are bit for bit those without a mask.


def _fill_at(x: torch.Tensor, index: torch.Tensor, value: float) -> torch.Tensor:
    """``x.scatter_(1, index, value)`` (one entry per row, ``index`` ``[B, 1]``), with the value as an expanded tensor:
    PyTorch's CPU scatter of a scalar takes a path three times slower (20 against 6 µs at B = 4,096)."""
    return x.scatter_(1, index, torch.full((1, 1), value, dtype=x.dtype, device=x.device).expand(index.shape[0], 1))


_LOG2E = 1.4426950408889634
"""``log2(e)``: ``exp(x) = exp2(x log2 e)``. PyTorch's CPU ``exp2`` is a vectorised pass several times faster than its
``exp``; the extra rounding of the product costs a relative error of ``|x| 6e-8`` (2e-7 at ``x = -4``, where the term
is already 2 % of the largest), on terms ``exp(x) <= 1`` added to a sum ``>= 1``."""


_TINY_REST = 1e-25
"""Below this ``sum_{k != y*} exp(u_k - top)`` (a gap past about 57 between the top class and the next), A-SM's rest
is summed shifted by the next class instead of the top one (`_asm_rest`): above it every term that matters is a
normal float32, so both shifts give the same sum to rounding."""


_FAST_REST_MIN_SIZE = 16384
"""From this many class logits (``B K``) A-SM's rest takes `_asm_rest`'s fast CPU way; below it the general way's
fewer PyTorch calls cost less than ``max``'s index (measured: 13 against 21 µs at B = 64, K = 3; 45 against 34 µs at
B = 256, K = 100; 720 against 300 µs at B = 4,096, K = 100)."""


def _asm_rest(classes: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """One log-sum-exp over every class but the top one ``y*`` (the first class at the top, ``max``'s index).

    Returns ``top [B, 1]`` (``max_{y<=K} u_y``), ``top_index [B, 1]`` (``y*``), a shift ``c [B, 1]``, ``e [B, K]``
    (``exp(u_k - c)`` on the classes but ``y*``, 0 on ``y*``; written into ``out`` when given) and ``s = sum e``
    ``[B, 1]``, so that ``LSE(u_{[K] minus y*}) = c + log s``. The asymmetric softmax denominator ``sum_{y<=K+1}
    e^{u_y} - max_{y<=K} e^{u_y}`` is thus summed without forming the difference (``y*``'s term is zeroed, not
    subtracted), and ``s`` does not underflow, whatever the gap between the top class and the others (``K >= 2``).

    On a CPU (eager, from `_FAST_REST_MIN_SIZE` logits on) the shift is ``top`` and ``y*`` comes from the 0/1 mask of
    the classes at the top times ``K + k``: ``K + y*`` where one class is at the top (an exact integer in float),
    ``>= 2K`` where several tie and ``0`` for a NaN row. That is seven passes over ``[B, K]``, all in ``out``:
    ``amax``, the comparison, that product, the shift, its scaling, ``exp2`` and the sum (``max``'s index alone is a
    slow, unvectorised pass there, eight times ``amax``). A batch with a tie or a NaN row, or with a row whose rest lies
    so far below the top that its sum nears float32's underflow (`_TINY_REST`), and every batch on other devices or in
    a compiled graph, takes the general way: ``y*`` from ``max`` and the shift ``c`` the largest class but ``y*`` (its
    term is 1, so ``s >= 1``).
    """
    B, K = classes.shape
    e = torch.empty_like(classes) if out is None else out
    fast = classes.device.type == "cpu" and not torch.compiler.is_compiling() and B * K >= max(_FAST_REST_MIN_SIZE, 1)
    if not fast:
        top, top_index = classes.max(dim=1, keepdim=True)
    else:
        top = classes.amax(dim=1, keepdim=True)
        at_top = torch.eq(classes, top, out=e)
        code = at_top @ torch.arange(K, 2 * K, dtype=classes.dtype)  # K + y*; >= 2K on a tie, 0 on a NaN row
        low, high = torch.aminmax(code)
        if float(low) >= K and float(high) < 2 * K:
            top_index = code.sub_(K).long()[:, None]
            torch.sub(classes, top, out=e).mul_(_LOG2E).exp2_()  # 1 at y*, zeroed next: no cancellation
            s = _fill_at(e, top_index, 0.0).sum(dim=1, keepdim=True)
            if float(s.amin()) >= _TINY_REST:
                return top, top_index, top, e, s
        top_index = classes.max(dim=1, keepdim=True)[1]
    e = _fill_at(e.copy_(classes), top_index, float("-inf"))
    second = e.amax(dim=1, keepdim=True)  # a shift: the log-sum-exp's gradient does not depend on it
    e.sub_(second).mul_(_LOG2E).exp2_()  # 0 at y* (exp2(-inf)); 1 at the second
    return top, top_index, second, e, e.sum(dim=1, keepdim=True)


_NARROW_WIDTH = 8
"""Up to this many outputs (``K + M``), A-SM computes on CPU with one example per column (the logits transposed, ``[K + M,
B]``). PyTorch's CPU reductions, broadcasts and transcendental functions along a last dimension of a few elements take
the slow, unvectorised paths (``max`` over 3 classes costs as much as ``log_softmax`` over the whole batch); along
``B`` contiguous elements they are single vector passes. The columns also find ``y*`` with comparisons (a one-hot row)
where ``max``'s index and ``scatter`` are slow along a short dimension. The transpose costs one copy each way
(`_transposed`), which wide logits would not repay, nor would a small batch (below `_NARROW_MIN_BATCH` rows the two
copies cost more than they save)."""

_NARROW_MIN_BATCH = 1024

_FAR = 3e38
"""Subtracted from ``y*``'s logit to leave it out of the rest's maximum and sum: below any other accepted logit (within
`MAX_ABS_LOGIT`) and finite, unlike ``-inf``, so that the one-hot's zeros times it stay 0."""


def _transposed(x: torch.Tensor) -> torch.Tensor:
    """``x.t().contiguous()`` of a contiguous 2-D ``x``, copied as ``[W, B, 1]``: PyTorch's CPU copy of a 2-D transpose
    with a short side takes a path about twice as slow as the same copy with a trailing dimension of 1."""
    if not x.is_contiguous():
        return x.t().contiguous()
    rows, cols = x.shape
    return x.as_strided((cols, rows, 1), (1, cols, 1)).contiguous().view(cols, rows)


def _keep_buffer(ctx, buffer: torch.Tensor | None) -> None:
    """Keeps ``buffer``, a ``[B, K + M]`` tensor the forward allocated, for the backward to write the gradient into
    (`_take_buffer`): a fresh large tensor costs, on a CPU, as much as a pass or two over it (its pages are faulted in).
    Held on ``ctx`` rather than saved: the backward overwrites it, which a saved tensor's version check would refuse on
    a second backward. A compiled graph keeps nothing (no in-place write into a saved tensor there)."""
    ctx.buffer = None if torch.compiler.is_compiling() else buffer


def _take_buffer(ctx) -> torch.Tensor | None:
    """The buffer `_keep_buffer` kept, handed over once and released from ``ctx`` (so that autograd can make it the
    ``.grad`` without a copy); `None` for a second backward through the same graph (``retain_graph=True``,
    ``gradcheck``), which must not write again into the gradient the first one returned, and in a compiled graph."""
    buffer, ctx.buffer = ctx.buffer, None
    return buffer


class _ASMLoss(torch.autograd.Function):
    """A-SM: ``(top - u_y) + softplus(r - top) + sum_j o_j BCE(a_j, c_j)`` with ``r = LSE(u_{[K] minus y*})`` and
    ``a_j = u_{K+j} - r``: ``top + softplus(r - top) = LSE(u_{[K]})``, so the class part is ``LSE(u_{[K]}) - u_y`` with
    no cancellation, and ``BCE(a_j, c_j) = softplus(a_j) - c_j a_j`` is expert ``j``'s term (as accurate as PyTorch's
    ``binary_cross_entropy_with_logits``: an absolute error of a few ulp of ``a_j``).

    Gradient, with ``g_j = o_j (sigmoid(a_j) - c_j)`` (the expert terms' own), ``p_0 = sigmoid(r - top)`` and ``q =
    softmax(u_{[K] minus y*})`` (0 at ``y*``): ``(p_0 - sum_j g_j) q`` on the classes (through ``r``), plus
    ``1 - p_0`` at ``y*`` and ``-1`` at ``y`` (``y*`` is piecewise constant, as in the masked formula), and ``g_j``
    on the experts; all times the row's weight and output gradient. A missing answer (``o_j = 0``) zeroes ``g_j``: its
    logit gets no gradient from that row and ``r`` none through it.

    The arithmetic runs along the class axis ``d`` of ``x``: ``x = u`` (``d = 1``), or, for narrow logits on CPU (see
    `_NARROW_WIDTH`, `_NARROW_MIN_BATCH`; not under ``torch.compile``), ``x = u.T`` made contiguous (``d = 0``), where
    ``y*`` (``top_index``) is a one-hot row instead of ``max``'s index, set to ``-_FAR`` by an addition instead of to
    ``-inf`` by ``scatter``; both give the same values. Per call the cost is mostly the number of PyTorch calls (a few
    microseconds each on a CPU), hence no ``cat`` or slice more than needed. In the row layout `_asm_rest` computes
    ``e = exp(u - shift)`` (``y*`` zeroed) into the class columns of a ``[B, K + M]`` buffer, which the backward
    scales by ``(p_0 - sum_j g_j) / s`` in place (``q = e / s``), completes at ``y*``, ``y`` and the expert columns,
    and returns as the whole gradient: one allocation for forward and backward.
    """

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, observed: torch.Tensor,
                weight: torch.Tensor, num_classes: int, reduce: bool = False) -> torch.Tensor:
        (B, W), K, row_weight = u.shape, num_classes, weight
        if (W <= _NARROW_WIDTH and B >= _NARROW_MIN_BATCH and u.device.type == "cpu"
                and not torch.compiler.is_compiling()):  # one example per column
            d, x, labels, weight, correct = 0, _transposed(u), labels.view(1, B), weight.view(1, B), correct.t()
            observed = None if observed is None else observed.t()
            classes, experts = x[:K], x[K:]
            top = classes.amax(dim=0, keepdim=True)
            # y*, the first class at the top (max's index), as a one-hot row; where a column has a tie for the top (a
            # sum past one per column: no device sync on a CPU), only the first one is y*, the others stay in the rest
            top_index = torch.eq(classes, top, out=torch.empty_like(classes))
            if float(top_index.sum()) > B + 0.5:
                before = top_index.cumsum(dim=0).sub_(top_index)  # how many classes before k are at the top
                top_index = torch.gt(top_index, before, out=before)
            rest = classes.add(top_index, alpha=-_FAR)
            second = rest.amax(dim=0, keepdim=True)  # a shift: the log-sum-exp's gradient does not depend on it
            # exp(-80) ~ 2e-35 in place of exp(-inf) = 0 at y* (and under any smaller term): exp's vectorised path does
            # not take inputs that far out, and s >= 1 absorbs them (1 + 2e-35 == 1 in float32): the loss is unchanged
            e = rest.sub_(second).clamp_(min=-80.0).exp_()
            s = e.sum(dim=0, keepdim=True)  # >= 1: cannot underflow, whatever the gap to the top class
            buffer = None
        else:  # one example per row; a compiled graph picks its own layout
            d, labels, weight = 1, labels[:, None], weight[:, None]
            classes, experts = u[:, :K], u[:, K:]
            # e is written into the class columns of the buffer the backward takes as its whole gradient
            buffer = u.new_empty(B, W)
            top, top_index, second, e, s = _asm_rest(classes, buffer[:, :K])  # second: the shift
        r = s.log().add_(second)
        a, minus_a_top = experts - r, r - top
        bce = F.softplus(a).addcmul_(correct, a, value=-1.0)
        if observed is not None:
            bce.mul_(observed)
        loss = (top - classes.gather(d, labels)).add_(F.softplus(minus_a_top))
        loss = loss.add_(bce if W - K == 1 else bce.sum(dim=d, keepdim=True)).view(B)
        _keep_buffer(ctx, buffer)
        kept = d == 1 and ctx.buffer is not None  # e lives in the kept buffer, which the backward overwrites
        ctx.save_for_backward(a, minus_a_top, correct, observed, None if kept else e, s, weight, top_index, labels, u)
        ctx.d = d
        return loss.dot(row_weight) if reduce else loss.mul_(row_weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, minus_a_top, correct, observed, e, s, weight, top_index, labels, u = ctx.saved_tensors
        d = ctx.d
        scale = weight * (grad if d == 0 or grad.dim() == 0 else grad[:, None])
        g = torch.sigmoid(a).sub_(correct).mul_(scale)
        if observed is not None:
            g.mul_(observed)
        p_top = torch.sigmoid(minus_a_top).mul_(scale)  # (1 - sigmoid(a_0)) scale
        factor = (p_top - (g if g.shape[d] == 1 else g.sum(dim=d, keepdim=True))).div_(s)
        top_term = scale - p_top  # sigmoid(a_0) scale
        if d == 0:  # top_index: the one-hot row of y*
            out = e * factor
            out.addcmul_(top_index, top_term).scatter_add_(0, labels, scale.neg())
            return _transposed(torch.cat([out, g])), None, None, None, None, None, None
        whole = _take_buffer(ctx)
        if e is not None:  # a compiled graph (e saved, nothing kept): out of place; the graph fuses the cat
            out = (e * factor).scatter_add_(1, top_index, top_term).scatter_add_(1, labels, scale.neg())
            return torch.cat([out, g], dim=1), None, None, None, None, None, None
        # the gradient written over e, in the buffer that holds it: no new [B, K + M] tensor, no cat. A second backward
        # through the graph (retain_graph) finds the buffer handed out and computes e again, into a new one
        K = u.shape[1] - g.shape[1]
        if whole is None:
            whole = u.new_empty(u.shape)
            _asm_rest(u[:, :K], whole[:, :K])
        whole[:, :K].mul_(factor).scatter_add_(1, top_index, top_term).scatter_add_(1, labels, scale.neg())
        whole[:, K:] = g
        return whole, None, None, None, None, None, None


def _minus_targets(out: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, scale: torch.Tensor,
                   num_classes: int) -> torch.Tensor:
    """``out - scale * w`` in place, for the targets ``w = (onehot(y), c)``: touches ``B (1 + M)`` entries only."""
    out.scatter_add_(1, labels[:, None], scale.neg())
    out[:, num_classes:].sub_(correct * scale)
    return out


class _SSMLoss(torch.autograd.Function):
    """S-SM: ``-sum_z w_z log softmax(u)_z`` with targets ``w = (onehot(y), c)``; gradient ``(1 + sum_j c_j) p - w``.
    ``c_j = 0`` on a missing answer (``observed`` is not read): the expert's term is gone, its logit stays in the
    softmax's denominator. Forward: one ``log_softmax`` pass; backward: ``p = exp2(log p log2 e)`` written over
    ``log p`` (the gradient buffer, `_keep_buffer`; see `_LOG2E` for the rounding) and one row scaling."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, observed: torch.Tensor,
                weight: torch.Tensor, num_classes: int, reduce: bool = False) -> torch.Tensor:
        log_p = F.log_softmax(u, dim=1)
        _keep_buffer(ctx, log_p)
        ctx.save_for_backward(None if ctx.buffer is not None else log_p, labels, correct, weight, u)
        ctx.num_classes = num_classes
        loss = log_p.gather(1, labels[:, None])[:, 0].add_((correct * log_p[:, num_classes:]).sum(dim=1))
        return (loss.dot(weight) if reduce else loss.mul_(weight)).neg_()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        log_p, labels, correct, weight, u = ctx.saved_tensors
        scale = (weight * grad)[:, None]
        kept = _take_buffer(ctx)
        if kept is not None:  # log p, overwritten by p = exp2(log p log2 e): a quarter of exp's time on a CPU
            out = kept.mul_(_LOG2E).exp2_()
        else:  # a compiled graph (log p saved), or a second backward (log p overwritten by the first: computed again)
            out = F.log_softmax(u, dim=1).mul_(_LOG2E).exp2_() if log_p is None else log_p.mul(_LOG2E).exp2_()
        out.mul_(correct.sum(dim=1, keepdim=True).add_(1.0).mul_(scale))
        return _minus_targets(out, labels, correct, scale, ctx.num_classes), None, None, None, None, None, None


_PRODUCT_CHUNK = 120
"""The OvA losses sum ``xi(-u_k) = relu(u_k) - log sigmoid(|u_k|)`` over many classes as logs of products of
``sigmoid(|u_k|)`` in ``[1/2, 1]``, this many at a time (``>= 2^-120``, a normal float32: no underflow), so that one
``log`` per chunk replaces one per logit (`_softplus_rest`)."""

_PRODUCT_MIN_CLASSES = 64
"""From this many classes on the OvA losses take the products; below, one softplus pass costs less than their calls."""


def _softplus_rest(u: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, ...]:
    """``sum_{k<=K, k != y} xi(-u_k)`` (``xi(-t) = softplus(t)``), in one buffer ``[B, K + M]`` that the backward then
    takes as its gradient (`_keep_buffer`); also ``xi(-u_y)``, ``u_y`` and ``xi(-u_{K+j})`` ``[B, M]``.

    The true class is left out by setting its entry to the sum's neutral element, not by subtracting it: no
    cancellation. Below `_PRODUCT_MIN_CLASSES` classes: one softplus pass and a row sum. From it on, PyTorch's softplus
    (an accurate ``log1p(exp)``) costs about as much as all of cross-entropy, so the sum is taken as
    ``sum relu(u_k) - sum_chunks log prod sigmoid(|u_k|)``: a clamp and a sum, then ``|u|``, a sigmoid and one product
    per `_PRODUCT_CHUNK` classes, all fast vectorised passes on a CPU, and one log per product. Each ``sigmoid(|u_k|)``
    carries its rounding near 1 (an absolute ``2^-24``), so a term below ~``1e-7`` counts to that absolute precision
    rather than to its own relative one (the log-sum-exp of cross-entropy rounds the same way near a confident row);
    a product of up to 120 factors adds up to 120 roundings of ``2^-24`` relative to it (at most ``7e-6`` absolute on
    its log, about ``1e-6`` typically: float32's own rounding of a sum of 120 terms of order 1). So the rest is exact
    to about ``1e-6 sqrt(K / 120)`` absolutely (at K = 1,000 and every other class 12 to 20 below 0, a rest of 3e-3
    within 5e-6), where the softplus pass had that relative error. Every term is non-negative either way; the
    gradient (a sigmoid) is not affected."""
    y = labels[:, None]
    K = num_classes
    true = u.gather(1, y)[:, 0]
    if K < _PRODUCT_MIN_CLASSES:
        buffer = F.softplus(u)
        classes = buffer[:, :K]
        plus_true = classes.gather(1, y)[:, 0]
        return buffer, _fill_at(classes, y, 0.0).sum(dim=1), plus_true, true, buffer[:, K:]
    buffer = torch.clamp(u, min=0.0)
    classes = buffer[:, :K]
    rest = _fill_at(classes, y, 0.0).sum(dim=1)
    torch.abs(u, out=buffer).sigmoid_()
    _fill_at(classes, y, 1.0)
    n = K // _PRODUCT_CHUNK
    rest.sub_(classes[:, n * _PRODUCT_CHUNK:].prod(dim=1).log_())  # the last K mod 120 classes
    if n:
        rest.sub_(classes[:, :n * _PRODUCT_CHUNK].unflatten(1, (n, _PRODUCT_CHUNK)).prod(dim=2).log_().sum(dim=1))
    return buffer, rest, F.softplus(true), true, F.softplus(u[:, K:])


def _sigmoid_into_buffer(ctx, u: torch.Tensor) -> torch.Tensor:
    """``sigmoid(u)``, written into the kept buffer when there is one (`_take_buffer`)."""
    buffer = _take_buffer(ctx)
    return torch.sigmoid(u) if buffer is None else torch.sigmoid(u, out=buffer)


class _SOvALoss(torch.autograd.Function):
    """S-OvA: ``sum_z [w_z xi(u_z) + (T - w_z) xi(-u_z)]``, ``w = (onehot(y), c)``, ``T = 1 + sum_j c_j``, every term
    non-negative; gradient ``T sigmoid(u) - w``. ``c_j = 0`` on a missing answer (``observed`` is not read) removes
    expert ``j``'s ``c_j l(u, K+j)``.

    Forward: the classes' ``sum_{k != y} xi(-u_k)`` in one buffer (`_softplus_rest`: a softplus pass and a row sum,
    or, from 64 classes on, five cheaper passes), the true class and the experts (``B (1 + M)`` entries) on the side.
    Backward: one sigmoid pass written into the forward's buffer, one row scaling, and the targets subtracted at
    ``B (1 + M)`` entries."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, observed: torch.Tensor,
                weight: torch.Tensor, num_classes: int, reduce: bool = False) -> torch.Tensor:
        buffer, rest, plus_true, true, plus_experts = _softplus_rest(u, labels, num_classes)
        total = correct.sum(dim=1)
        loss = (total + 1.0).mul_(rest).add_(F.softplus(-true)).add_(total * plus_true)
        experts = correct * F.softplus(-u[:, num_classes:]) + (total[:, None] + 1.0 - correct) * plus_experts
        _keep_buffer(ctx, buffer)
        ctx.save_for_backward(u, labels, correct, weight)
        ctx.num_classes = num_classes
        loss = loss.add_(experts.sum(dim=1))
        return loss.dot(weight) if reduce else loss.mul_(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        u, labels, correct, weight = ctx.saved_tensors
        scale = (weight * grad)[:, None]
        out = _sigmoid_into_buffer(ctx, u)
        out.mul_(correct.sum(dim=1, keepdim=True).add_(1.0).mul_(scale))
        return _minus_targets(out, labels, correct, scale, ctx.num_classes), None, None, None, None, None, None


class _AOvALoss(torch.autograd.Function):
    """A-OvA: a binary logistic loss per output with targets ``w = (onehot(y), c)``, expert ``j``'s weighted by
    ``o_j``; gradient ``sigmoid(u) - w`` on the classes, ``o_j sigmoid(u_{K+j}) - c_j`` on the experts (``c_j = 0``
    where ``o_j = 0``). Passes as for S-OvA: the classes' sum in one buffer forward (`_softplus_rest`), one sigmoid
    into the same buffer and one scaling backward."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, observed: torch.Tensor,
                weight: torch.Tensor, num_classes: int, reduce: bool = False) -> torch.Tensor:
        buffer, rest, _, true, _ = _softplus_rest(u, labels, num_classes)
        experts = F.binary_cross_entropy_with_logits(u[:, num_classes:], correct, observed, reduction="none")
        _keep_buffer(ctx, buffer)
        ctx.save_for_backward(u, labels, correct, observed, weight)
        ctx.num_classes = num_classes
        loss = rest.add_(F.softplus(-true)).add_(experts.sum(dim=1))
        return loss.dot(weight) if reduce else loss.mul_(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        u, labels, correct, observed, weight = ctx.saved_tensors
        scale = (weight * grad)[:, None]
        out = _sigmoid_into_buffer(ctx, u).mul_(scale)
        if observed is not None:
            out[:, ctx.num_classes:].mul_(observed)
        return _minus_targets(out, labels, correct, scale, ctx.num_classes), None, None, None, None, None, None


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

    A missing answer drops expert ``j``'s binary term, exactly: ``u_{K+j}`` is free whatever the class logits, so the
    term is minimised at its own target on the answered inputs (``Pr(M_j = Y | x)`` when answers are missing at
    random, the accuracy on the inputs answered when they are not); with a score ``q_j`` as target, at ``E[q_j | x]``
    (see the module docstring).

    Example:

    ```python
    >>> import torch
    >>> from hf_defer.modeling import get_surrogate
    >>> asm = get_surrogate("asm", num_classes=3)
    >>> logits = torch.tensor([[2.0, 0.0, -1.0, 0.5], [0.0, 0.1, 0.0, 3.0]])
    >>> loss = asm(logits, torch.tensor([0, 1]), torch.tensor([0, 2]))
    >>> class_probs, expert_accuracy = asm.probabilities(logits)
    >>> asm.decide(logits)[0]
    tensor([False,  True])
    ```
    """

    name = "asm"
    kernel = _ASMLoss
    display_name = "A-SM"
    description = "asymmetric softmax"
    citation = "Cao et al., NeurIPS 2023"
    bounded = True

    def _log_estimates(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        K = self.num_classes
        classes = u[:, :K]  # the rest without y*, by logsumexp (differentiable, unlike the kernel's in-place helper)
        rest = torch.logsumexp(classes.scatter(1, classes.argmax(dim=1, keepdim=True), float("-inf")), 1, keepdim=True)
        return F.log_softmax(classes, dim=1), F.logsigmoid(u[:, K:] - rest)


class SSMSurrogate(DeferralSurrogate):
    r"""Softmax cross-entropy surrogate (S-SM) of Mozannar & Sontag (2020); multi-expert form of Verma et al. (2023).

    Loss: ``-log softmax(u)_y - sum_j c_j log softmax(u)_{K+j}``, softmax over all ``K + M`` outputs.
    At the optimum ``softmax(u) = (eta, a) / (1 + sum_j a_j)`` with ``a_j = Pr(M_j = Y | x)``, so the
    estimator is ``eta_y = p_y / (1 - sum_j p_{K+j}) = softmax(u_{1..K})_y`` and
    ``a_j = p_{K+j} / (1 - sum_j p_{K+j}) = exp(u_{K+j} - LSE(u_{1..K}))`` (for ``M = 1``,
    ``p_{K+1} / (1 - p_{K+1})``). The expert estimate is unbounded above (Theorem 1 of the paper); it is
    clipped to [0, 1] unless ``probabilities(..., clip=False)``.

    A missing answer removes ``-c_j log softmax(u)_{K+j}`` from the row, and only that: ``u_{K+j}`` stays in the
    denominator of the other terms, which keep pushing it down. That is the loss as defined, and it means the optimum
    is ``softmax(u) = (eta, b) / (1 + sum_j b_j)`` with ``b_j = E[o_j c_j | x]``: the estimate of expert ``j`` is
    ``Pr(expert j answers | x) * Pr(M_j = Y | x)`` under answers missing at random, not its accuracy. A soft target
    ``q_j`` gives ``E[q_j | x]`` (the loss is linear in it).

    Example:

    ```python
    >>> import torch
    >>> from hf_defer.modeling import get_surrogate
    >>> ssm = get_surrogate("ssm", num_classes=2)
    >>> ssm.probabilities(torch.tensor([[0.0, 0.0, 2.0]]), clip=False)[1]  # exp(2 - log 2) > 1
    tensor([[3.6945]])
    ```
    """

    name = "ssm"
    kernel = _SSMLoss
    display_name = "S-SM"
    description = "softmax cross-entropy over classes and experts"
    citation = "Mozannar & Sontag, 2020"
    bounded = False

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

    A missing answer removes ``c_j l(u, K+j)``; output ``K+j`` still carries ``T xi(-u_{K+j})`` from the other terms, so,
    as for ``ssm``, the optimum has ``b_j = E[o_j c_j | x]`` in place of ``a_j``: the estimate is the chance that the
    expert answers and is right, not its accuracy. A soft target ``q_j`` gives ``E[q_j | x]``.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer.modeling import get_surrogate
    >>> sova = get_surrogate("sova", num_classes=3)
    >>> loss = sova(torch.zeros(2, 4), torch.tensor([0, 2]), torch.tensor([0, 1]))
    ```
    """

    name = "sova"
    kernel = _SOvALoss
    display_name = "S-OvA"
    description = "symmetric one-vs-all logistic loss in the consistent L_phi construction"
    citation = "baseline of Cao et al., NeurIPS 2023"
    bounded = False

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

    A missing answer weights expert ``j``'s binary term by 0: masking is exact, as for ``asm`` (the estimate is
    ``Pr(M_j = Y | x)`` under answers missing at random, the accuracy on the inputs answered otherwise), and with a
    score ``q_j`` as target the estimate is ``E[q_j | x]``.

    Example:

    ```python
    >>> import torch
    >>> from hf_defer.modeling import get_surrogate
    >>> aova = get_surrogate("aova", num_classes=3, num_experts=2)
    >>> loss = aova(torch.zeros(1, 5), torch.tensor([1]), torch.tensor([[1, 0]]))
    >>> round(loss.item(), 4)  # five binary log losses at 0: 5 log 2
    3.4657
    ```
    """

    name = "aova"
    kernel = _AOvALoss
    display_name = "A-OvA"
    description = "asymmetric one-vs-all"
    citation = "Verma & Nalisnick, 2022"
    bounded = True

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
    >>> from hf_defer.modeling.surrogates import surrogate_class
    >>> surrogate_class("ssm").display_name, surrogate_class("ssm").bounded
    ('S-SM', False)

    ```
    """
    if isinstance(name, str) and name == RouteOnlySurrogate.name:  # route-only models (`DeferralConfig(route_only=True)`): no class head
        return RouteOnlySurrogate
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"surrogate must be one of {SURROGATES}, got {name!r}.")
    return _REGISTRY[name]


def surrogate_for_config(config: Any) -> DeferralSurrogate:
    """The surrogate a [`DeferralConfig`] trains and decides with: ``get_surrogate(config.surrogate, config.num_labels,
    config.num_experts)``, or a [`RouteOnlySurrogate`] over its experts for a route-only config."""
    if is_route_only(config):
        return RouteOnlySurrogate(config.num_experts, config.default_expert_index)
    return get_surrogate(config.surrogate, config.num_labels, config.num_experts)


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
    >>> from hf_defer.modeling import get_surrogate
    >>> surrogate = get_surrogate("asm", num_classes=3, num_experts=1)
    >>> logits = torch.randn(4, 4, requires_grad=True)
    >>> loss = surrogate(logits, torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 1, 1]))
    >>> loss.backward()
    >>> defer, prediction, expert = surrogate.decide(logits)
    ```
    """
    return surrogate_class(name)(num_classes, num_experts)
