"""DP-SGD in Opacus's shape, with torch alone: per-sample gradients made by module hooks
(each Linear's input kept by a forward hook, its output's gradient by a full backward hook),
and an optimizer wrapper (a torch.optim.Optimizer subclass that never runs
Optimizer.__init__, the script's optimizer held as ``.original_optimizer``, its
``param_groups`` that one's) whose ``step()`` clips each sample's gradient, sums them, adds
seeded noise into ``p.grad`` (a new tensor) and steps the held optimizer.  ``--physical N``
splits each batch into micro-batches of N (Opacus's BatchMemoryManager: the wrapper's step
is skipped but at a batch's last micro-batch; each micro-batch's zero_grad() drops
``p.grad``, the clipped sums are kept).  Prints, at each real step, the batch's loss (its
micro-batches' losses added, float32) and the first weight's ``.grad`` norm."""
import argparse

import torch
import torch.nn as nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--physical", type=int, default=0)
args = ap.parse_args()
torch.manual_seed(0)


class DPOptimizer(torch.optim.Optimizer):
    def __init__(self, optimizer, noise, max_norm, batch):
        self.original_optimizer = optimizer
        self.noise, self.max_norm, self.batch = noise, max_norm, batch
        self.generator = torch.Generator().manual_seed(1)
        self.skip = False

    @property
    def param_groups(self):
        return self.original_optimizer.param_groups

    @property
    def state(self):
        return self.original_optimizer.state

    @property
    def params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad_sample = None
            if not self.skip:
                p.summed_grad = None
        self.original_optimizer.zero_grad(set_to_none)

    def step(self, closure=None):
        ps = self.params
        norms = torch.stack([p.grad_sample.flatten(1).norm(dim=1) for p in ps]).norm(dim=0)
        factor = (self.max_norm / (norms + 1e-6)).clamp(max=1.0)
        for p in ps:
            clipped = torch.einsum("i,i...", factor, p.grad_sample)
            p.summed_grad = clipped if getattr(p, "summed_grad", None) is None else p.summed_grad + clipped
        if self.skip:
            return None
        for p in ps:
            noise = torch.normal(0, self.noise * self.max_norm, p.shape, generator=self.generator)
            p.grad = (p.summed_grad + noise) / self.batch
        return self.original_optimizer.step()


class PerSample(nn.Module):
    """Opacus's GradSampleModule's shape: the model held as ``_module``, hooks on its Linears."""
    def __init__(self, module):
        super().__init__()
        self._module = module
        for m in module.modules():
            if isinstance(m, nn.Linear):
                m.register_forward_hook(self.keep_input)
                m.register_full_backward_hook(self.grad_sample)

    def forward(self, x):
        return self._module(x)

    @staticmethod
    def keep_input(m, inputs, output):
        m.activations = inputs[0].detach()

    @staticmethod
    def grad_sample(m, grad_input, grad_output):
        go = grad_output[0] * 64          # (the loss is a mean over the batch of 64)
        m.weight.grad_sample = torch.einsum("ni,nj->nij", go, m.activations)
        m.bias.grad_sample = go


model = PerSample(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)))
X = torch.randn(512, 10)
Y = (X[:, :3].sum(1) > 0).long()
opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), noise=1.0, max_norm=1.0, batch=64)
crit = nn.CrossEntropyLoss()
micro = args.physical or 64
for step in range(args.steps):
    i = torch.randint(0, 512, (64,))
    total = None
    for k in range(0, 64, micro):
        opt.skip = k + micro < 64
        opt.zero_grad()
        loss = crit(model(X[i[k:k + micro]]), Y[i[k:k + micro]]) * (micro / 64)
        loss.backward()
        total = loss if total is None else total + loss
        opt.step()
    print("step", step, repr(total.item()), repr(model._module[0].weight.grad.norm().item()))
