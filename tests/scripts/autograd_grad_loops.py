"""Training steps whose gradients come from ``torch.autograd.grad`` and are written to
``p.grad`` by hand before ``optimizer.step()`` (no ``backward()``), and steps where such a
call is no part of the step's objective.  Prints each step's objective, the loss whose
gradient the optimizer applies, and the first weight's ``.grad`` norm as it steps.

  assign     the gradients of the loss, as they are (inputs: a list of the parameters)
  clip       each gradient scaled to norm 0.05 at most (inputs: ``model.parameters()``,
             a generator)
  dict       inputs: ``dict(model.named_parameters())`` (the gradients come back as a dict)
  tasks      two tasks' losses, a call each, PCGrad's projection of one task's gradient off
             the other's where they conflict: the objective is their sum
  scaled     the gradients of ``scaler.scale(loss)`` (a GradScaler's), unscaled and applied by
             ``scaler.step``: the objective is the loss it scaled
  probe      SAM's ascent: a call for the loss's gradient, the weights moved along it, the
             step's own backward() there, the weights moved back: the objective is that
             backward's loss alone
"""
import sys

import torch
import torch.nn as nn

MODE = sys.argv[1]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
X = torch.randn(512, 10)
Y = (X[:, :3].sum(1) > 0).long()
params = list(model.parameters())
scaler = torch.amp.GradScaler("cpu") if MODE == "scaled" else None


def loss_of(i):
    return nn.functional.cross_entropy(model(X[i]), Y[i])


for step in range(STEPS):
    i = torch.randint(0, 512, (32,))
    opt.zero_grad()
    if MODE == "assign":
        objective = loss_of(i)
        for p, g in zip(params, torch.autograd.grad(objective, params)):
            p.grad = g
    elif MODE == "clip":
        objective = loss_of(i)
        for p, g in zip(params, torch.autograd.grad(objective, model.parameters())):
            p.grad = g * min(1.0, 0.05 / (g.norm().item() + 1e-12))
    elif MODE == "dict":
        objective = loss_of(i)
        grads = torch.autograd.grad(objective, dict(model.named_parameters()))
        for name, p in model.named_parameters():
            p.grad = grads[name]
    elif MODE == "tasks":
        first, second = loss_of(i[:16]), loss_of(i[16:])
        g1 = torch.autograd.grad(first, params)
        g2 = torch.autograd.grad(second, params)
        for p, a, b in zip(params, g1, g2):
            dot = (a * b).sum()
            p.grad = a + b - (dot / b.pow(2).sum() * b if dot < 0 else 0)
        objective = first + second
    elif MODE == "scaled":
        objective = loss_of(i)
        for p, g in zip(params, torch.autograd.grad(scaler.scale(objective), params)):
            p.grad = g
        scaler.unscale_(opt)
    elif MODE == "probe":
        grads = torch.autograd.grad(loss_of(i), params)
        scale = 0.05 / torch.stack([g.norm() for g in grads]).norm()
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g * scale)
        objective = loss_of(i)
        objective.backward()
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(g * scale)
    gn = params[0].grad.norm().item()
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    print("step", step, repr(objective.item()), repr(gn))
