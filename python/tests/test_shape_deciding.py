"""Keeping what decides shapes, from Python: a router whose scores move by
2e-4 in recomputation (as a nondeterministic kernel's might) flips its
top-k under PyTorch's checkpoint, silently; with sac's shape_deciding_ops
kept beside any policy, the recomputation routes as the forward did."""
import torch
from torch.utils.checkpoint import checkpoint

import torch_sac as sac


def router_block(calls):
    """x -> x * experts[top-1 expert of x]; experts 0 and 1 tie but for 1e-4,
    which the recomputation's 2e-4 on expert 1 overturns."""
    torch.manual_seed(0)
    router = torch.randn(16, 1).repeat(1, 4)
    bias = torch.tensor([1e-4, 0.0, -100.0, -100.0])
    experts = torch.randn(4, 16, requires_grad=True)

    def block(x):
        scores = x.detach() @ router + bias
        if calls[0] > 0:  # the recomputation
            scores[:, 1] += 2e-4
        calls[0] += 1
        chosen = scores.topk(1).indices.squeeze(1)
        return x * experts.index_select(0, chosen)

    return block, experts


def gradients(context_fn=None):
    calls = [0]
    block, experts = router_block(calls)
    torch.manual_seed(1)
    x = torch.randn(8, 16, requires_grad=True)
    if context_fn is None:
        y = block(x)
    else:
        y = checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
    y.sum().backward()
    return [x.grad, experts.grad]


def test_router_flips_silently_without_it_and_is_exact_with_it():
    expected = gradients()
    flipped = gradients(sac.context_fn(sac.nothing_saveable()))
    assert not torch.equal(flipped[1], expected[1]), "the flip changes the expert gradients"
    kept = gradients(sac.context_fn(sac.any_of([sac.nothing_saveable(),
                                                sac.shape_deciding_ops()])))
    for got, want in zip(kept, expected):
        assert torch.equal(got, want)


def test_the_list_names_the_routing_ops():
    names = sac.shape_deciding_op_names()
    for op in ("aten::topk", "aten::sort", "aten::nonzero", "aten::_local_scalar_dense"):
        assert op in names
