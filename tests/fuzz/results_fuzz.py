#!/usr/bin/env python3
"""Coverage-guided fuzzing of the scenario result reader (scripts/scenarios/results.py).

  results_fuzz.py SECONDS [CORPUS_OUT] [CRASH_DIR]

Mutates the seed logs of tests/fuzz/corpus/results (bytes, lines, numbers, tokens the
reader looks for) and feeds each input to what reads a log or a fault plan: the result
rows, the NIC tables, `check`'s verdict, `table` and the plan parser. The reader may
refuse an input only with its own UserError; any other exception is a finding: the
input is saved to CRASH_DIR and the run fails; so is an input that takes more than
5 s (a hang). Inputs that reach new lines of
results.py (edges between consecutive lines, traced with sys.settrace) join the corpus.
The regression inputs of tests/fuzz/regress/results run first. Standard library only.
"""

import argparse
import contextlib
import io
import os
import random
import signal
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts", "scenarios"))
import results  # noqa: E402

TARGET = os.path.abspath(results.__file__)
TOKENS = [b"N/A", b"nan", b"inf", b"-1", b"1e999", b"99999999999999999999", b"#wrong",
          b"# Out of bounds values : 1 FAILED", b"float", b"sum", b"Iter", b"Time(ms)",
          b"mlx5_2_RX", b"mlx5_2_TX", b"NIC bytes per iteration (MB = 1e6 B) of node node0, "
          b"size 1024 B; source: softverbs", b"host:1:2 R2CC WARN x", b"\t", b"  ",
          b"Iter 1/10 START: allreduce 4 GiB", b"Iter 1/10 END: OK (elapsed 5.0 ms)",
          b"R2CC-AllReduce ran 3 times, 2 AllReduces ran as Balance", b"\xff\xfe", b"\x00"]
PLAN_SEEDS = [b"node0/mlx5_2=blackhole@4s", b"1/mlx5_0=flap:200@1500ms",
              b"node0/mlx5_3=slow:10@2.5s node1/mlx5_0=up@9000"]

edges = set()


class Hang(Exception):
    pass


def on_alarm(sig, frame):
    raise Hang("the reader took more than 5 s on one input")


def tracer(frame, event, arg):
    if frame.f_code.co_filename != TARGET:
        return None
    last = [None]

    def local(f, ev, a):
        if ev == "line":
            edges.add((last[0], f.f_lineno))
            last[0] = f.f_lineno
        return local
    return local


def mutate(data, rng, corpus):
    data = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(8)
        pos = rng.randint(0, len(data))
        if op == 0 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[pos:pos] = rng.choice(TOKENS)
        elif op == 2 and data:
            del data[pos:pos + rng.randint(1, 32)]
        elif op == 3:
            lines = bytes(data).split(b"\n")
            if lines:
                i = rng.randrange(len(lines))
                lines.insert(rng.randrange(len(lines) + 1), lines[i])
                data = bytearray(b"\n".join(lines))
        elif op == 4:
            lines = bytes(data).split(b"\n")
            if len(lines) > 1:
                del lines[rng.randrange(len(lines))]
                data = bytearray(b"\n".join(lines))
        elif op == 5 and data:
            # a number somewhere replaced by an extreme one
            i = rng.randrange(len(data))
            while i < len(data) and not chr(data[i]).isdigit():
                i += 1
            data[i:i + 1] = rng.choice([b"0", b"-0", b"4294967296", b"1e308", b"00", b"9" * 40])
        elif op == 6 and corpus:
            other = rng.choice(corpus)
            cut = rng.randint(0, len(other))
            data[pos:] = other[cut:]
        else:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(data[:65536])


def run_one(data, tmp):
    """Every reader entry point on one input; only UserError may come out."""
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines()
    results.read_rows(lines)
    results.read_nic_tables(lines)
    path = os.path.join(tmp, "in.log")
    with open(path, "wb") as f:
        f.write(data)
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        for declared in ("", "mlx5_2"):
            a = argparse.Namespace(log=path, label="fuzz", status=0, declared_nic=declared,
                                   require_placement=bool(declared))
            try:
                results.cmd_check(a)
            except results.UserError:
                pass
        try:
            results.cmd_table(argparse.Namespace(args="", runs=["a=" + path, "b=" + path]))
        except results.UserError:
            pass
        try:
            results.parse_plan(text.split()[:8], 4, ["mlx5_0", "mlx5_2", "mlx5_3"])
        except results.UserError:
            pass
        results.last_rows(path)


def load_dir(d):
    out = []
    if os.path.isdir(d):
        for n in sorted(os.listdir(d)):
            with open(os.path.join(d, n), "rb") as f:
                out.append(f.read())
    return out


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5
    out_dir = sys.argv[2] if len(sys.argv) > 2 else ""
    crash_dir = sys.argv[3] if len(sys.argv) > 3 else tempfile.gettempdir()
    rng = random.Random(int(os.environ.get("FUZZ_SEED", time.time_ns())))
    regress = load_dir(os.path.join(HERE, "regress", "results"))
    corpus = load_dir(os.path.join(HERE, "corpus", "results")) + PLAN_SEEDS
    if out_dir:
        corpus += load_dir(out_dir)
    execs, failures = 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        sys.settrace(tracer)
        start = time.monotonic()
        queue = regress + list(corpus)
        while queue or time.monotonic() - start < seconds:
            data = queue.pop(0) if queue else mutate(rng.choice(corpus), rng, corpus)
            before = len(edges)
            signal.signal(signal.SIGALRM, on_alarm)
            signal.alarm(5)
            try:
                run_one(data, tmp)
                signal.alarm(0)
            except Exception:
                signal.alarm(0)
                failures += 1
                sys.settrace(None)
                os.makedirs(crash_dir, exist_ok=True)
                name = os.path.join(crash_dir, "results-crash-%d" % failures)
                with open(name, "wb") as f:
                    f.write(data)
                print("results_fuzz: %s on input saved as %s" % (
                    traceback.format_exc().strip().splitlines()[-1], name))
                traceback.print_exc()
                sys.settrace(tracer)
                if failures >= 5:
                    break
            execs += 1
            if len(edges) > before and data not in corpus:
                corpus.append(data)
                if out_dir:
                    os.makedirs(out_dir, exist_ok=True)
                    with open(os.path.join(out_dir, "in-%06d" % len(corpus)), "wb") as f:
                        f.write(data)
        sys.settrace(None)
    secs = time.monotonic() - start
    print("fuzz results: %d execs in %.0f s (%.0f/s), cov %d line edges of results.py, "
          "corpus %d, %d crashes" % (execs, secs, execs / max(secs, 1e-9), len(edges),
                                     len(corpus), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
