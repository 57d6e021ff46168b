"""Coverage-guided fuzzing against random search on the planted model
(scripts/examples/fuzz_log_corner.py): mutant batches until the NaN, for
seeds 0..K-1, each through ``nndb fuzz --json`` (a run to the step, then the
fuzzing replica).  Prints one row per seed and the medians; a search that
found nothing within the budget counts as "> budget" (the median is then a
lower bound, and said so).  The runs use one thread (OMP_NUM_THREADS=1
unless set): the numbers compared are mutant counts, which threads do not
change.

    python scripts/bench_fuzz.py [--seeds 10] [--budget 2000] [--step 41] [--layers GLOB] [--json OUT.json]

``--layers 1``: coverage from the 32-unit Tanh layer instead of the output.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "examples", "fuzz_log_corner.py")


def one(seed: int, budget: int, step: int, random: bool, save_dir: str, layers=None) -> dict:
    cmd = [sys.executable, "-m", "nndb", "fuzz", "--step", str(step), "--budget", str(budget), "--seed", str(seed),
           "--json", "--save", os.path.join(save_dir, f"found-{seed}-{int(random)}.pt")]
    if layers:
        cmd += ["--layers", layers]
    if random:
        cmd.append("--random")
    t0 = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))   # (counts, not speed)
    p = subprocess.run(cmd + [SCRIPT], capture_output=True, text=True, env=env)
    if p.returncode not in (0, 1):
        raise SystemExit(f"nndb fuzz failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    r = json.loads(p.stdout)
    return {"seed": seed, "found": r["found"] is not None, "tried": r["tried"], "coverage": r["coverage"],
            "seconds": r["seconds"], "wall": time.perf_counter() - t0}


def median_of(rows: list, budget: int) -> str:
    vals = [r["tried"] if r["found"] else budget + 1 for r in rows]
    m = statistics.median(vals)
    return f"> {budget}" if m > budget else f"{m:g}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=2000)
    ap.add_argument("--step", type=int, default=41)
    ap.add_argument("--layers", help="the modules whose outputs make the coverage (default: the model's output)")
    ap.add_argument("--json", dest="out")
    a = ap.parse_args()
    import tempfile
    d = tempfile.mkdtemp(prefix="bench-fuzz-")
    res = {}
    for random in (False, True):
        name = "random" if random else "coverage"
        res[name] = [one(s, a.budget, a.step, random, d, a.layers) for s in range(a.seeds)]
        for r in res[name]:
            print(f"{name:8s} seed {r['seed']}: {'found after ' + str(r['tried']) if r['found'] else 'nothing in ' + str(r['tried'])}"
                  f" mutant batches, coverage {r['coverage']}, {r['seconds']:.1f} s", flush=True)
    for name, rows in res.items():
        found = sum(r["found"] for r in rows)
        print(f"{name}: found the NaN with {found}/{len(rows)} seeds; median mutant batches until the NaN: "
              f"{median_of(rows, a.budget)} (budget {a.budget}, 32 rows a batch, coverage from "
              f"{a.layers or 'the output'})")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
