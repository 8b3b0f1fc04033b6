"""The order of each surrogate's cost against cross-entropy's, counted rather than timed: the passes its forward and
backward make over the `[B, K + M]` logits, recorded by a `TorchDispatchMode`.

At B = 4,096 and K = 100 or 1,000 a surrogate's time is its passes over that tensor (benchmarks/bench_surrogates.py);
a change that adds a pass (a second softmax, a mask materialised, a copy) raises the count at once, on any machine,
where a timing test would pass or fail with the load. Counted: every operator that is not a view and reads or writes
a tensor of at least B x K / 2 elements, except those that touch one element per row of it (`gather`, in-place
`scatter_` / `scatter_add_`, `nll_loss_forward`) and allocations (`empty_like`, `new_empty`). Cross-entropy makes 3 (worked out by hand: `log_softmax`, the
zero-filled gradient that `nll_loss_backward` writes, `log_softmax`'s backward), whatever K.

Counted too: the new tensors of that size (allocations, and operators that return a new tensor rather than write into
one), which on a CPU cost about as much as a pass each (the pages of a fresh large tensor are faulted in, a cost that
`perf` shows as system time). Cross-entropy allocates 3 (the same three operators); each surrogate 1, the tensor the
backward returns as the gradient (issue 46: they allocated 2, and A-SM made the 8 passes with `max`'s index and
`exp`, several times slower on a CPU than the comparison, product and `exp2` it makes now).

A pass is not a unit of time: on a CPU `softplus` (an accurate `log1p(exp)`) costs as much as 13 clamps, and `exp`
as 4 `exp2`. So S-SM's backward takes `p = exp2(log p log2 e)` (4 passes where it made 3), and the OvA losses, from
64 classes on, trade their one `softplus` pass and its row sum for five cheap passes (a clamp, its sum, `abs`, a
sigmoid, a product per 120 classes; `_softplus_rest`): 7 where they made 4, in less time (benchmarks/README.md).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from hf_defer.modeling import get_surrogate

B = 64
ALLOCATIONS = {torch.ops.aten.new_empty.default, torch.ops.aten.empty_like.default, torch.ops.aten.empty.memory_format}
ONE_ELEMENT_PER_ROW = {torch.ops.aten.gather.default, torch.ops.aten.scatter_.value, torch.ops.aten.scatter_.src,
                       torch.ops.aten.scatter_add_.default, torch.ops.aten.nll_loss_forward.default}
# the passes each surrogate makes today (forward + backward, check=False, one expert); a new pass fails the test
PASSES = {"asm": 8, "ssm": 4, "sova": 7, "aova": 7}  # cross-entropy: 3
# the [B, K]-sized tensors each allocates (the gradient it returns, written into a buffer of the forward's)
ALLOCATED = {"asm": 1, "ssm": 1, "sova": 1, "aova": 1}  # cross-entropy: 3


class _Passes(TorchDispatchMode):
    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.ops, self.allocated = numel, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func is torch.ops.aten.detach.default:
            return out
        big = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.numel() >= self.numel]
        if big and (func in ALLOCATIONS or not func._schema.is_mutable):  # a new tensor, not one written in place
            self.allocated.append(str(func))
        if func in ONE_ELEMENT_PER_ROW or func in ALLOCATIONS:
            return out
        if any(isinstance(t, torch.Tensor) and t.numel() >= self.numel for t in pytree.tree_leaves((args, kwargs, out))):
            self.ops.append(str(func))
        return out


def record(loss_fn, num_classes: int) -> _Passes:
    torch.manual_seed(0)
    logits = torch.randn(B, num_classes + 1, requires_grad=True)
    labels = torch.randint(0, num_classes, (B,))
    experts = torch.where(torch.rand(B) < 0.7, labels, (labels + 1) % num_classes)
    with _Passes(B * num_classes // 2) as mode:  # half: a product over most classes in chunks reads a [B, K - r] view
        loss_fn(logits, labels, experts).backward()
    return mode


def passes(loss_fn, num_classes: int) -> list[str]:
    return record(loss_fn, num_classes).ops


@pytest.mark.parametrize("num_classes", [100, 1000])
def test_cross_entropy_makes_the_three_passes_worked_out_by_hand(num_classes):
    ops = passes(lambda u, y, m: F.cross_entropy(u, y), num_classes)
    assert ops == ["aten._log_softmax.default", "aten.nll_loss_backward.default",
                   "aten._log_softmax_backward_data.default"]
    assert record(lambda u, y, m: F.cross_entropy(u, y), num_classes).allocated == ops  # each writes a new tensor


@pytest.mark.parametrize("num_classes", [100, 1000])
@pytest.mark.parametrize("name", sorted(PASSES))
def test_no_surrogate_makes_more_passes_than_today_nor_more_with_k(name, num_classes):
    surrogate = get_surrogate(name, num_classes, 1)
    ops = passes(lambda u, y, m: surrogate(u, y, m, check=False), num_classes)
    assert len(ops) <= PASSES[name], f"{name} makes {len(ops)} passes over the logits (was {PASSES[name]}): {ops}"
    wider = get_surrogate(name, 3 * num_classes, 1)
    assert len(ops) == len(passes(lambda u, y, m: wider(u, y, m, check=False), 3 * num_classes))  # none per class


@pytest.mark.parametrize("num_classes", [100, 1000])
@pytest.mark.parametrize("name", sorted(ALLOCATED))
def test_no_surrogate_allocates_more_than_the_gradient_it_returns(name, num_classes):
    surrogate = get_surrogate(name, num_classes, 1)
    allocated = record(lambda u, y, m: surrogate(u, y, m, check=False), num_classes).allocated
    assert len(allocated) <= ALLOCATED[name], f"{name} allocates {allocated} (was {ALLOCATED[name]} tensor)"


@pytest.mark.parametrize("name", sorted(ALLOCATED))
def test_a_second_backward_allocates_a_new_gradient(name):
    """With retain_graph, the second backward cannot write into the gradient the first one returned: it allocates one
    more tensor (A-SM and S-SM compute their forward buffer again in it)."""
    surrogate = get_surrogate(name, 100, 1)

    def twice(u, y, m):
        loss = surrogate(u, y, m, check=False)
        torch.autograd.grad(loss, u, retain_graph=True)
        return loss

    allocated = record(twice, 100).allocated
    assert len(allocated) == ALLOCATED[name] + 1, allocated
