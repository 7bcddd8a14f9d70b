#!/usr/bin/env python3
"""Reads what the scenario scripts and scripts/drill produce (python3 standard library only).

  results.py check [--label L] [--status RC] [--declared-nic NIC] LOG
        verdict of one nccl-tests / r2cc-perf run: every result row complete and #wrong 0,
        exit status 0; what the NIC table says about a declared-failed NIC; exit 0 or 1
  results.py table [--args ARGS] LABEL=LOG...
        the comparison table of seed 000's test 03 (cells busbw oop/ip, #wrong oop/ip)
  results.py plan [--nodes N] [--nics A,B,C] SPEC...
        parses a drill's fault plan (NODE/NIC=KIND@TIME); one normalised step per line
        ("MS NODE NIC KIND ARG", sorted by time), or one clear error and exit 2
  results.py stamp --out FILE [--marker FILE]
        copies stdin to stdout line by line and writes "EPOCH<TAB>LINE" to FILE; the
        epoch of the first line that starts the measured work goes to the marker file
  results.py drill-report ...
        the drill's report (see scripts/drill --help); exit 0 PASS, 1 FAIL
"""

import argparse
import glob
import json
import re
import sys
import time

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([A-Za-z][A-Za-z0-9_]*)\b(.*)$")
NIC_CAPTION = re.compile(r"NIC bytes per iteration.*?of node (\S+?),.*?(?:size (\d+) B)?[^;]*;\s*source:\s*(\S+)")
NIC_HEADER = re.compile(r"^\s*(?:\[Rank \d+\]\s*)?Iter\s+Time\(ms\)\s+(.*)$")
DEC = r"(?:\d+(?:\.\d*)?|\.\d+)"  # a decimal number float() takes ("." is none)
NIC_ROW = re.compile(r"^\s*(\d+)\s+(" + DEC + r")((?:\s+" + DEC + r")+)\s*$")
ITER_START = re.compile(r"\bIter\s+(\d+)/(\d+)\s+START:\s*(\S+)\s+(" + DEC + r")\s*([KMGT]?i?B)")
ITER_END = re.compile(r"\bIter\s+(\d+)/(\d+)\s+END:\s*(OK|WRONG[^(]*?)\s*\(elapsed\s+(" + DEC +
                      r")\s*ms\)")
OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(\w+)")
RANK_LINE = re.compile(r"^#\s+Rank\s+\d+\s")
TITLE = re.compile(r"^#\s*r2cc-perf\s+(\w+):|^#\s*Collective test starting:\s*(\S+)")
WORK_START = re.compile(r"\bIter 1/\d+ START\b|^#\s+size\s+count\b")
ERROR_LINE = re.compile(r"^rank \d+: .*(failed|error)|NCCL WARN .*(status=|error)|"
                        r"^r2cc-perf: rank \d+ .*exited|watchdog|timed out|TEST FAIL|"
                        r"Segmentation|Aborted|mpirun .* (exited|terminated)", re.I)
AR2_RAN = re.compile(r"R2CC-AllReduce ran (\d+) times, (\d+) AllReduces ran as Balance")
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
         "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
BUSBW_FACTOR = {"allreduce": lambda n: 2.0 * (n - 1) / n,
                "allgather": lambda n: (n - 1) / n, "reducescatter": lambda n: (n - 1) / n,
                "alltoall": lambda n: (n - 1) / n}


class UserError(Exception):
    pass


def parse_wrong(tok):
    if tok == "N/A":
        return None
    try:
        return int(float(tok))
    except (ValueError, OverflowError):  # "inf", "1e999": not a count, so not 0 wrong
        return -1


def parse_num(tok):
    try:
        return float(tok)
    except ValueError:
        return None


# Another process's log line written into the middle of a result row (the ranks share
# the terminal): the row goes on, after the intruding lines, on a line of bare numbers.
INTRUSION = re.compile(r"[A-Za-z][\w.-]*:\d+:\d+ (?:R2CC|NCCL) |\[\d{4}-\d\d-\d\d ")
# Tokens separated by blanks (a repeat of "number, optional blanks" backtracks
# exponentially on a long run of digits that ends in something else).
NUM_TOK = r"(?:-?[0-9.]+(?:e[-+]?\d+)?|N/A)"
ROW_TAIL = re.compile(r"^\s*%s(?:\s+%s)*\s*$" % (NUM_TOK, NUM_TOK))


def read_rows(lines):
    """Result rows: (lineno, size, type, op, oop_busbw, ip_busbw, oop_wrong, ip_wrong)
    and the numbers of incomplete rows (the run stopped inside them)."""
    rows, partial = [], []
    pending = None  # (lineno, text) of a row cut by an intruding log line
    for n, line in enumerate(lines, 1):
        if pending and ROW_TAIL.match(line):
            n, line = pending[0], pending[1] + " " + line.strip()
            pending = None
        m = ROW.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        cut = INTRUSION.search(line, m.start(4))
        if cut:
            if pending:
                partial.append(pending[0])
            pending = (n, line[:cut.start()])
            continue
        toks = m.group(4).split()
        # after size/count/type: redop root (newer nccl-tests), then 2 x (time algbw busbw wrong)
        if len(toks) < 8 or any(parse_num(t) is None and t != "N/A" for t in toks[-8:]):
            if len(toks) <= 2 and all(re.match(r"^(-?\d+|[a-z]+)$", t) for t in toks):
                partial.append(n)
            continue
        op = toks[0] if len(toks) >= 10 else ""
        o, i = toks[-8:-4], toks[-4:]
        rows.append(dict(line=n, size=int(m.group(1)), type=m.group(3), op=op,
                         oop_time=parse_num(o[0]), oop_bw=parse_num(o[2]), ip_bw=parse_num(i[2]),
                         oop_wrong=parse_wrong(o[3]), ip_wrong=parse_wrong(i[3])))
    if pending:
        partial.append(pending[0])
    return rows, partial


