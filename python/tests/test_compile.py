"""sac's contexts under torch.compile. Inductor plans what to save from the
tags PyTorch's own modes put on the traced graph, so there sac hands
PyTorch's pair the same policy. Tested: the compiled forward saves what it
saves with PyTorch's SAC and the same op list (and less with sac's
nothing_saveable), and gradients equal eager's."""
import functools

import pytest
import torch
from functorch.compile import min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd
from torch.utils.checkpoint import CheckpointPolicy, checkpoint
from torch.utils.checkpoint import create_selective_checkpoint_contexts as torch_contexts

import torch_sac as sac
from support import block, leaves

aten = torch.ops.aten


def compiled_step(context_fn):
    """Gradients of a compiled checkpointed block, and the number of tensors
    its forward graph saves for backward (min-cut partitioning, as Inductor)."""
    saved = []

    def forward_compiler(graph, example_inputs):
        output = next(n for n in graph.graph.nodes if n.op == "output")
        saved.append(len(output.args[0]))
        return graph

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda g, _: g,
                           partition_fn=min_cut_rematerialization_partition)
    torch._dynamo.reset()
    fn = torch.compile(lambda *a: checkpoint(block, *a, use_reentrant=False,
                                             context_fn=context_fn), backend=backend)
    args = leaves()
    out = fn(*args)
    out.square().sum().backward()
    return [out.detach()] + [a.grad for a in args], saved[0]


def eager_gradients():
    args = leaves()
    out = block(*args)
    out.square().sum().backward()
    return [out.detach()] + [a.grad for a in args]


@pytest.mark.parametrize("policy", [
    [aten.mm.default],
    sac.save_ops(["aten::mm"]),
    sac.any_of([sac.save_ops(["aten::mm"]), sac.nothing_saveable()]),
], ids=["op_list", "save_ops", "combinator"])
def test_saves_what_pytorch_s_sac_saves(policy):
    got, saved = compiled_step(sac.context_fn(policy))
    _, theirs = compiled_step(functools.partial(torch_contexts, [aten.mm.default]))
    _, nothing = compiled_step(sac.context_fn(sac.nothing_saveable()))
    assert saved == theirs
    assert nothing < saved
    for g, e in zip(got, eager_gradients(), strict=True):
        torch.testing.assert_close(g, e)  # compiled kernels round differently


def test_a_python_policy_function_is_handed_to_pytorch():
    asked = []

    def policy_fn(ctx, op, *args, **kwargs):
        asked.append(op)
        return CheckpointPolicy.MUST_SAVE if op == aten.mm.default else \
            CheckpointPolicy.PREFER_RECOMPUTE

    _, saved = compiled_step(sac.context_fn(policy_fn))
    _, theirs = compiled_step(functools.partial(torch_contexts, [aten.mm.default]))
    assert aten.mm.default in asked
    assert saved == theirs


def test_every_nth_counts_the_traced_calls():
    # Three mm calls (x @ w1, h @ w2, h @ w2.t()): the second is saved.
    _, second = compiled_step(sac.context_fn(sac.every_nth("aten::mm", 2)))
    _, nothing = compiled_step(sac.context_fn(sac.nothing_saveable()))
    _, all_three = compiled_step(sac.context_fn([aten.mm.default]))
    assert nothing < second < all_three


FALLBACK = sac.mechanism().startswith("fallback")
needs_fallback = pytest.mark.skipif(
    not FALLBACK, reason="the region guard needs the fallback key (SAC_DISPATCH=fallback)")


@needs_fallback
@pytest.mark.parametrize("warm", [False, True], ids=["compiled_in_the_region", "compiled_before"])
def test_a_compiled_call_in_a_region_says_torch_compile_is_not_supported(warm):
    # Compiled before or not, the call is traced under the region (its guards
    # see the region's dispatch state): a clear error, not a recording one.
    torch._dynamo.reset()
    fn = torch.compile(block, backend="aot_eager")
    args = leaves()
    if warm:
        fn(*args).sum().backward()
    # sac's refusal itself (issue 44), not Dynamo's InternalTorchDynamoError
    # around it, which reads as a bug of Dynamo's; Dynamo's stays its cause.
    with pytest.raises(RuntimeError, match="as part of a compile trace .*torch.compile is not supported") as e:
        with sac.region():
            fn(*args)
    assert type(e.value) is RuntimeError, type(e.value)
    assert str(e.value).startswith("sac::CheckpointRegion: the region runs")


@needs_fallback
def test_a_region_inside_a_compiled_function_says_torch_compile_is_not_supported():
    # Dynamo does not trace sac.region: it breaks the graph there, enters the
    # region eagerly and traces what follows under it.
    def checkpointed(*a):
        with sac.region([aten.mm.default]):
            return block(*a)

    torch._dynamo.reset()
    compiled = torch.compile(checkpointed, backend="aot_eager")
    with pytest.raises(RuntimeError, match="as part of a compile trace .*torch.compile is not supported") as e:
        compiled(*leaves())
    assert type(e.value) is RuntimeError, type(e.value)
