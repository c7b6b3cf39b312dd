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
from importlib import metadata  # noqa: E402
assert sac.__version__ == metadata.version("torch-sac"), (sac.__version__,
                                                          metadata.version("torch-sac"))

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

# sac measures memory itself, with the CPU's default allocator and nothing
# installed: a plan for a step's peak peaks where it was predicted.
torch.set_num_threads(1)
layers = [torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
          for _ in range(3)]


def step(context_fn):
    h = x.detach().requires_grad_()
    for layer in layers:
        h = checkpoint(layer, h, use_reentrant=False, context_fn=context_fn)
    h.square().sum().backward()
    for layer in layers:
        layer.zero_grad(set_to_none=True)


nothing = sac.context_fn(sac.nothing_saveable())
step(nothing)  # one-time allocations
phases = sac.measure_step_phases(lambda: step(nothing))
assert phases.plain_peak is not None, phases.why_no_plain_peak
profiles = [sac.profile(lambda layer=layer: layer(x.detach().requires_grad_()), runs=1)
            for layer in layers]
for budget in [phases.peak(), (phases.peak() + phases.plain_peak) // 2, phases.plain_peak]:
    plan = phases.plan_for_peak(profiles, budget)
    measured = sac.measure_peak(lambda: step(sac.in_order(plan.plan.policies)))
    assert measured == plan.predicted_peak <= budget, (budget, measured, plan.predicted_peak)
print(f"torch_sac: peak plans measured by sac itself at their predictions (full recomputation "
      f"{phases.peak()} bytes, plain {phases.plain_peak})")

# The one call, from the wheel alone: a step fitted into 70% of its peak.
mlp = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(),
                                                torch.nn.Linear(128, 32)) for _ in range(4)])
data = torch.randn(1024, 32)
sgd = torch.optim.SGD(mlp.parameters(), lr=0.1, momentum=0.9)


def train():
    sgd.zero_grad()
    mlp(data).square().mean().backward()
    sgd.step()


fitted = sac.fit(mlp, train, peak=0.7)
fitted.apply(mlp)
measured = fitted.check(train)
assert measured == fitted.predicted_peak <= fitted.peak_budget, (measured, fitted.predicted_peak)
print(f"torch_sac: sac.fit, from the wheel: {fitted.predicted_peak} bytes predicted and measured, "
      f"within {fitted.peak_budget} (70% of the plain step's {fitted.plain_peak})")
