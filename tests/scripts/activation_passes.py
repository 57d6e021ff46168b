"""Loops whose steps run forward passes no backward goes through (MODE):
  validate  a validation pass under model.eval() without no_grad() every 5 steps
  target    a DQN-like target network called with autograd on, its output detached
  rollout   rollouts collected with autograd on (a policy called per env step,
            outputs detached), then one update pass
  raised    every 4th step, a forward that raises (a batch of the wrong width),
            caught by the script before the step's pass
  fallback  a model whose forward calls a layer that raises and catches it
  adapt     test-time adaptation: a wrapper module whose forward runs the model,
            its loss's backward and the optimizer's step, then returns the output
  saliency  a saliency map of a validation batch every 5 steps: its input's
            gradient by torch.autograd.grad (x.requires_grad_(), no parameter)
and passes a backward does go through, which stay the step's:
  twopass   two forward passes per step, one loss of both
  accum     gradient accumulation: four micro-batches, a backward each
  gan       a generator's output detached for the discriminator's step and used
            again for the generator's
  gradapply the step's gradients by torch.autograd.grad of the parameters, written
            to their .grad for the optimizer's step (no backward())
Each step prints, under no_grad() (which nndb does not record), what the trained
model's first layer outputs over the step's training input(s): their elements
and norm, which the trace's activation rows of layer 'net.0' must equal.
"""
import sys

import torch
import torch.nn as nn

MODE = sys.argv[1]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 24
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self, d_in=8, d_out=2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 16), nn.ReLU(), nn.Linear(16, d_out))

    def forward(self, x):
        return self.net(x)


def first_layer(model, *xs):
    layer = model.net[0]
    with torch.no_grad():                      # (no module call: the layer's function)
        outs = [nn.functional.linear(x, layer.weight, layer.bias) for x in xs]
    n = sum(o.numel() for o in outs)
    norm = torch.cat([o.reshape(-1) for o in outs]).double().norm().item()
    return n, norm


def say(step, n, norm, loss):
    print(f"step {step} acts {n} norm {norm:.9g} loss {loss:.9g}")


X, Y = torch.randn(64, 8), torch.randint(0, 2, (64,))
crit = nn.CrossEntropyLoss()
if MODE == "gan":
    G, D = Net(4, 8), Net(8, 1)
    optG, optD = torch.optim.Adam(G.parameters(), 1e-3), torch.optim.Adam(D.parameters(), 1e-3)
    bce = nn.BCEWithLogitsLoss()
    for step in range(STEPS):
        z = torch.randn(32, 4)
        n, norm = first_layer(G, z)
        fake = G(z)
        optD.zero_grad()
        lossD = bce(D(X[:32]), torch.ones(32, 1)) + bce(D(fake.detach()), torch.zeros(32, 1))
        lossD.backward()
        optD.step()
        optG.zero_grad()
        lossG = bce(D(fake), torch.ones(32, 1))
        lossG.backward()
        optG.step()
        say(step, n, norm, lossG.item())
    sys.exit(0)

class Fallback(Net):
    def forward(self, x):
        try:
            self.net[0](x[:, :5])                # (the wrong width: raises, caught here)
        except RuntimeError:
            pass
        return self.net(x)


model = Fallback() if MODE == "fallback" else Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
if MODE == "adapt":
    class Adapt(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x, y):
            out = self.model(x)
            loss = crit(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()                           # (the step closes inside this forward)
            return out, loss

    adapt = Adapt(model)
    for step in range(STEPS):
        n, norm = first_layer(model, X)
        out, loss = adapt(X, Y)
        say(step, n, norm, loss.item())
    sys.exit(0)
target = Net()
target.load_state_dict(model.state_dict())
XV, YV = torch.randn(512, 8) * 100, torch.randint(0, 2, (512,))
for step in range(STEPS):
    model.train()
    opt.zero_grad()
    if MODE == "accum":
        chunks = X.chunk(4), Y.chunk(4)
        n, norm = first_layer(model, *chunks[0])
        total = 0.0
        for x, y in zip(*chunks):
            loss = crit(model(x), y) / 4
            loss.backward()
            total += loss.item()
        opt.step()
        say(step, n, norm, total)
        continue
    if MODE == "raised" and step % 4 == 1:
        try:
            model(torch.randn(3, 5))
        except RuntimeError:
            pass
    if MODE == "rollout":
        for t in range(6):                       # acting: autograd on, the action detached
            probs = model(torch.randn(1, 8)).softmax(-1)
            torch.multinomial(probs.detach(), 1)
    n, norm = first_layer(model, X, X.flip(0)) if MODE == "twopass" else first_layer(model, X)
    out = model(X)
    loss = crit(out, Y)
    if MODE == "twopass":
        loss = loss + crit(model(X.flip(0)), Y.flip(0))
    if MODE == "target":
        q_next = target(X).max(1)[0].detach()    # a target network with autograd on, detached
        loss = loss + 0.01 * (out.max(1)[0] - q_next).pow(2).mean()
    if MODE == "gradapply":
        for p, g in zip(model.parameters(), torch.autograd.grad(loss, model.parameters())):   # (a generator)
            p.grad = g
    else:
        loss.backward()
    opt.step()
    say(step, n, norm, loss.item())
    if MODE == "saliency" and step % 5 == 4:
        xv = XV[:72].clone().requires_grad_()
        g, = torch.autograd.grad(model(xv).sum(), xv)      # autograd on, the input's gradient only
        print(f"saliency {g.abs().mean().item():.6f}")
    if MODE == "validate" and step % 5 == 4:
        model.eval()
        val = crit(model(XV), YV)                # no no_grad(): autograd on, no backward
        print(f"val {val.item():.6f}")
