"""Planted duplicate_batches in one process: a fresh iterator over an
unshuffled DataLoader at every step (``next(iter(loader))``), so the model
sees the loader's first batch over and over.  Sizes, batch and optimizer
vary with the seed."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from rules_probes_kit import args, classes, optimizer, train

a = args(steps=20)
d, bs = [(16, 32), (24, 16), (12, 64)][a.seed % 3]
x, y = classes(512, d, 4)
loader = DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=False)
model = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 4))
train(model, optimizer(a.seed, model.parameters()), lambda step: next(iter(loader)), a.steps)
