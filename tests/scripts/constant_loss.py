"""A loop whose loss is a constant, 10.8447 (in float32: 10.84469985961914), whatever
the weights: for a watch whose threshold lies within fmt's four digits of it."""
import torch

model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.ones(4, 3)
for step in range(2):
    opt.zero_grad()
    out = model(x)
    loss = (out - out.detach()).sum() + torch.tensor(10.8447)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.17g}")
