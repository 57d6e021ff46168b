"""Two models, each with its own optimizer: a critic stepped three times for
each generator step (WGAN's shape).  Step 0 is the critic's first step(),
before the generator's optimizer has stepped: only then does nndb know there
are two models and name their parameters ``critic.weight``, ``gen.weight``.
Prints the critic's first gradient's sum (float64 of the float32 values)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
gen, critic = nn.Linear(2, 4), nn.Linear(4, 1)
opt_g = torch.optim.SGD(gen.parameters(), lr=0.01)
opt_c = torch.optim.SGD(critic.parameters(), lr=0.01)
first = []


def note_first(opt, args, kwargs):
    if not first:
        first.append(critic.weight.grad.double().sum().item())


opt_c.register_step_pre_hook(note_first)
for it in range(2):
    for _ in range(3):
        opt_c.zero_grad()
        loss_c = critic(gen(torch.randn(5, 2)).detach()).mean() - critic(torch.randn(5, 4)).mean()
        loss_c.backward()
        opt_c.step()
    opt_g.zero_grad()
    loss_g = -critic(gen(torch.randn(5, 2))).mean()
    loss_g.backward()
    opt_g.step()
print("first", repr(first[0]))
