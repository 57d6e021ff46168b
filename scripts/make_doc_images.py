#!/usr/bin/env python3
"""Regenerate the pictures under docs/images/ from small recorded runs.

    python scripts/make_doc_images.py

Each picture is drawn by ``nndb plot`` from a trace this script records with
``nndb run --batch`` (in a temporary directory) and docs/inspect.md shows:

  grad_heatmap.png   the gradient norm per layer of a 12-layer sigmoid MLP
                     (tests/scripts/planted_vanishing_gradient_deep_sigmoid.py):
                     the first layers' gradients ten orders below the last's
  loss.png           scripts/examples/nan_lr.py: the loss runs away, goes Inf, then NaN
  update_ratio.png   scripts/examples/mlp.py: update/weight ratio per layer against 1e-3
  weight_history.png scripts/examples/mlp.py: the first layer's weight statistics

Needs the plot extra (pip install 'nndb[plot]').  About half a minute.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "images")

RUNS = {
    "vanishing": ([os.path.join(ROOT, "tests", "scripts", "planted_vanishing_gradient_deep_sigmoid.py"),
                   "--steps", "24"]),
    "nan_lr": [os.path.join(ROOT, "scripts", "examples", "nan_lr.py"), "--steps", "16"],
    "mlp": [os.path.join(ROOT, "scripts", "examples", "mlp.py"), "--steps", "120"],
}
PICTURES = [
    ("grad_heatmap.png", "vanishing", ["--what", "heatmap", "--kind", "grad", "--glob", "*weight"]),
    ("loss.png", "nan_lr", ["--what", "loss"]),
    ("update_ratio.png", "mlp", ["--what", "ratio"]),
    ("weight_history.png", "mlp", ["--what", "history", "--glob", "0.weight"]),
]


def nndb(*args: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-m", "nndb", *args], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode not in (0, 1):          # (nan_lr's run ends fine; a planted bug is not a failure)
        sys.exit(f"nndb {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        traces = {}
        for name, argv in RUNS.items():
            traces[name] = os.path.join(tmp, f"{name}.h5")
            nndb("run", "--batch", "-q", "--replica", "off", "--trace", traces[name], *argv)
        for file, run, args in PICTURES:
            out = os.path.join(OUT, file)
            if os.path.exists(out):     # (the committed picture: nndb plot writes over none it did not stamp)
                os.remove(out)
            nndb("plot", traces[run], *args, "-o", out)
            print(os.path.relpath(out, ROOT))


if __name__ == "__main__":
    main()
