#!/usr/bin/env python3
"""Turns saved benchmark logs into PNG charts and a text summary.

Reads the output of build/bin/r2cc-perf and of NVIDIA's nccl-tests (the same result rows;
everything else in a log -- NCCL/R2CC log lines, '#' comments, warnings -- is skipped) and
finds in each log:

  * sweeps: the result rows `size count type redop root  time algbw busbw #wrong  (x2)`,
    one sweep per (type, redop, root) run of increasing sizes;
  * iteration tables: r2cc-perf's `--iters-table` lines (`Iter i/N START`,
    `Iter i/N END: OK (elapsed X ms)`) and the NIC table that follows `[Rank 0] NIC bytes
    per iteration` (`Iter Time(ms) mlx5_0_RX ... mlx5_0_TX ...`), or the seed's
    `IB RX per-iteration` table.

It writes busbw.png (busbw by message size, out-of-place and in-place, one line per sweep,
rows with a nonzero #wrong in red) and one iters-<run>.png per iteration table (time per
iteration over the bytes each NIC received and sent), then prints what it plotted, the
flagged rows and iterations, and a table of busbw by size in the format of the seed's
comparison (`bytes | run1 | run2 ...`, cells `oop/ip (wrong a/b)`).

Exit status: 0 charts written (wrong results are reported, not an error), 1 a log had
nothing to plot (the others are still plotted), 2 usage or unreadable file, 3 no
matplotlib. Needs matplotlib (Debian/Ubuntu: python3-matplotlib), drawn with Agg.
"""

import argparse
import os
import re
import statistics
import sys

PROG = "plot.py"

# A result row: size, count, type, then redop/root (absent in old nccl-tests), then
# out-of-place and in-place (time algbw busbw #wrong). The type must be a word so that
# the all-numeric rows of a NIC table never match.
ROW_HEAD = re.compile(r"^\s*(\d+)\s+(\d+)\s+([A-Za-z][A-Za-z0-9_]*)\s*(.*)$")
NIC_CAPTION = re.compile(r"NIC bytes per iteration.*?of node (\S+?),\s*(.*?);\s*source:\s*(\S+)")
SEED_CAPTION = re.compile(r"\b(IB|NIC) (RX|TX|RX/TX) per-iteration")
NIC_HEADER = re.compile(r"^\s*(?:\[Rank \d+\]\s*)?Iter\s+(.*)$")
NIC_ROW = re.compile(r"^\s*(\d+)\s+([-+0-9.eE\s]+?)(?:\s+[^-+0-9.\s].*)?$")
ITER_START = re.compile(r"\bIter\s+(\d+)/(\d+)\s+START\b:?\s*(.*)$")
ITER_END = re.compile(r"\bIter\s+(\d+)/(\d+)\s+END:\s*(.*?)\(elapsed\s+([0-9.]+)\s*ms\)")
WRONG_ELEMS = re.compile(r"([0-9.]+)\s+wrong elements")
R2CC_TITLE = re.compile(r"^#\s*r2cc-perf\s+(\w+):")
NCCLTESTS_TITLE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(\w+)")
# What in a log line during an iteration is worth pointing at on the chart.
EVENT = re.compile(r"disconnect|\bdown\b|repair|migrat|failover|black.?hole|port error|"
                   r"\bWARN\b", re.IGNORECASE)
STRUCTURE = re.compile(r"^\s*#|\bIter\s+\d+/\d+\s+(START|END)\b|TEST (PASS|FAIL)")

# tab10 without its red, which is kept for wrong results
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
FLAG_BAR, FLAG_SPAN = "#6a3d9a", "#f0e442"

COLLECTIVES = {"all_reduce_perf": "AllReduce", "all_gather_perf": "AllGather",
               "reduce_scatter_perf": "ReduceScatter", "broadcast_perf": "Broadcast",
               "reduce_perf": "Reduce", "alltoall_perf": "AllToAll",
               "sendrecv_perf": "SendRecv", "gather_perf": "Gather",
               "scatter_perf": "Scatter", "hypercube_perf": "HyperCube"}


class UserError(Exception):
    """A problem with what the user gave us: reported in one line, never a traceback."""

    def __init__(self, msg, status=2):
        super().__init__(msg)
        self.status = status


def parse_num(tok):
    """A float, or None for N/A and anything else that is not a number."""
    try:
        return float(tok)
    except ValueError:
        return None


def parse_wrong(tok):
    """#wrong as an int; None when N/A (no check) or an old nccl-tests error value."""
    return int(tok) if tok.isdigit() else None


