"""A regression loop fed by a DataLoader with a worker process: nndb cannot
fork it safely, so `fuzz` refuses at its stop (tests/test_fuzz.py)."""
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=1, persistent_workers=True)
for x, y in loader:
    loss = (model(x) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
