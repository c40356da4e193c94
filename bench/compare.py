"""The dispatch benchmark of two checkouts, side by side in one run.

A refactor promises "no slower": this runs ``bench/dispatch.py`` of each checkout (each with
its own API) in alternating processes, and prints every row's median µs per call for both
and their ratio. Alternating spreads the machine's noise over both sides alike.

    git worktree add /tmp/base <rev>
    python bench/compare.py /tmp/base . [--runs 8] [--rounds 5] [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROW = re.compile(r"^(?P<name>.+?)\s{2,}(?P<us>\d+\.\d+)\s+\d+\.\d+\s+-?\d+\.\d+$")


def run(tree: Path, rounds: int, calls: int) -> dict[str, float]:
    """One run of ``tree``'s dispatch benchmark: row name → µs per call."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree / 'plugins'}"}
    done = subprocess.run(
        [sys.executable, str(tree / "bench" / "dispatch.py"), "--rounds", str(rounds),
         "--calls", str(calls)],
        env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    rows = (ROW.match(line.strip()) for line in done.stdout.splitlines())
    return {m["name"].strip(): float(m["us"]) for m in rows if m is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("base", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--runs", type=int, default=8, help="processes per checkout")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    opts = parser.parse_args()
    trees = {"base": opts.base.resolve(), "new": opts.new.resolve()}
    samples: dict[str, dict[str, list[float]]] = {side: {} for side in trees}
    for i in range(opts.runs):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for side in order:
            for name, us in run(trees[side], opts.rounds, opts.calls).items():
                samples[side].setdefault(name, []).append(us)
    print(f"{opts.runs} alternating runs per checkout; median µs per call")
    print(f"{'case':<48}{'base':>9}{'new':>9}{'new/base':>10}")
    for name, base in samples["base"].items():
        new = samples["new"].get(name)
        if not new:
            continue
        b, n = statistics.median(base), statistics.median(new)
        print(f"{name:<48}{b:>9.2f}{n:>9.2f}{n / b:>9.3f}x")


if __name__ == "__main__":
    main()
