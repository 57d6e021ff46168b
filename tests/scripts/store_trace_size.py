"""Bytes of trace per recorded step for a model of many small layers
(tests/scripts/store_many_layers.py), as README states them.

python tests/scripts/store_trace_size.py [--layers 2000] [--steps 40 200]

Runs ``nndb run --batch`` twice (each number of steps) and prints the file
size per step of each run and the marginal bytes per step between them (what
a long run adds per step, without the fixed cost of the metadata and the
series list)."""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def trace_bytes(layers: int, steps: int, where: str) -> int:
    path = os.path.join(where, f"size_{steps}.h5")
    subprocess.run([sys.executable, "-m", "nndb", "run", "--batch", "--quiet", "--trace", path,
                    os.path.join(HERE, "store_many_layers.py"), "--layers", str(layers), "--steps", str(steps)],
                   check=True, stdout=subprocess.DEVNULL)
    return os.path.getsize(path)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2000)
    p.add_argument("--steps", type=int, nargs=2, default=[40, 200])
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as where:
        (a, b) = args.steps
        size_a, size_b = trace_bytes(args.layers, a, where), trace_bytes(args.layers, b, where)
    print(f"{args.layers} Linear layers: {size_a} bytes for {a} steps ({size_a // a} per step), "
          f"{size_b} for {b} ({size_b // b} per step); {(size_b - size_a) // (b - a)} bytes per added step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