def last_rows(path, dtype="float"):
    """size -> row (read_rows' dict) of a log's rows of one data type; with several
    sweeps in one log (-N 2), the last one's. For the benchmark scripts."""
    with open(path, errors="replace") as f:
        rows, _ = read_rows(f.read().splitlines())
    return {r["size"]: r for r in rows if r["type"] == dtype}


def read_nic_tables(lines):
    """Every NIC table: dict(node, size, source, cols, rows={iter: (ms, [MB...])})."""
    tables, cur = [], None
    for line in lines:
        m = NIC_CAPTION.search(line)
        if m:
            cur = dict(node=m.group(1), size=int(m.group(2)) if m.group(2) else None,
                       source=m.group(3), cols=[], rows={})
            tables.append(cur)
            continue
        if cur is None:
            continue
        m = NIC_HEADER.match(line)
        if m and not cur["cols"]:
            cur["cols"] = m.group(1).split()
            continue
        m = NIC_ROW.match(line)
        if m and cur["cols"]:
            vals = [float(v) for v in m.group(3).split()]
            if len(vals) == len(cur["cols"]):
                cur["rows"][int(m.group(1))] = (float(m.group(2)), vals)
                continue
        if cur["rows"]:
            cur = None
    return tables


def human(n):
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return "%d %s" % (n // f, unit)
    return "%d B" % n


def nic_usage(table, nic):
    """Mean MB per iteration received and sent by nic in a NIC table, or None."""
    rx, tx = nic + "_RX", nic + "_TX"
    if not table or rx not in table["cols"]:
        return None
    k_rx = table["cols"].index(rx)
    k_tx = table["cols"].index(tx) if tx in table["cols"] else None
    its = sorted(table["rows"])
    if not its:
        return None
    mean_rx = sum(table["rows"][i][1][k_rx] for i in its) / len(its)
    mean_tx = (sum(table["rows"][i][1][k_tx] for i in its) / len(its)) if k_tx is not None else 0.0
    total = sum(sum(table["rows"][i][1]) for i in its) / len(its)
    return mean_rx, mean_tx, total


# ------------------------------------------------------------------------ check ---

def cmd_check(a):
    try:
        lines = open(a.log, errors="replace").read().splitlines()
    except OSError as e:
        raise UserError("cannot read %s: %s" % (a.log, e.strerror))
    rows, partial = read_rows(lines)
    label = a.label or a.log
    out, ok = [], True
    wrong = [r for r in rows if (r["oop_wrong"] or 0) != 0 or (r["ip_wrong"] or 0) != 0]
    oob_failed = any(OOB.match(l) and OOB.match(l).group(2) != "OK" for l in lines)
    if rows:
        types = sorted({"%s %s" % (r["type"], r["op"]) if r["op"] else r["type"] for r in rows})
        checked = [r for r in rows if r["oop_wrong"] is not None]
        out.append("%s: exit status %d, %d result rows %s .. %s (%s)" % (
            label, a.status, len(rows), human(rows[0]["size"]), human(rows[-1]["size"]),
            ", ".join(types)))
        if not checked:
            out.append("%s: #wrong is N/A everywhere: results were not checked (-c 0)" % label)
            ok = False
        elif not wrong:
            out.append("%s: #wrong 0 in every row (out-of-place and in-place)" % label)
        big = max(rows, key=lambda r: r["size"])
        out.append("%s: busbw at %s: %s / %s GB/s (out-of-place / in-place)" % (
            label, human(big["size"]), big["oop_bw"], big["ip_bw"]))
    else:
        out.append("%s: exit status %d, no result rows" % (label, a.status))
        ok = False
    for r in wrong[:8]:
        out.append("%s: WRONG results at %d B %s %s: #wrong %s / %s (line %d)" % (
            label, r["size"], r["type"], r["op"], r["oop_wrong"], r["ip_wrong"], r["line"]))
        ok = False
    if oob_failed:
        out.append("%s: 'Out of bounds values ... FAILED'" % label)
        ok = False
    for n in partial:
        out.append("%s: the run stopped inside the row at line %d: %s" % (
            label, n, lines[n - 1].strip()))
        ok = False
    if a.status != 0:
        ok = False
        errs = [l.strip() for l in lines if ERROR_LINE.search(l)]
        out.append("%s: the program failed (exit status %d)%s" % (
            label, a.status, ": " + errs[0] if errs else ""))
    ran = [AR2_RAN.search(l) for l in lines]
    ran = [m for m in ran if m]
    if ran:
        out.append("%s: R2CC log (first rank): R2CC-AllReduce ran %s times, %s AllReduces "
                   "ran as Balance" % (label, ran[0].group(1), ran[0].group(2)))
    if a.declared_nic:
        tables = read_nic_tables(lines)
        use = nic_usage(tables[-1] if tables else None, a.declared_nic)
        if use is None:
            out.append("%s: no NIC table: cannot tell whether %s still carried traffic" % (
                label, a.declared_nic))
        elif use[0] + use[1] > 0.5:
            out.append("%s: NOTE: %s (declared failed) still carried %.0f MB in / %.0f MB out "
                       "per call on node %s (%.0f%% of that node's NIC bytes): R2CC did not take it "
                       "out of NCCL's data path in this run (Balance placement, README 'Where "
                       "it stands'), so these bandwidths are NOT those of a degraded server" % (
                           label, a.declared_nic, use[0], use[1], tables[-1]["node"],
                           100.0 * (use[0] + use[1]) / max(use[2], 1e-9)))
            if a.require_placement:
                ok = False
        else:
            out.append("%s: %s (declared failed) carried no traffic on node %s: the declared "
                       "failure was honoured" % (label, a.declared_nic, tables[-1]["node"]))
    print("\n".join(out))
    return 0 if ok else 1


# ------------------------------------------------------------------------ table ---

def cmd_table(a):
    runs = []
    for spec in a.runs:
        label, sep, path = spec.partition("=")
        if not sep:
            raise UserError("table wants LABEL=LOG, got %r" % spec)
        try:
            lines = open(path, errors="replace").read().splitlines()
        except OSError as e:
            raise UserError("cannot read %s: %s" % (path, e.strerror))
        rows, _ = read_rows(lines)
        cells = {}
        for r in rows:
            cells.setdefault(r["size"], "%s/%s (wrong %s/%s)" % (
                fmt_bw(r["oop_bw"]), fmt_bw(r["ip_bw"]), fmt_wrong(r["oop_wrong"]),
                fmt_wrong(r["ip_wrong"])))
        runs.append((label, cells))
    sizes = sorted({s for _, c in runs for s in c})
    print("===== comparison (%s) =====" % a.args if a.args else "===== comparison =====")
    print(" | ".join(["bytes"] + [l for l, _ in runs]))
    for s in sizes:
        print(" | ".join([str(s)] + [c.get(s, "-") for _, c in runs]))
    print("(cells: busbw out-of-place/in-place GB/s, then #wrong out-of-place/in-place)")
    return 0


def fmt_bw(v):
    return "N/A" if v is None else "%.2f" % v


def fmt_wrong(v):
    return "N/A" if v is None else str(v)


# ------------------------------------------------------------------------- plan ---

KINDS = "down, blackhole, blackhole-tx, blackhole-rx, ackloss, up, flap:PERIOD_MS, slow:GBPS"
# the kinds that cut a NIC: after them (and R2CC's repair) it must move no more bytes
CUT_KINDS = ("down", "blackhole", "blackhole-tx", "blackhole-rx", "ackloss", "flap")
SPEC = re.compile(r"^([^/=@]+)/([^/=@]+)=([^@]*)@(.*)$")


def parse_time_ms(t):
    m = re.match(r"^([0-9]+(?:\.[0-9]+)?)(ms|s)?$", t.strip())
    if not m:
        return None
    v = float(m.group(1))
    return int(round(v * 1000 if m.group(2) == "s" else v))


def parse_plan(specs, nodes=None, nics=None):
    steps = []
    for k, spec in enumerate(specs, 1):
        where = "fault %d '%s'" % (k, spec)
        m = SPEC.match(spec.strip())
        if not m:
            raise UserError("%s: expected NODE/NIC=KIND@TIME, e.g. node0/mlx5_2=blackhole@4s" % where)
        node_s, nic, kind_s, time_s = m.groups()
        nm = re.match(r"^(?:node)?(\d+)$", node_s)
        if not nm:
            raise UserError("%s: node '%s': write node<K> or <K> (K = node index, 0 = node of "
                            "rank 0)" % (where, node_s))
        node = int(nm.group(1))
        if nodes is not None and node >= nodes:
            raise UserError("%s: node%d does not exist: the job has %d nodes (node0..node%d)" % (
                where, node, nodes, nodes - 1))
        if not re.match(r"^[A-Za-z0-9_.-]+$", nic):
            raise UserError("%s: NIC '%s' is not a device name" % (where, nic))
        if nics and nic not in nics:
            raise UserError("%s: NIC %s is not one of this job's NICs (%s)" % (
                where, nic, ",".join(nics)))
        kind, _, arg = kind_s.partition(":")
        if kind in ("down", "blackhole", "blackhole-tx", "blackhole-rx", "ackloss", "up"):
            if arg:
                raise UserError("%s: '%s' takes no argument" % (where, kind))
            arg = "-"
        elif kind == "flap":
            if not re.match(r"^[1-9][0-9]*$", arg):
                raise UserError("%s: flap needs its period in ms, e.g. flap:200" % where)
        elif kind == "slow":
            if not re.match(r"^[0-9]+(\.[0-9]+)?$", arg) or float(arg) <= 0:
                raise UserError("%s: slow needs the rate in Gb/s, e.g. slow:10" % where)
        else:
            raise UserError("%s: unknown kind '%s': accepts %s" % (where, kind or "", KINDS))
        ms = parse_time_ms(time_s)
        if ms is None:
            raise UserError("%s: time '%s': write seconds (4s, 1.5s) or milliseconds (4000ms, "
                            "4000)" % (where, time_s))
        steps.append((ms, node, nic, kind, arg, k))
    if not steps:
        raise UserError("no fault given: --fault NODE/NIC=KIND@TIME, e.g. node0/mlx5_2=blackhole@4s")
    steps.sort(key=lambda s: (s[0], s[5]))
    return [s[:5] for s in steps]


def cmd_plan(a):
    nics = [n for n in (a.nics or "").split(",") if n]
    for ms, node, nic, kind, arg in parse_plan(a.specs, a.nodes, nics):
        print("%d %d %s %s %s" % (ms, node, nic, kind, arg))
    return 0


def read_plan(path):
    steps = []
    for line in open(path):
        t = line.split()
        if len(t) == 5:
            steps.append((int(t[0]), int(t[1]), t[2], t[3], t[4]))
    return steps


def step_name(s):
    return "node%d/%s %s%s" % (s[1], s[2], s[3], "" if s[4] == "-" else ":" + s[4])


# ------------------------------------------------------------------------ stamp ---

def cmd_stamp(a):
    marked = a.marker is None
    with open(a.out, "w") as out:
        if a.ready:
            open(a.ready, "w").close()
        for raw in sys.stdin.buffer:
            now = time.time()
            line = raw.decode("utf-8", "replace").rstrip("\n")
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            out.write("%.6f\t%s\n" % (now, line))
            out.flush()
            if not marked and WORK_START.search(line):
                with open(a.marker, "w") as m:
                    m.write("%.6f\n" % now)
                marked = True
    return 0


# ----------------------------------------------------------------- drill report ---

def load_incidents(pattern, drills=None):
    """detect_ms / migrate_ms of every incident in R2CC's JSON reports (R2CC_REPORT); the
    "drill" object of each report that has one is appended to drills."""
    incidents, files = [], sorted(glob.glob(pattern)) if pattern else []
    for f in files:
        try:
            text = open(f, errors="replace").read()
        except OSError:
            continue
        try:
            doc = json.loads(text)
            for inc in doc.get("incidents", []) if isinstance(doc, dict) else []:
                if isinstance(inc, dict):
                    incidents.append(inc)
            if drills is not None and isinstance(doc, dict) and isinstance(doc.get("drill"), dict):
                drills.append(doc["drill"])
        except ValueError:
            # not one JSON document: take every detect_ms / migrate_ms number in order
            det = re.findall(r"\bdetect_ms\"?\s*[:=]\s*(" + DEC + ")", text)
            mig = re.findall(r"\bmigrate_ms\"?\s*[:=]\s*(" + DEC + ")", text)
            for k in range(max(len(det), len(mig))):
                incidents.append({"detect_ms": float(det[k]) if k < len(det) else None,
                                  "migrate_ms": float(mig[k]) if k < len(mig) else None})
    return files, incidents


def inject_steps(drills, nsteps):
    """What the library says of each step of R2CC_DRILL (method inject), from the "drill"
    objects of its reports: {k: dict(t=first applied_unix or None, last=..., procs=N
    processes that applied it, qps=queue pairs in all, seen=processes that list the step,
    states={state: count}, why=[reasons])}. The plan went out in time order, so the
    library's step K is the plan's step K."""
    out = {}
    for k in range(1, nsteps + 1):
        recs = [st for d in drills for st in (d.get("steps") or [])
                if isinstance(st, dict) and st.get("step") == k]
        applied = [r for r in recs if r.get("state") == "applied" and
                   isinstance(r.get("applied_unix"), (int, float))]
        states = {}
        for r in recs:
            states[r.get("state") or "?"] = states.get(r.get("state") or "?", 0) + 1
        out[k] = dict(t=min(r["applied_unix"] for r in applied) if applied else None,
                      last=max(r["applied_unix"] for r in applied) if applied else None,
                      procs=len(applied), qps=sum(int(r.get("qps") or 0) for r in applied),
                      seen=len(recs), states=states,
                      why=sorted({str(r.get("why")) for r in recs if r.get("why")}))
    return out


PROM = re.compile(r"^r2cc_nic_(tx_bytes|recv_cqe_bytes)_total\{([^}]*)\}\s+(\d+)\s*$")
PROM_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def read_top(path, label):
    """Samples of R2CC's per-NIC counters written by the drill's sampler ("# t EPOCH",
    then 'r2cc top --prometheus'): [(t, {(host, pid, nic): tx_bytes + recv_cqe_bytes})],
    the processes of node label only when label is given."""
    samples = []
    try:
        f = open(path, errors="replace")
    except OSError:
        return samples
    with f:
        for line in f:
            if line.startswith("# t "):
                try:
                    samples.append((float(line.split()[2]), {}))
                except (IndexError, ValueError):
                    pass
                continue
            m = PROM.match(line)
            if not m or not samples:
                continue
            lab = dict(PROM_LABEL.findall(m.group(2)))
            if label and lab.get("node") != label:
                continue
            key = (lab.get("host"), lab.get("pid"), lab.get("nic"))
            cur = samples[-1][1]
            cur[key] = cur.get(key, 0) + int(m.group(3))
    return samples


def top_delta(samples, t_from, t_to):
    """Bytes per NIC moved between t_from and t_to: the sum over consecutive samples
    wholly inside, per process present in both (a process that starts or ends between
    two samples is left out of that pair). (None, 0) with no such pair."""
    per_nic, span = None, 0.0
    for (t1, a), (t2, b) in zip(samples, samples[1:]):
        if t1 < t_from or t2 > t_to:
            continue
        per_nic = per_nic or {}
        span += t2 - t1
        for key, v in b.items():
            if key in a:
                per_nic[key[2]] = per_nic.get(key[2], 0) + max(0, v - a[key])
    return per_nic, span


def check_cut(s, t_settle, t_stop, its, table, table_node, tops):
    """Did the cutting step s take its NIC out? ("cut" | "not-cut" | "not-checked", text).
    What counts: the bytes the NIC moved in the window from t_settle (R2CC's repair done)
    to t_stop (the NIC back, or the run's end). First r2cc-perf's NIC table, for the
    iterations that ran wholly in the window, else R2CC's counters sampled on the node.
    "Zero" is what the NIC table prints as 0: under 0.5 MB."""
    node, nic = s[1], s[2]
    why = []
    if table is not None and table["rows"] and not its:
        why.append("NIC table: not one of the drill's iterations (no --iters-table)")
    elif table is not None and table_node == node and table["rows"]:
        cols = table["cols"]
        mine = [cols.index(c) for c in (nic + "_RX", nic + "_TX") if c in cols]
        if mine:
            rows = []
            for i in sorted(its):
                st, en = its[i].get("start"), its[i].get("end")
                if st is None or en is None or st < t_settle or en > t_stop or i not in table["rows"]:
                    continue
                vals = table["rows"][i][1]
                rows.append((i, sum(vals[c] for c in mine), sum(vals)))
            moved = [r for r in rows if r[1] >= 0.5]
            if moved:
                i, mb, _ = moved[0]
                return "not-cut", ("%s still moved %.0f MB in iteration %d (%d of the %d iterations "
                                   "in the window moved bytes; NIC table, %s)" % (
                                       nic, mb, i, len(moved), len(rows), table["source"]))
            if rows and sum(r[2] for r in rows) >= 0.5:
                return "cut", ("%s moved 0 MB in iteration%s %s while node%d's NICs moved %.0f MB "
                               "per iteration (NIC table, %s)" % (
                                   nic, "s" if len(rows) > 1 else "",
                                   "%d-%d" % (rows[0][0], rows[-1][0]) if len(rows) > 1 else rows[0][0],
                                   node, sum(r[2] for r in rows) / len(rows), table["source"]))
            why.append("NIC table: %s" % ("no bytes on any NIC of node%d" % node if rows else
                                          "no iteration ran wholly inside"))
        else:
            why.append("NIC table: no column for %s" % nic)
    elif table is not None and table["rows"] and table_node is not None:
        why.append("NIC table: of node%d" % table_node)
    top = tops.get(node)
    if top is None:
        why.append("R2CC's counters: not sampled on node%d (no preload, or no r2cc binary)" % node)
    else:
        per_nic, span = top_delta(top[1], t_settle, t_stop)
        if per_nic is None:
            why.append("R2CC's counters: no two samples inside (%d sample%s in all)" % (
                len(top[1]), "" if len(top[1]) == 1 else "s"))
        else:
            b = per_nic.get(nic, 0)
            others = sum(v for n, v in per_nic.items() if n != nic)
            if b >= 0.5e6:
                return "not-cut", ("%s still moved %.1f MB in %.1f s (R2CC's counters on node%d, "
                                   "sampled with r2cc top)" % (nic, b / 1e6, span, node))
            if others >= 0.5e6:
                return "cut", ("%s moved %d B in %.1f s while node%d's other NICs moved %.0f MB "
                               "(R2CC's counters, sampled with r2cc top)" % (
                                   nic, b, span, node, others / 1e6))
            why.append("R2CC's counters: no traffic on node%d in %.1f s" % (node, span))
    return "not-checked", "; ".join(why)


def fmt_ms(v):
    return "not reported" if v is None else "%.1f ms" % float(v)


def cmd_drill_report(a):
    stamped = []
    for line in open(a.stamped, errors="replace"):
        t, _, text = line.rstrip("\n").partition("\t")
        stamped.append((float(t), text))
    lines = [s[1] for s in stamped]
    plan = read_plan(a.plan)
    t_launch = a.launch
    try:
        t0 = float(open(a.t0).read().split()[0]) if a.origin == "work" else t_launch
    except (OSError, IndexError, ValueError):
        t0 = None
    events = {}
    try:
        for line in open(a.events):
            t = line.split(None, 3)
            if len(t) >= 3:
                events[int(t[1])] = (float(t[0]), t[2], t[3].strip() if len(t) > 3 else "")
    except OSError:
        pass
    t_end = stamped[-1][0] if stamped else t_launch

    # iterations: start/end stamps and elapsed ms
    its, total_iters, size, coll = {}, None, a.size or None, a.coll
    for t, text in stamped:
        m = ITER_START.search(text)
        if m:
            i = int(m.group(1))
            total_iters = int(m.group(2))
            its.setdefault(i, {})["start"] = t
            coll = coll or m.group(3)
            if not size:
                size = int(round(float(m.group(4)) * UNITS.get(m.group(5), 1)))
            continue
        m = ITER_END.search(text)
        if m:
            i = int(m.group(1))
            its.setdefault(i, {}).update(end=t, ms=float(m.group(4)), ok=m.group(3) == "OK")
    nranks = sum(1 for l in lines if RANK_LINE.match(l)) or a.ranks
    factor = BUSBW_FACTOR.get((coll or "allreduce").lower(), lambda n: 1.0)(nranks) if nranks else None

    def busbw(ms):
        if not size or not ms or factor is None:
            return None
        return size / (ms / 1000.0) / 1e9 * factor

    # when each step went in, relative to the origin
    inj = []
    for k, s in enumerate(plan, 1):
        ev = events.get(k)
        inj.append(ev)

    def rel(t):
        return None if t is None or t0 is None else t - t0

    def in_flight(t):
        for i in sorted(its):
            st, en = its[i].get("start"), its[i].get("end")
            if st is not None and st <= t and (en is None or t <= en):
                return i
        return None

    out = []
    p = out.append
    p("")
    p("===== drill report =====")
    p("workload: %s" % a.workload)
    dur = t_end - t_launch
    p("         exit status %d after %.1f s%s" % (
        a.status, dur, "" if a.status == 0 else " (FAILED)"))
    if t0 is not None:
        p("times count from %s (t0 = launch + %.2f s)" % (
            "the start of the measured work (first 'Iter 1 START' or result header)"
            if a.origin == "work" else "the launch", t0 - t_launch))
    else:
        p("times: the measured work never started (no 'Iter 1 START' or result header)")
    drills = []
    files, incidents = load_incidents(a.reports, drills)
    inject = a.method == "inject"
    lib = inject_steps(drills, len(plan)) if inject else {}
    if inject:
        # the library applied the steps: when, the first process that did (min over ranks)
        for k in lib:
            if lib[k]["t"] is not None:
                inj[k - 1] = (lib[k]["t"], "injected", "")
        if t0 is not None and a.origin == "launch":
            p("  (R2CC_DRILL's ':init' counts in each process from the end of its first "
              "communicator init, a little after the launch)")
        elif t0 is not None:
            p("  (R2CC_DRILL counts in each process from its first NCCL collective)")
    tables = read_nic_tables(lines)
    nic = tables[-1] if tables else None
    table_node = a.nic_table_node
    if table_node is None and nic:
        m = re.match(r"^node(\d+)$", nic["node"])
        table_node = int(m.group(1)) if m else None
    tops = {}
    for spec in a.top:
        k_s, _, rest = spec.partition(":")
        label, _, path = rest.partition(":")
        tops[int(k_s)] = (label, read_top(path, label))
    t_run_end = max([t_end] + [v["end"] for v in its.values() if v.get("end")])
    used = set()
    fails, unchecked, checked = [], [], 0
    p("")
    p("fault plan (%s%s):" % (a.method, ", carried out by libr2cc.so in every rank (R2CC_DRILL)"
                              if inject else ""))
    for k, s in enumerate(plan, 1):
        ev = inj[k - 1]
        head = "  step %d  %-28s at %6.3f s: " % (k, step_name(s), s[0] / 1000.0)
        if ev is None and inject:
            st = lib[k]
            if not drills:
                p(head + "NOT known to be applied: no R2CC report holds the drill")
                fails.append("step %d (%s): no R2CC report says it was applied (%s)" % (
                    k, step_name(s), "no report was written" if not files else
                    "the reports have no \"drill\": is libr2cc.so older than R2CC_DRILL?"))
            elif st["states"].get("unresolved"):
                p(head + "NOT applied: %s" % ("; ".join(st["why"]) or "unresolved"))
                fails.append("step %d (%s) was not applied: the library could not resolve it "
                             "(%s)" % (k, step_name(s), "; ".join(st["why"]) or "no reason given"))
            elif st["seen"] == 0:
                p(head + "NOT applied: the library's reports do not list it")
                fails.append("step %d (%s): the library's reports do not list it" % (k, step_name(s)))
            else:
                p(head + "NOT applied (the workload ended first%s)" % (
                    ": " + "; ".join(st["why"]) if st["why"] else ""))
                if a.status == 0:
                    fails.append("step %d (%s) was never applied: the workload ended before %.1f s; "
                                 "make it longer (--iters)" % (k, step_name(s), s[0] / 1000.0))
            continue
        if ev is None:
            p(head + "NOT injected (the workload ended first)")
            if a.status == 0:
                fails.append("step %d (%s) was never injected: the workload ended before %.1f s; "
                             "make it longer (--iters)" % (k, step_name(s), s[0] / 1000.0))
            continue
        t_ev, what, detail = ev
        if what != "injected":
            p(head + "%s %s" % (what.upper(), detail))
            fails.append("step %d (%s): the fault command failed: %s" % (k, step_name(s), detail))
            continue
        i = in_flight(t_ev)
        where = "during iteration %d" % i if i else (
            "before the first iteration" if its and t_ev < min(
                v.get("start", t_end) for v in its.values()) else "between iterations" if its else "")
        p(head + "%s at %.3f s%s" % ("applied" if inject else "injected", rel(t_ev),
                                      ", " + where if where else ""))
        t_last = t_ev
        if inject:
            st = lib[k]
            t_last = st["last"]
            p("           by %d of the %d processes that report the drill%s, to %d queue pair%s "
              "in all; the last %.3f s after the first" % (
                  st["procs"], len(drills), "" if st["procs"] == st["seen"] else
                  " (%s)" % ", ".join("%d %s" % (n, x) for x, n in sorted(st["states"].items())
                                      if x != "applied"),
                  st["qps"], "" if st["qps"] == 1 else "s", t_last - t_ev))
        if s[3] == "up":
            # the NIC is back: R2CC's failback incidents of it after this step
            back = [x for x in incidents if x.get("failback") and
                    (x.get("nic") or s[2]) == s[2] and
                    (x.get("started_unix") or 0) >= t_ev - 0.05]
            if back:
                t_b = min(x["started_unix"] for x in back)
                done_b = [x.get("done_unix") for x in back if x.get("done_unix")]
                p("           failback %.1f s after the restore, QPs back in %s (%d process(es))" % (
                    t_b - t_ev, fmt_ms((max(done_b) - t_b) * 1000.0 if done_b else None), len(back)))
            else:
                p("           no failback recorded (R2CC_FAILBACK_MS, or the run ended first)")
            continue
        inc = None
        # Every process that moved QPs off this NIC name reports an incident (the
        # failed node's processes, and their peers told over the control plane).
        # Detection: the first of them after the injection; migration: until the
        # last of them finished.
        mine = [(n, x) for n, x in enumerate(incidents) if n not in used and
                not x.get("failback") and
                (x.get("nic") or x.get("hca") or s[2]) == s[2] and
                (x.get("detected_unix") is None or x.get("detected_unix") >= t_ev - 0.05)]
        t_repaired = None
        if mine:
            dated = [x for _, x in mine if x.get("detected_unix") is not None]
            if dated:
                first = min(x["detected_unix"] for x in dated)
                last = max([x.get("done_unix") or 0 for x in dated])
                inc = {"detect_ms": max(0.0, (first - t_ev) * 1000.0),
                       "migrate_ms": (last - first) * 1000.0 if last else None,
                       "processes": len(dated)}
                t_repaired = last or None
            else:
                inc = mine[0][1]
            used.update(n for n, _ in mine)
        p("           detection %s, repair (migration) %s%s" % (
            fmt_ms(inc.get("detect_ms") if inc else None),
            fmt_ms(inc.get("migrate_ms") if inc else None),
            (" (from the fault's injection to the first detection; %d process(es) "
             "reported it)" % inc["processes"]) if inc and "processes" in inc else
            "" if inc else " -- R2CC recorded no incident for it"))
        marked = [x.get("drill") for _, x in mine if "drill" in x]
        if marked:
            # R2CC marks the incidents a drill caused, apart from real failures
            p("           R2CC marked %d of %d of these incidents 'drill'%s" % (
                sum(1 for m in marked if m), len(marked),
                "" if (all(marked) if inject else not any(marked)) else
                " (expected %s)" % ("all" if inject else "none")))
        if s[3] not in CUT_KINDS:
            continue
        # did it cut? the NIC's bytes once R2CC had repaired, until the NIC came back
        if t_repaired is not None:
            t_settle, after = max(t_repaired, t_last), "the repair"
        else:
            t_settle = t_last + a.settle_ms / 1000.0
            after = "DRILL_SETTLE_MS=%d after the step (no repair recorded)" % a.settle_ms
        t_stop, stop_what = t_run_end, "the end of the run"
        for j in range(k, len(plan)):
            q = plan[j]
            if q[1:3] == s[1:3] and q[3] == "up" and inj[j] and inj[j][1] == "injected":
                t_stop, stop_what = inj[j][0], "step %d (up)" % (j + 1)
                break
        window = "from %s (%s) to %s (%s)" % (
            after, "%.2f s" % rel(t_settle) if t0 is not None else "-", stop_what,
            "%.2f s" % rel(t_stop) if t0 is not None else "-")
        verdict, text = check_cut(s, t_settle, t_stop, its, nic, table_node, tops)
        if verdict == "cut":
            checked += 1
            p("           cut %s: %s" % (window, text))
        elif verdict == "not-cut":
            p("           NOT CUT %s: %s" % (window, text))
            fails.append("step %d (%s) cut nothing: after %s, %s" % (k, step_name(s), after, text))
        else:
            unchecked.append(k)
            p("           cut: not checked %s: %s" % (window, text))
        if inject and lib[k]["qps"] == 0 and verdict == "not-checked":
            fails.append("step %d (%s) cut nothing: the library applied it to no queue pair" % (
                k, step_name(s)))
    p("R2CC reports: %s" % (("%d file(s), %d incident(s)" % (len(files), len(incidents)))
                            if files else "none written (R2CC not loaded, or the processes were killed)"))

    # per-iteration table with NIC bytes
    if its:
        done = [(inj[k][0], plan[k][3]) for k in range(len(plan)) if inj[k] and inj[k][1] == "injected"]
        steps_t = [t for t, kind in done if kind != "up"]  # 'up' ends a fault, it is not one
        first = min(steps_t) if steps_t else None
        last = max(t for t, _ in done) if done else None
        p("")
        p("iterations (%s%s):" % (
            "%s %s, %d ranks" % (coll or "?", human(size) if size else "?", nranks or 0),
            ", NIC MB per iteration of node %s from %s" % (nic["node"], nic["source"]) if nic and nic["rows"] else ""))
        cols = nic["cols"] if nic and nic["rows"] else []
        p("  %4s %9s %9s %11s  %-8s %s" % ("iter", "start(s)", "time(ms)", "busbw(GB/s)", "phase",
                                           " ".join("%10s" % c for c in cols)))
        phase_bw = {"before": [], "during": [], "after": []}
        for i in sorted(its):
            v = its[i]
            st, en = v.get("start"), v.get("end")
            if first is None or (en is not None and en < first):
                ph = "before"
            elif any(st <= t and (en is None or t <= en) for t in steps_t):
                ph = "during"
            elif last is not None and st > last:
                ph = "after"
            else:
                ph = "between"
            bw = busbw(v.get("ms"))
            if bw is not None and ph in phase_bw:
                phase_bw[ph].append(bw)
            status = "" if v.get("ok", None) in (True,) else (" WRONG" if "ok" in v else " never ended")
            nicvals = nic["rows"].get(i, (None, []))[1] if cols else []
            p("  %4d %9s %9s %11s  %-8s %s%s" % (
                i, "%.2f" % rel(st) if st is not None and t0 is not None else "-",
                "%.0f" % v["ms"] if "ms" in v else "-", "%.2f" % bw if bw is not None else "-",
                ph, " ".join("%10.0f" % x for x in nicvals), status))
        for ph in ("before", "during", "after"):
            bws = phase_bw[ph]
            p("  busbw %-6s %s" % (ph, "%.2f GB/s (mean of %d iteration%s)" % (
                sum(bws) / len(bws), len(bws), "" if len(bws) == 1 else "s") if bws else "-"))
        if not cols:
            p("  NIC bytes: %s" % ("no NIC table: the workload ended before printing it" if a.status
                                   else "no NIC counters in this run"))
        n_ok = sum(1 for v in its.values() if v.get("ok"))
        n_wrong = sum(1 for v in its.values() if "ok" in v and not v["ok"])
        never = sorted(i for i, v in its.items() if "ok" not in v)
        want = total_iters or len(its)
        p("verification: %d of %d iterations ended OK and verified%s%s" % (
            n_ok, want, ", %d WRONG" % n_wrong if n_wrong else "",
            ", iteration %s never ended" % ",".join(map(str, never)) if never else ""))
        if n_ok != want or n_wrong:
            fails.append("%d of %d iterations completed and verified" % (n_ok, want))
        if not any("TEST PASS" in l for l in lines) and a.iters_table:
            fails.append("no 'TEST PASS' line from the workload")
    rows, partial = read_rows(lines)
    if rows:
        p("")
        p("result rows (completed at, from t0):")
        row_t = {}
        for t, text in stamped:
            m = ROW.match(text)
            if m:
                row_t.setdefault(int(m.group(1)), t)
        for r in rows:
            p("  %12d B  %s  busbw %s / %s GB/s  #wrong %s / %s" % (
                r["size"], "%.2f s" % rel(row_t[r["size"]]) if r["size"] in row_t and t0 else "-",
                fmt_bw(r["oop_bw"]), fmt_bw(r["ip_bw"]), fmt_wrong(r["oop_wrong"]),
                fmt_wrong(r["ip_wrong"])))
        bad = [r for r in rows if (r["oop_wrong"] or 0) or (r["ip_wrong"] or 0)]
        if bad:
            fails.append("%d result rows with wrong results" % len(bad))
    if partial:
        fails.append("the run stopped inside a result row (line %d)" % partial[0])
    if not its and not rows:
        fails.append("no iteration and no result row completed")
    if a.status != 0:
        errs = [(t, l.strip()) for t, l in stamped if ERROR_LINE.search(l)]
        injected = [(k, inj[k - 1][0]) for k in range(1, len(plan) + 1)
                    if inj[k - 1] and inj[k - 1][1] == "injected" and plan[k - 1][3] != "up"]
        msg = "the workload died (exit status %d)" % a.status
        if errs:
            t_err = errs[0][0]
            before = [(k, t) for k, t in injected if t <= t_err]
            if before:
                k, t = before[-1]
                msg += " %.1f s after step %d (%s)" % (t_err - t, k, step_name(plan[k - 1]))
                i = in_flight(t)
                if i:
                    msg += ", with iteration %d in flight" % i
            msg += ": " + errs[0][1]
        fails.insert(0, msg)
        if injected and not incidents:
            if a.preload:
                fails.append("R2CC recorded no incident: hot repair did not act on the fault "
                             "(README 'Where it stands' says whether this build has hot repair; "
                             "without it a NIC failing mid-run kills the job, as with plain NCCL)")
            else:
                fails.append("R2CC was not loaded (--no-preload): this is plain NCCL's behaviour")
    p("")
    with open(a.summary, "w") if a.summary else open("/dev/null", "w") as sf:
        if fails:
            p("VERDICT: FAIL")
            for f in fails:
                p("  - " + f)
                sf.write(f + "\n")
        else:
            cuts = sum(1 for s in plan if s[3] in CUT_KINDS)
            took = ("every cutting step cut its NIC's bytes" if not unchecked else
                    "%s %s not checked for its NIC's bytes" % (
                        "step" if len(unchecked) == 1 else "steps", ",".join(map(str, unchecked)))
                    ) if cuts else ""
            what = "every step %s, %severy result verified, nothing lost" % (
                "applied" if inject else "injected", took + ", " if took else "")
            p("VERDICT: PASS -- " + what)
            sf.write(what + "\n")
    print("\n".join(out))
    return 1 if fails else 0


# ------------------------------------------------------------------------- main ---

def main(argv):
    ap = argparse.ArgumentParser(prog="results.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--label", default="")
    c.add_argument("--status", type=int, default=0)
    c.add_argument("--declared-nic", default="")
    c.add_argument("--require-placement", action="store_true")
    c.add_argument("log")
    t = sub.add_parser("table")
    t.add_argument("--args", default="")
    t.add_argument("runs", nargs="+", metavar="LABEL=LOG")
    pl = sub.add_parser("plan")
    pl.add_argument("--nodes", type=int)
    pl.add_argument("--nics", default="")
    pl.add_argument("specs", nargs="*")
    s = sub.add_parser("stamp")
    s.add_argument("--out", required=True)
    s.add_argument("--marker")
    s.add_argument("--ready")
    d = sub.add_parser("drill-report")
    d.add_argument("--stamped", required=True)
    d.add_argument("--events", required=True)
    d.add_argument("--plan", required=True)
    d.add_argument("--t0", required=True)
    d.add_argument("--launch", type=float, required=True)
    d.add_argument("--origin", choices=("work", "launch"), default="work")
    d.add_argument("--status", type=int, required=True)
    d.add_argument("--size", type=int, default=0)
    d.add_argument("--coll", default="")
    d.add_argument("--ranks", type=int, default=0)
    d.add_argument("--reports", default="")
    d.add_argument("--workload", default="")
    d.add_argument("--method", default="soft")
    d.add_argument("--preload", type=int, default=1)
    d.add_argument("--iters-table", type=int, default=1)
    d.add_argument("--summary", default="")
    d.add_argument("--top", action="append", default=[], metavar="K:LABEL:FILE",
                   help="R2CC's counters of node K sampled into FILE (LABEL: its processes' "
                   "node label, empty: all)")
    d.add_argument("--nic-table-node", type=lambda v: int(v) if v != "" else None, default=None)
    d.add_argument("--settle-ms", type=int, default=3000)
    a = ap.parse_args(argv)
    fn = {"check": cmd_check, "table": cmd_table, "plan": cmd_plan, "stamp": cmd_stamp,
          "drill-report": cmd_drill_report}[a.cmd]
    try:
        return fn(a)
    except UserError as e:
        sys.stderr.write("%s\n" % e)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