class Half:
    """One of the two result groups of a row (out-of-place or in-place)."""

    def __init__(self, toks):
        self.time, self.algbw, self.busbw = (parse_num(t) for t in toks[:3])
        self.wrong = parse_wrong(toks[3])

    def wrong_str(self):
        return "N/A" if self.wrong is None else str(self.wrong)

    def busbw_str(self):
        return "N/A" if self.busbw is None else "%.2f" % self.busbw


class Row:
    def __init__(self, size, count, dtype, redop, root, oop, ip, lineno):
        self.size, self.count, self.dtype = size, count, dtype
        self.redop, self.root = redop, root
        self.oop, self.ip = oop, ip
        self.lineno = lineno

    @property
    def key(self):
        return (self.dtype, self.redop, self.root)

    @property
    def is_wrong(self):
        return bool(self.oop.wrong) or bool(self.ip.wrong)

    def cell(self):
        return "%s/%s (wrong %s/%s)" % (self.oop.busbw_str(), self.ip.busbw_str(),
                                        self.oop.wrong_str(), self.ip.wrong_str())


def parse_row(line, lineno):
    """A Row, 'partial' for a row whose results never came (the run stopped), or None."""
    m = ROW_HEAD.match(line)
    if not m:
        return None
    toks = m.group(4).split()
    if len(toks) < 8:
        # `size count type redop root` and nothing after it: the run died in this size.
        if len(toks) <= 2 and all(re.fullmatch(r"-?\w+", t) for t in toks):
            return "partial"
        return None
    prefix, res = toks[:-8], toks[-8:]
    if len(prefix) > 2:
        return None
    for t in (res[0], res[1], res[2], res[4], res[5], res[6]):
        if parse_num(t) is None and t != "N/A":
            return None
    if not all(t == "N/A" or parse_num(t) is not None for t in (res[3], res[7])):
        return None
    redop = prefix[0] if prefix else "none"
    root = prefix[1] if len(prefix) > 1 else "-1"
    return Row(int(m.group(1)), int(m.group(2)), m.group(3), redop, root,
               Half(res[:4]), Half(res[4:]), lineno)


class Sweep:
    def __init__(self, run, collective):
        self.run = run
        self.collective = collective
        self.rows = []
        self.label = run.label

    @property
    def key(self):
        return self.rows[0].key

    def describe(self):
        dtype, redop, root = self.key
        what = " ".join(x for x in (self.collective, dtype) if x)
        if redop != "none":
            what += " " + redop
        if root != "-1":
            what += " root " + root
        return what


class IterTable:
    """Per-iteration times, and the bytes per NIC when the log has a NIC table."""

    def __init__(self, run):
        self.run = run
        self.label = run.label
        self.title = ""
        self.n = 0
        self.ms = {}          # iteration -> ms
        self.status = {}      # iteration -> 'OK' / 'WRONG'
        self.wrong = {}       # iteration -> wrong elements
        self.events = {}      # iteration -> first notable log line during it
        self.columns = []     # NIC columns, in log order
        self.nic = {}         # column -> {iteration: MB}

    def iterations(self):
        its = set(self.ms)
        for col in self.nic.values():
            its.update(col)
        return sorted(its)

    def rx_cols(self):
        return [c for c in self.columns if not c.upper().endswith("_TX")]

    def tx_cols(self):
        return [c for c in self.columns if c.upper().endswith("_TX")]

    def flags(self):
        """Iterations that stand out: wrong, slow, traffic moved between NICs, or an event."""
        its = self.iterations()
        out = {i: [] for i in its}
        times = [self.ms[i] for i in its if i in self.ms]
        med = statistics.median(times) if times else 0
        for i in its:
            if self.status.get(i) == "WRONG":
                out[i].append("wrong result")
            if med > 0 and self.ms.get(i, 0) > 1.25 * med:
                out[i].append("slow (%.0f ms, median %.0f)" % (self.ms[i], med))
        # A NIC's share of the iteration's bytes moving by more than 10 points from the
        # previous iteration is what a failover looks like in the table.
        for cols in (self.rx_cols(), self.tx_cols()):
            prev = None
            for i in its:
                vals = [self.nic[c].get(i, 0.0) for c in cols]
                total = sum(vals)
                share = [v / total for v in vals] if total > 0 else None
                if share and prev and max(abs(a - b) for a, b in zip(share, prev)) > 0.10:
                    if "traffic moved between NICs" not in out[i]:
                        out[i].append("traffic moved between NICs")
                if share:
                    prev = share
        for i, ev in self.events.items():
            if i in out:
                out[i].append("log: " + ev)
        return {i: f for i, f in out.items() if f}


