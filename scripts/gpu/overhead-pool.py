#!/usr/bin/env python3
"""Pooled healthy-path cost from several scripts/gpu/gpu-overhead.sh runs.

    scripts/gpu/overhead-pool.py [--base VARIANT] DIR [DIR...]

Each round of each run gives one paired ratio per message size (busbw with R2CC /
without, the two measured back to back); this prints, per size, how many rounds,
their median, their geometric mean and its 95 % bootstrap interval (4000 resamples,
fixed seed), for R2CC (R2CC_MODE=2) and, where the runs have them, the pass-through
control (R2CC_MODE=0: the library loaded, doing nothing) and another build of the
library (R2CC_LIB_B, "r2cc-b"; R2CC_LIBS, "r2cc-NAME"). The control shows how far the fabric alone moves the
ratio at that size. --base VARIANT divides by that variant of the same round instead of
plain (r2cc-mode0, say: what R2CC's armed path costs over the library doing nothing).
"""
import glob
import math
import os
import random
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scenarios"))
from results import last_rows  # noqa: E402  (the project's one reader of result rows)


def rows(path):
    """size -> busbw (out of place) of the last sweep in an r2cc-perf log."""
    return {size: r["oop_bw"] for size, r in last_rows(path).items() if r["oop_bw"] is not None}


def main(args):
    base_v = "plain"
    if args[:1] == ["--base"] and len(args) > 1:
        base_v, args = args[1], args[2:]
    dirs = args
    if not dirs:
        sys.exit(__doc__.strip())
    ratios = {}  # (variant, size) -> [ratio per round]
    if not any(re.fullmatch(rf"overhead-{re.escape(base_v)}-\d+\.log", os.path.basename(f))
               for d in dirs for f in glob.glob(f"{d}/overhead-*.log")):
        sys.exit(f"overhead-pool.py: --base {base_v}: no overhead-{base_v}-N.log in "
                 f"{' '.join(dirs)} (a variant of gpu-overhead.sh's logs: plain, r2cc, "
                 "r2cc-mode0, r2cc-b or r2cc-NAME)")
    for d in dirs:
        for plain in glob.glob(f"{d}/overhead-{base_v}-*.log"):
            m = re.fullmatch(rf".*/overhead-{re.escape(base_v)}-(\d+)\.log", plain)
            if not m:  # r2cc-mode0's logs when the base is r2cc
                continue
            r = m.group(1)
            base = rows(plain)
            for other_log in glob.glob(f"{d}/overhead-*-{r}.log"):
                v = re.search(r"overhead-(.+)-\d+\.log$", other_log).group(1)
                if v == base_v:
                    continue
                other = rows(other_log)
                for size, bw in other.items():
                    if base.get(size):
                        ratios.setdefault((v, size), []).append(bw / base[size])
    rng = random.Random(1)
    if base_v != "plain":
        print(f"# each ratio: the variant / {base_v} of the same round")
    print(f"{'bytes':>12} {'variant':>10} {'rounds':>6} {'median':>7} {'geomean':>8} {'95% interval':>16}")
    for (v, size) in sorted(ratios, key=lambda k: (k[1], k[0])):
        rs = ratios[(v, size)]
        logs = [math.log(x) for x in rs]
        gm = math.exp(statistics.mean(logs))
        boot = sorted(math.exp(statistics.mean(rng.choice(logs) for _ in logs)) for _ in range(4000))
        print(f"{size:>12} {v:>10} {len(rs):>6} {statistics.median(rs):>7.3f} {gm:>8.3f} "
              f"  [{boot[99]:.3f}, {boot[3899]:.3f}]")


if __name__ == "__main__":
    main(sys.argv[1:])
