"""The installed wheel's smoke test (.ci/python): torch_sac imports from the
given environment, its contexts and regions give the gradients of the plain
run bit for bit, and its typing marker is installed. Run with SAC_DISPATCH=fallback:

    python wheel_smoke.py VENV
"""
import os
import sys

import torch
from torch.utils.checkpoint import checkpoint

import torch_sac as sac

venv = os.path.realpath(sys.argv[1])
where = os.path.realpath(sac.__file__)
assert where.startswith(venv + os.sep), f"torch_sac imported from {where}, not from {venv}"
assert os.path.exists(os.path.join(os.path.dirname(where), "py.typed")), "no py.typed"
assert issubclass(sac.CheckpointError, torch.utils.checkpoint.CheckpointError)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
x = torch.randn(8, 16)


def grads(run):
    model.zero_grad()
    run().square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


plain = grads(lambda: model(x))
ops = [torch.ops.aten.addmm.default]
runs = {
    "context_fn": lambda: checkpoint(model, x, use_reentrant=False, context_fn=sac.context_fn(ops)),
}


def in_region():
    with sac.region(ops):
        return model(x)


runs["region"] = in_region
for name, run in runs.items():
    got = grads(run)
    assert all(torch.equal(a, b) for a, b in zip(plain, got)), f"{name}: gradients differ"
print(f"torch_sac {where}: context_fn and region bit-identical under {sac.mechanism()}")
