"""Train an MLP classifier that applies softmax before CrossEntropyLoss.

Planted bug: the model ends in nn.Softmax, but CrossEntropyLoss already applies
log_softmax, so probabilities are softmaxed twice; gradients are tiny and the
loss barely moves from ~ln(10) (it can never drop below ~1.46 for 10 classes).
"""
import argparse

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(1024, 32, generator=g)
    y = (x @ torch.randn(32, 10, generator=g)).argmax(dim=1)

    model = nn.Sequential(
        nn.Linear(32, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
        nn.Softmax(dim=1),
    )
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch_size,))
        optimizer.zero_grad()
        probs = model(x[idx])
        loss = criterion(probs, y[idx])
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
