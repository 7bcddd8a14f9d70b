#!/usr/bin/env python3
"""Cost-model samples (r2cc-fit-cost's CSV) from benchmark logs.

    scripts/cost-samples.py [--header] STRATEGY NODES NICS FAILED LOG [LOG...]

STRATEGY is healthy, backup, balance or ar2; NODES, NICS and FAILED describe the
cluster the logs were measured on (NICS per node, FAILED on the degraded node).
Every result row of an r2cc-perf or nccl-tests AllReduce log (float; the last sweep
when a log has several) becomes one sample with its out-of-place time. For ar2, rows below R2CC_AR_MIN_BYTES (the
environment's, default 16 MiB) ran as Balance and are written as balance rows.
Rows with a #wrong other than 0 are refused: a wrong result is not a timing.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios"))
from results import last_rows  # noqa: E402  (the project's one reader of result rows)


def main(argv):
    header = argv[:1] == ["--header"]
    if header:
        argv = argv[1:]
    if len(argv) < 5 or argv[0] not in ("healthy", "backup", "balance", "ar2"):
        sys.exit(__doc__.strip())
    strat, nodes, nics, failed = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    min_ar2 = int(os.environ.get("R2CC_AR_MIN_BYTES", 16 << 20))
    if header:
        print("strategy,n,k,f,bytes,time_us,chunks")
    for path in argv[4:]:
        for size, r in sorted(last_rows(path).items()):
            if r["oop_wrong"] != 0:
                sys.exit(f"{path}: #wrong {r['oop_wrong']} at {size} bytes: not a timing")
            if r["oop_time"] is None:
                continue
            s = "balance" if strat == "ar2" and size < min_ar2 else strat
            print(f"{s},{nodes},{nics},{failed if s != 'healthy' else 0},{size},{r['oop_time']:.2f},"
                  f"{os.environ.get('R2CC_AR_STAGE2_CHUNKS', '4')}")


if __name__ == "__main__":
    main(sys.argv[1:])