class Run:
    def __init__(self, label, path):
        self.label, self.path = label, path
        self.sweeps, self.tables = [], []
        self.partial = []     # line numbers of rows without results
        self.oob_failed = False


def read_log(label, path):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UserError("cannot read %s: %s" % (path, e.strerror or e))
    run = Run(label, path)
    collective = ""
    sweep = None
    iters = None          # the --iters-table block being read
    pending = None        # an iters block waiting for the NIC table that follows it
    table = None          # (IterTable, header columns) of the NIC table being read
    expect = 0            # the iteration number its next row must have
    nic_title = ""
    current = 0           # the iteration between START and END, for events

    def close_iters():
        nonlocal iters, pending
        if iters is not None:
            if pending is not None:
                run.tables.append(pending)
            pending, iters = iters, None

    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip()
        if table is not None:
            m = NIC_ROW.match(line)
            vals = m and [parse_num(t) for t in m.group(2).split()]
            t, cols = table
            if m and int(m.group(1)) == expect and len(vals) >= len(cols) and None not in vals:
                if cols[0] == "Time(ms)":
                    t.ms.setdefault(expect, vals[0])
                for c, v in zip(cols, vals[: len(cols)]):
                    if c != "Time(ms)":
                        t.nic[c][expect] = v
                expect += 1
                continue
            if STRUCTURE.search(line) or ROW_HEAD.match(line) or NIC_HEADER.match(line):
                table = None
            else:
                continue
        m = R2CC_TITLE.match(line) or NCCLTESTS_TITLE.match(line)
        if m:
            collective = COLLECTIVES.get(m.group(1), m.group(1))
            continue
        m = OOB.match(line)
        if m:
            run.oob_failed |= m.group(2).upper() != "OK"
            continue
        m = NIC_CAPTION.search(line)
        if m:
            nic_title = "node %s, %s" % (m.group(1), m.group(2))
            continue
        m = SEED_CAPTION.search(line)
        if m:
            nic_title = line[m.start():].strip().rstrip(":")
            continue
        m = ITER_START.search(line)
        if m:
            i, n = int(m.group(1)), int(m.group(2))
            if iters is None or iters.n != n or i in iters.ms or i in iters.status:
                close_iters()
                iters = IterTable(run)
                iters.n = n
                iters.title = m.group(3).strip()
            current = i
            continue
        m = ITER_END.search(line)
        if m:
            i, n = int(m.group(1)), int(m.group(2))
            if iters is None or iters.n != n:
                close_iters()
                iters = IterTable(run)
                iters.n = n
            iters.ms[i] = float(m.group(4))
            wrong = WRONG_ELEMS.search(m.group(3))
            iters.status[i] = "WRONG" if "WRONG" in m.group(3).upper() else "OK"
            if wrong:
                iters.wrong[i] = float(wrong.group(1))
            current = 0
            continue
        m = NIC_HEADER.match(line)
        cols = m.group(1).split() if m else []
        if cols and "/" not in cols[0]:
            if "Time(ms)" in cols[:1] or any(re.search(r"_(RX|TX)$", c, re.I) for c in cols):
                close_iters()
                t = pending if pending is not None else IterTable(run)
                pending = None
                if nic_title:
                    t.title = nic_title
                t.columns = [c for c in cols if c != "Time(ms)"]
                t.nic = {c: {} for c in t.columns}
                run.tables.append(t)
                table, expect, nic_title = (t, cols), 1, ""
                continue
        row = parse_row(line, lineno)
        if row == "partial":
            run.partial.append(lineno)
            continue
        if row is not None:
            if row.size == 0:
                continue
            if sweep is None or sweep.key != row.key or row.size <= sweep.rows[-1].size:
                sweep = Sweep(run, collective)
                run.sweeps.append(sweep)
            sweep.rows.append(row)
            continue
        if current and iters is not None and EVENT.search(line) and current not in iters.events:
            iters.events[current] = re.sub(r"\s+", " ", line.strip())[:90]
    close_iters()
    if pending is not None:
        run.tables.append(pending)
    run.tables = [t for t in run.tables if t.iterations()]
    return run


