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


class _ASMLoss(torch.autograd.Function):
    """A-SM: ``(top - u_y) + sum_{z in (top, experts)} BCE(a_z, t_z)`` with ``r = LSE(u_{[K] minus y*})``,
    ``a = (top, u_{K+1..K+M}) - r`` and targets ``t = (1, c)``: ``BCE(top - r, 1) = softplus(r - top)``, so the class
    part is ``LSE(u_{[K]}) - u_y`` with no cancellation, and ``BCE(u_{K+j} - r, c_j)`` is expert ``j``'s term.

    Gradient, with ``g = sigmoid(a) - t`` (the binary terms' own), ``q = softmax(u_{[K] minus y*})`` (0 at ``y*``):
    ``sigmoid(a_0)`` at ``y*`` (``1 + g_0``), ``-(sum_z g_z) q`` on the other classes (through ``r``), ``-1`` at ``y``
    (``y*`` is piecewise constant, as in the masked formula) and ``g_{1..M}`` on the experts. A missing answer
    (``o_j = 0``) weights expert ``j``'s binary term, hence ``g_j``, by 0: its logit gets no gradient from that row and
    ``r`` none through it.
    """

    @staticmethod
    def forward(ctx, u: torch.Tensor, labels: torch.Tensor, correct: torch.Tensor, observed: torch.Tensor,
                weight: torch.Tensor, num_classes: int) -> torch.Tensor:
        top, top_index, second, e, s = _asm_rest(u, num_classes)
        a = torch.cat([top, u[:, num_classes:]], dim=1).sub_(s.log().add_(second))
        targets = F.pad(correct, (1, 0), value=1.0)
        present = None if observed is None else F.pad(observed, (1, 0), value=1.0)  # the class part is always there
        loss = F.binary_cross_entropy_with_logits(a, targets, present, reduction="none").sum(dim=1)
        loss = loss.add_(top[:, 0]).sub_(u.gather(1, labels[:, None])[:, 0])
        ctx.save_for_backward(a, targets, present, e, s, top_index, labels, weight)
        return loss.mul_(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, targets, present, e, s, top_index, labels, weight = ctx.saved_tensors
        scale = (weight * grad)[:, None]
        sigmoid = torch.sigmoid(a)
        g = (sigmoid - targets).mul_(scale)
        if present is not None:
            g.mul_(present)
        out = e * g.sum(dim=1, keepdim=True).div_(s).neg_()
        out.scatter_add_(1, top_index, sigmoid[:, :1].mul_(scale))
        out.scatter_add_(1, labels[:, None], scale.neg())
        return torch.cat([out, g[:, 1:]], dim=1), None, None, None, None, None


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
