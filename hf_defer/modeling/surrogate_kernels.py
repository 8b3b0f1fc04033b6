"""The surrogate losses' autograd kernels, used by :mod:`surrogates` (one ``torch.autograd.Function`` per loss).

Each loss is a `torch.autograd.Function` with its gradient written out: one log-sum-exp (or softplus) pass over
the logits in forward and one elementwise pass in backward, where autograd would record half a dozen passes each
way for the composed formulas. Inputs: ``u`` float32 [B, K + M], ``labels`` long [B] in range (ignored rows set
to 0 by `check_targets`), ``correct`` float [B, M] (expert ``j``'s target ``c_j`` in [0, 1]: ``[[m_j = y]]``, a
correctness or a score; 0 where the expert did not answer), ``observed`` float [B, M] (``o_j``: 1 where expert ``j``
answered, 0 where not; None when every expert answered in every row: no mask to apply), ``weight`` float [B] (0 on ignored rows, ``1 / n`` for a mean); output: the weighted
per-example loss ``weight * loss`` [B], whose ``sum()`` is the reduced loss. Weighting inside the kernel spares the
masking and the division their own autograd nodes: at small batches the cost of a loss is the number of PyTorch
calls, not the passes over the logits.

A missing answer removes that expert's terms from the row and nothing else: every expert term carries the factor
``o_j``. In the symmetric losses (S-SM, S-OvA) expert ``j`` enters only through ``c_j`` (a weight of the target
``K + j``), so ``c_j = 0`` on a missing answer is the mask; the asymmetric ones (A-SM, A-OvA) weight expert ``j``'s
binary term by ``o_j``. With every answer present (``o = 1``) the multiplications by 1 are exact: the loss and its
gradient are bit for bit those without a mask.

This module only imports ``torch``: like ``surrogates.py``, it is copied next to the model code for remote-code loading.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _asm_rest(u: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, ...]:
    """One log-sum-exp over every class but the top one ``y*``, shifted by the largest of them.

    Returns ``top [B, 1]`` (``max_{y<=K} u_y``), ``top_index [B, 1]`` (``y*``), ``second [B, 1]`` (the largest
    class logit but ``y*``), ``e [B, K]`` (``exp(u_k - second)`` on the classes but ``y*``, 0 on ``y*``) and
    ``s [B, 1] = sum e >= 1``, so that ``LSE(u_{[K] minus y*}) = second + log s``. The asymmetric softmax denominator
    ``sum_{y<=K+1} e^{u_y} - max_{y<=K} e^{u_y}`` is thus summed without forming the difference, and ``s >= 1``
    cannot underflow, whatever the gap between the top class and the others (``K >= 2``).
    """
    top, top_index = u[:, :num_classes].max(dim=1, keepdim=True)
    rest = u[:, :num_classes].scatter(1, top_index, float("-inf"))
    second = rest.detach().amax(dim=1, keepdim=True)  # a shift: the log-sum-exp's gradient does not depend on it
    e = rest.sub_(second).exp_()
    return top, top_index, second, e, e.sum(dim=1, keepdim=True)


_NARROW_WIDTH = 8
"""Up to this many outputs (``K + M``), A-SM computes on CPU with one example per column (the logits transposed, ``[K + M,
B]``). PyTorch's CPU reductions, broadcasts and transcendental functions along a last dimension of a few elements take
the slow, unvectorised paths (``max`` over 3 classes costs as much as ``log_softmax`` over the whole batch); along
``B`` contiguous elements they are single vector passes. The transpose costs one copy each way, which wide logits
would not repay, nor would a small batch (below `_NARROW_MIN_BATCH` rows the two copies cost more than they save)."""

_NARROW_MIN_BATCH = 1024


class _ASMLoss(torch.autograd.Function):
    """A-SM: ``(top - u_y) + softplus(r - top) + sum_j o_j BCE(u_{K+j} - r, c_j)`` with ``r = LSE(u_{[K] minus y*})``:
    ``top + softplus(r - top) = LSE(u_{[K]})``, so the class part is ``LSE(u_{[K]}) - u_y`` with no cancellation, and
    ``BCE(u_{K+j} - r, c_j)`` is expert ``j``'s term (``a = (top, u_{K+1..K+M}) - r``, targets ``t = (1, c)``).

    Gradient, with ``g = sigmoid(a) - t`` (the binary terms' own), ``q = softmax(u_{[K] minus y*})`` (0 at ``y*``):
    ``sigmoid(a_0)`` at ``y*`` (``1 + g_0``), ``-(sum_z g_z) q`` on the other classes (through ``r``), ``-1`` at ``y``
    (``y*`` is piecewise constant, as in the masked formula) and ``g_{1..M}`` on the experts. A missing answer
    (``o_j = 0``) weights expert ``j``'s binary term, hence ``g_j``, by 0: its logit gets no gradient from that row and
    ``r`` none through it.

    The arithmetic runs along the class axis ``d`` of ``x``: ``x = u`` (``d = 1``), or, for narrow logits on CPU (see
    `_NARROW_WIDTH`, `_NARROW_MIN_BATCH`; not under ``torch.compile``), ``x = u.T`` made contiguous (``d = 0``); the same operations in the
    same order, so both layouts give the same values.
    """

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, observed: torch.Tensor,
                weight: torch.Tensor, num_classes: int) -> torch.Tensor:
        narrow = (u.shape[1] <= _NARROW_WIDTH and u.shape[0] >= _NARROW_MIN_BATCH and u.device.type == "cpu"
                  and not torch.compiler.is_compiling())
        d = 0 if narrow else 1  # a compiled graph picks its own layout (and takes no strided `out=`)
        if d == 0:  # one example per column
            x, labels, weight, correct = u.t().contiguous(), labels[None], weight[None], correct.t()
            observed = None if observed is None else observed.t()
        else:
            x, labels, weight = u, labels[:, None], weight[:, None]
        classes = x.narrow(d, 0, num_classes)
        top, top_index = classes.max(dim=d, keepdim=True)
        rest = classes.scatter(d, top_index, float("-inf"))
        second = rest.amax(dim=d, keepdim=True)  # a shift: the log-sum-exp's gradient does not depend on it
        # exp(-80) ~ 2e-35 in place of exp(-inf) = 0 at y* (and under any smaller term): exp's vectorised path does not
        # take inputs that far out, and s >= 1 absorbs them (1 + 2e-35 == 1 in float32), so the loss is unchanged
        e = rest.sub_(second).clamp_(min=-80.0).exp_()
        s = e.sum(dim=d, keepdim=True)  # >= 1: cannot underflow, whatever the gap to the top class
        r = s.log().add_(second)
        a_top = top - r
        a = x.narrow(d, num_classes, x.shape[d] - num_classes) - r
        experts = F.binary_cross_entropy_with_logits(a, correct, observed, reduction="none")
        loss = experts.sum(dim=d, keepdim=True) if experts.shape[d] > 1 else experts
        loss = loss.add(F.softplus(a_top.neg())).add_(top).sub_(x.gather(d, labels)).mul_(weight)
        ctx.save_for_backward(a_top, a, correct, observed, e, s, top_index, labels, weight)
        ctx.d = d
        return loss.squeeze(d)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a_top, a, correct, observed, e, s, top_index, labels, weight = ctx.saved_tensors
        d = ctx.d
        scale = weight * grad.unsqueeze(d)
        g = (torch.sigmoid(a) - correct).mul_(scale)
        if observed is not None:
            g.mul_(observed)
        top = torch.sigmoid(a_top).mul_(scale)  # sigmoid(a_0) scale = (1 + g_0) scale
        g_sum = g.sum(dim=d, keepdim=True).add_(top) if g.shape[d] > 1 else g + top
        out = e * g_sum.sub_(scale).div_(s).neg_()
        out.scatter_add_(d, top_index, top)
        out.scatter_add_(d, labels, scale.neg())
        if d == 1:
            return torch.cat([out, g], dim=1), None, None, None, None, None
        grad_u = torch.empty(out.shape[1], out.shape[0] + g.shape[0], dtype=out.dtype, device=out.device)
        torch.cat([out, g], dim=0, out=grad_u.t())  # written back in the logits' layout, one example per row
        return grad_u, None, None, None, None, None


def _minus_targets(out: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, scale: torch.Tensor,
                   num_classes: int) -> torch.Tensor:
    """``out - scale * w`` in place, for the targets ``w = (onehot(y), c)``: touches ``B (1 + M)`` entries only."""
    out.scatter_add_(1, labels[:, None], scale.neg())
    out[:, num_classes:].sub_(correct * scale)
    return out


class _SSMLoss(torch.autograd.Function):
    """S-SM: ``-sum_z w_z log softmax(u)_z`` with targets ``w = (onehot(y), c)``; gradient ``(1 + sum_j c_j) p - w``.
    ``c_j = 0`` on a missing answer (``observed`` is not read): the expert's term is gone, its logit stays in the
    softmax's denominator."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, observed: torch.Tensor,
                weight: torch.Tensor, num_classes: int) -> torch.Tensor:
        log_p = F.log_softmax(u, dim=1)
        ctx.save_for_backward(log_p, labels, correct, weight)
        ctx.num_classes = num_classes
        loss = log_p.gather(1, labels[:, None])[:, 0].add_((correct * log_p[:, num_classes:]).sum(dim=1))
        return loss.mul_(weight).neg_()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        log_p, labels, correct, weight = ctx.saved_tensors
        scale = (weight * grad)[:, None]
        out = log_p.exp().mul_(correct.sum(dim=1, keepdim=True).add_(1.0).mul_(scale))
        return _minus_targets(out, labels, correct, scale, ctx.num_classes), None, None, None, None, None