def name_series(runs):
    """Labels that tell every sweep and table apart, and file names for the tables."""
    for run in runs:
        multi = len(run.sweeps) > 1
        keys = [s.key for s in run.sweeps]
        for k, s in enumerate(run.sweeps):
            if multi:
                dtype, redop, root = s.key
                parts = [dtype] + ([redop] if redop != "none" else []) + \
                    (["root " + root] if root != "-1" else [])
                s.label = "%s %s" % (run.label, "/".join(parts))
                if keys.count(s.key) > 1:
                    s.label += " #%d" % (keys[:k + 1].count(s.key))
        for k, t in enumerate(run.tables):
            t.label = run.label if len(run.tables) == 1 else "%s #%d" % (run.label, k + 1)


def file_safe(label):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "run"


def human_bytes(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d%s" % (n // div, unit)
    if n >= 1 << 30:
        return "%.1fG" % (n / (1 << 30))
    if n >= 1 << 20:
        return "%.1fM" % (n / (1 << 20))
    if n >= 1 << 10:
        return "%.1fK" % (n / (1 << 10))
    return "%d" % n


def load_matplotlib():
    """pyplot with the Agg backend. A python3 other than the system's (pyenv, a venv) does
    not see Debian's python3-matplotlib, so try /usr/bin/python3 once before giving up."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        system = "/usr/bin/python3"
        if (os.environ.get("R2CC_PLOT_REEXEC") != "1" and os.path.exists(system)
                and os.path.realpath(sys.executable) != os.path.realpath(system)):
            os.environ["R2CC_PLOT_REEXEC"] = "1"
            os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
        raise UserError("matplotlib is not installed for %s (Debian/Ubuntu: apt-get install "
                        "python3-matplotlib, or make deps)" % sys.executable, 3)


def plot_busbw(plt, sweeps, path, title):
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), sharey=True)
    sizes = sorted({r.size for s in sweeps for r in s.rows})
    marked = False
    for ax, which, name in ((axes[0], "oop", "out-of-place"), (axes[1], "ip", "in-place")):
        for k, s in enumerate(sweeps):
            pts = [(r.size, getattr(r, which).busbw, r) for r in s.rows
                   if getattr(r, which).busbw is not None]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3.5,
                    linewidth=1.4, label=s.label, color=PALETTE[k % len(PALETTE)],
                    linestyle=("-", "--", ":")[k // len(PALETTE) % 3])
            bad = [p for p in pts if getattr(p[2], which).wrong]
            if bad:
                ax.scatter([p[0] for p in bad], [p[1] for p in bad], s=110, marker="X",
                           color="red", zorder=5,
                           label=None if marked else "#wrong > 0")
                marked = True
        ax.set_xscale("log", base=2)
        # one tick per measured size, thinned to at most ~12 labels
        step = max(1, (len(sizes) + 11) // 12)
        ax.xaxis.set_major_locator(FixedLocator(sizes[::step]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(int(round(v)))))
        ax.tick_params(axis="x", labelrotation=45)
        ax.set_title(name)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="major", alpha=0.3)
        if len(sizes) == 1:
            ax.set_xlim(sizes[0] / 2, sizes[0] * 2)
    # set once both sides are drawn: a bottom-only limit would freeze the shared top
    top = max([h.busbw for s in sweeps for r in s.rows for h in (r.oop, r.ip)
               if h.busbw is not None] + [0])
    axes[0].set_ylim(0, top * 1.08 if top > 0 else 1)
    axes[0].set_ylabel("busbw (GB/s)")
    handles, labels = axes[0].get_legend_handles_labels()
    h2, l2 = axes[1].get_legend_handles_labels()
    for h, lab in zip(h2, l2):
        if lab not in labels:
            handles.append(h)
            labels.append(lab)
    ncol = 1 if len(labels) <= 8 else 2
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5),
               fontsize=8 if len(labels) > 8 else 9, ncol=ncol, frameon=False)
    fig.suptitle(title or "busbw by message size")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_iters(plt, t, path, title):
    its = t.iterations()
    flags = t.flags()
    groups = [(c, "received (MB)") for c in [t.rx_cols()] if c] + \
             [(c, "sent (MB)") for c in [t.tx_cols()] if c]
    heights = [1.0] + [1.3] * len(groups)
    fig, axes = plt.subplots(len(heights), 1, figsize=(max(8, min(20, 0.45 * len(its) + 5)),
                                                         max(3.2, 2.4 + 2.3 * len(groups))),
                             sharex=True, gridspec_kw={"height_ratios": heights},
                             squeeze=False)
    axes = [a[0] for a in axes]
    ax = axes[0]
    colors = ["red" if t.status.get(i) == "WRONG" else
              (FLAG_BAR if i in flags else "tab:gray") for i in its]
    ax.bar(its, [t.ms.get(i, 0) for i in its], color=colors, width=0.7)
    ax.set_ylabel("time (ms)")
    ax.grid(True, axis="y", alpha=0.3)
    for i in its:
        if i in t.ms and len(its) <= 40:
            ax.annotate("%.0f" % t.ms[i], (i, t.ms[i]), ha="center", va="bottom",
                        fontsize=7, xytext=(0, 1), textcoords="offset points")
    if t.ms:
        ax.set_ylim(0, max(t.ms.values()) * 1.18 or 1)
    ax.set_title("time per iteration (purple, shaded: stands out; red: wrong result)",
                 fontsize=9)
    for (cols, what), ax in zip(groups, axes[1:]):
        n = len(cols)
        width = 0.8 / n
        for k, c in enumerate(cols):
            x = [i - 0.4 + width * (k + 0.5) for i in its]
            nic = re.sub(r"_(RX|TX)$", "", c, flags=re.I)
            ax.bar(x, [t.nic[c].get(i, 0) for i in its], width=width, label=nic,
                   color=PALETTE[k % len(PALETTE)])
        ax.set_ylabel(what)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    for ax in axes:
        for i in flags:
            ax.axvspan(i - 0.5, i + 0.5, color=FLAG_SPAN, alpha=0.25, zorder=0, linewidth=0)
    axes[-1].set_xlabel("iteration")
    step = max(1, (len(its) + 29) // 30)
    axes[-1].set_xticks(its[::step])
    head = title + ": " if title else ""
    sub = t.title or ("%d iterations" % len(its))
    fig.suptitle("%s%s\n%s" % (head, t.label, sub), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def comparison(sweeps):
    sizes = sorted({r.size for s in sweeps for r in s.rows})
    cells = {(s.label, r.size): r.cell() for s in sweeps for r in s.rows}
    table = [["bytes"] + [s.label for s in sweeps]]
    for size in sizes:
        table.append([str(size)] + [cells.get((s.label, size), "-") for s in sweeps])
    widths = [max(len(r[k]) for r in table) for k in range(len(table[0]))]
    return [" | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog=PROG, description="Plot r2cc-perf / nccl-tests logs: busbw by size, per-iteration "
        "time and NIC bytes; prints a summary and a busbw table.")
    ap.add_argument("logs", nargs="*", metavar="LOG", help="a saved run (label: file name)")
    ap.add_argument("--label", action="append", default=[], metavar="NAME=LOG",
                    help="a saved run with its label (repeatable; keeps command-line order "
                    "after the plain LOGs)")
    ap.add_argument("-o", "--outdir", default="plots", help="where the PNGs go (default plots)")
    ap.add_argument("--title", default="", help="title for the charts")
    args = ap.parse_args(argv)
    runs = [(None, p) for p in args.logs]
    for spec in args.label:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path:
            ap.error("--label wants NAME=LOG, got %r" % spec)
        runs.append((name.strip(), path))
    if not runs:
        ap.error("no LOG given")
    return args, runs


def unique_labels(specs):
    """File stems as labels; the parent directory is added where stems collide."""
    stems = [os.path.splitext(os.path.basename(p))[0] for _, p in specs]
    out = []
    for (name, path), stem in zip(specs, stems):
        if name is None:
            name = stem
            if stems.count(stem) > 1:
                name = os.path.join(os.path.basename(os.path.dirname(os.path.abspath(path))),
                                    stem)
        out.append(name)
    for k, name in enumerate(out):
        if out.count(name) > 1:
            out[k] = "%s (%d)" % (name, out[:k + 1].count(name))
    return out


def main(argv):
    args, specs = parse_args(argv)
    labels = unique_labels(specs)
    runs = [read_log(lab, path) for lab, (_, path) in zip(labels, specs)]
    name_series(runs)
    plottable = [r for r in runs if r.sweeps or r.tables]
    if plottable:
        try:
            os.makedirs(args.outdir, exist_ok=True)
        except OSError as e:
            raise UserError("cannot create %s: %s" % (args.outdir, e.strerror or e))
    # after reading, so that a log with nothing to plot is told without matplotlib
    plt = load_matplotlib() if plottable else None
    status = 0
    for run in runs:
        if not run.sweeps and not run.tables:
            sys.stderr.write("%s: %s: nothing to plot (no nccl-tests result rows, no "
                             "iteration or NIC table)%s\n" % (
                                 PROG, run.path, "; the run stopped before its first result"
                                 if run.partial else ""))
            status = 1
    if not plottable:
        return status

    sweeps = [s for r in plottable for s in r.sweeps]
    written = []
    if sweeps:
        path = os.path.join(args.outdir, "busbw.png")
        plot_busbw(plt, sweeps, path, args.title)
        written.append(path)
    table_paths = {}
    for t in [t for r in plottable for t in r.tables]:
        path = os.path.join(args.outdir, "iters-%s.png" % file_safe(t.label))
        n = 2
        while path in table_paths.values():
            path = os.path.join(args.outdir, "iters-%s-%d.png" % (file_safe(t.label), n))
            n += 1
        plot_iters(plt, t, path, args.title)
        table_paths[id(t)] = path
        written.append(path)

    out = sys.stdout
    nt = sum(len(r.tables) for r in plottable)
    out.write("plot: %d log%s, %d sweep%s, %d iteration table%s\n" % (
        len(plottable), "" if len(plottable) == 1 else "s", len(sweeps),
        "" if len(sweeps) == 1 else "s", nt, "" if nt == 1 else "s"))
    wrong_lines = []
    for run in plottable:
        out.write("run %s (%s)\n" % (run.label, run.path))
        for s in run.sweeps:
            bw = [(r.oop.busbw or 0, r.ip.busbw or 0) for r in s.rows]
            nwrong = sum(1 for r in s.rows if r.is_wrong)
            span = human_bytes(s.rows[0].size)
            if len(s.rows) > 1:
                span += " .. " + human_bytes(s.rows[-1].size)
            out.write("  sweep %s: %s, %d size%s %s B, peak busbw %.2f/%.2f GB/s "
                      "(out-of-place/in-place), %s\n" % (
                          s.label, s.describe(), len(s.rows), "" if len(s.rows) == 1 else "s",
                          span,
                          max(b[0] for b in bw), max(b[1] for b in bw),
                          "%d row%s with wrong results" % (nwrong, "" if nwrong == 1 else "s")
                          if nwrong else "no wrong results"))
            for r in s.rows:
                if r.is_wrong:
                    wrong_lines.append("WRONG: %s: %d bytes %s: #wrong out-of-place %s, "
                                       "in-place %s (line %d)" % (
                                           s.label, r.size, s.describe(), r.oop.wrong_str(),
                                           r.ip.wrong_str(), r.lineno))
        if run.oob_failed:
            wrong_lines.append("WRONG: %s: the log says 'Out of bounds values: ... FAILED'"
                               % run.label)
        for ln in run.partial:
            out.write("  note: line %d starts a result row that has no numbers (the run "
                      "stopped there)\n" % ln)
        for t in run.tables:
            its = t.iterations()
            times = [t.ms[i] for i in its if i in t.ms]
            nics = sorted({re.sub(r"_(RX|TX)$", "", c, flags=re.I) for c in t.columns})
            out.write("  iterations %s: %d iteration%s%s%s%s\n" % (
                t.label, len(its), "" if len(its) == 1 else "s",
                ", %s" % t.title if t.title else "",
                ", %.0f..%.0f ms" % (min(times), max(times)) if times else "",
                ", NICs %s" % " ".join(nics) if nics else ", no NIC columns"))
            for i, why in sorted(t.flags().items()):
                nicvals = " ".join("%s %.0f" % (c, t.nic[c][i]) for c in t.columns
                                   if i in t.nic[c])
                out.write("    iter %d: %s%s -- %s\n" % (
                    i, "%.0f ms" % t.ms[i] if i in t.ms else "",
                    " (MB: %s)" % nicvals if nicvals else "", "; ".join(why)))
                if t.status.get(i) == "WRONG":
                    wrong_lines.append("WRONG: %s iteration %d: %s wrong elements" % (
                        t.label, i, "%.0f" % t.wrong[i] if i in t.wrong else "some"))
    for w in wrong_lines:
        out.write(w + "\n")
    if not wrong_lines:
        out.write("no wrong results\n")
    for p in written:
        out.write("wrote %s\n" % p)
    if sweeps:
        out.write("\n===== %s (busbw GB/s by size) =====\n" % (
            "comparison" if len(sweeps) > 1 else "results"))
        for line in comparison(sweeps):
            out.write(line + "\n")
        out.write("(cells: busbw out-of-place/in-place GB/s, then #wrong out-of-place/in-place)\n")
    return status


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        sys.stderr.write("%s: %s\n" % (PROG, e))
        sys.exit(e.status)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
