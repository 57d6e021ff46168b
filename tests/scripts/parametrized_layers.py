"""An MLP whose layers keep their weights in parametrizations (weight_norm's magnitude and
direction, orthogonal's, spectral_norm's: the parameters are named
``N.parametrizations.weight.original*``); with the argument ``prune``, plain layers instead,
the first two pruned by magnitude at step 4 (torch.nn.utils.prune: ``N.weight_orig`` and a
mask).  SGD with momentum, 8 steps."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.prune as prune
from torch.nn.utils import parametrizations

pruned = sys.argv[1:] == ["prune"]
torch.manual_seed(0)
layers = [nn.Linear(10, 64), nn.Linear(64, 64), nn.Linear(64, 4)]
if not pruned:
    layers = [parametrizations.weight_norm(layers[0]), parametrizations.orthogonal(layers[1]),
              parametrizations.spectral_norm(layers[2])]
model = nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2])
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = torch.Generator().manual_seed(1)
inputs = torch.randn(256, 10, generator=data)
targets = (inputs[:, :4] * 2).argmax(1)
for step, rows in enumerate(torch.randperm(256, generator=data).split(32)):
    if pruned and step == 4:
        for m in (model[0], model[2]):
            prune.l1_unstructured(m, "weight", amount=0.5)
    loss = F.cross_entropy(model(inputs[rows]), targets[rows])
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("step", step, repr(loss.item()))