def _ova_class_rest(u: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_{k<=K, k != y} xi(-u_k)`` (one softplus pass, the true class zeroed, not subtracted) and ``u_y``."""
    softplus = F.softplus(u[:, :num_classes]).scatter_(1, labels[:, None], 0.0)
    return softplus.sum(dim=1), u.gather(1, labels[:, None])[:, 0]


class _SOvALoss(torch.autograd.Function):
    """S-OvA: ``sum_z [w_z xi(u_z) + (T - w_z) xi(-u_z)]``, ``w = (onehot(y), c)``, ``T = 1 + sum_j c_j``, every term
    non-negative; gradient ``T sigmoid(u) - w``. ``c_j = 0`` on a missing answer (``observed`` is not read) removes
    expert ``j``'s ``c_j l(u, K+j)``."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, observed: torch.Tensor,
                weight: torch.Tensor, num_classes: int) -> torch.Tensor:
        rest, true = _ova_class_rest(u, labels, num_classes)
        experts = u[:, num_classes:]
        total = correct.sum(dim=1)
        loss = (total + 1.0).mul_(rest).add_(F.softplus(-true)).add_(total * F.softplus(true))
        experts = correct * F.softplus(-experts) + (total[:, None] + 1.0 - correct) * F.softplus(experts)
        ctx.save_for_backward(u, labels, correct, weight)
        ctx.num_classes = num_classes
        return loss.add_(experts.sum(dim=1)).mul_(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        u, labels, correct, weight = ctx.saved_tensors
        scale = (weight * grad)[:, None]
        out = torch.sigmoid(u).mul_(correct.sum(dim=1, keepdim=True).add_(1.0).mul_(scale))
        return _minus_targets(out, labels, correct, scale, ctx.num_classes), None, None, None, None, None


class _AOvALoss(torch.autograd.Function):
    """A-OvA: a binary logistic loss per output with targets ``w = (onehot(y), c)``, expert ``j``'s weighted by
    ``o_j``; gradient ``sigmoid(u) - w`` on the classes, ``o_j sigmoid(u_{K+j}) - c_j`` on the experts (``c_j = 0``
    where ``o_j = 0``)."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, observed: torch.Tensor,
                weight: torch.Tensor, num_classes: int) -> torch.Tensor:
        rest, true = _ova_class_rest(u, labels, num_classes)
        experts = F.binary_cross_entropy_with_logits(u[:, num_classes:], correct, observed, reduction="none")
        ctx.save_for_backward(u, labels, correct, observed, weight)
        ctx.num_classes = num_classes
        return rest.add_(F.softplus(-true)).add_(experts.sum(dim=1)).mul_(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        u, labels, correct, observed, weight = ctx.saved_tensors
        scale = (weight * grad)[:, None]
        out = torch.sigmoid(u).mul_(scale)
        if observed is not None:
            out[:, ctx.num_classes:].mul_(observed)
        return _minus_targets(out, labels, correct, scale, ctx.num_classes), None, None, None, None, None
