"""The surrogate losses' autograd kernels, used by :mod:`surrogates` (one ``torch.autograd.Function`` per loss).

Each loss is a `torch.autograd.Function` with its gradient written out: one log-sum-exp (or softplus) pass over
the logits in forward and one elementwise pass in backward, where autograd would record half a dozen passes each
way for the composed formulas. Inputs: ``u`` float32 [B, K + M], ``labels`` long [B] in range (ignored rows set
to 0 by `check_targets`), ``correct`` float [B, M]; output: the per-example loss [B].

This module only imports ``torch``: like ``surrogates.py``, it is copied next to the model code for remote-code loading.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
