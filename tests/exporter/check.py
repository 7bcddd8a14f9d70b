"""Checks r2cc exporter's output with a real Prometheus text-format parser
(prometheus_client's text_string_to_metric_families) and the rules the parser
leaves to the server: HELP and TYPE before each family's samples, no series
twice, counters not negative, histograms cumulative with +Inf equal to _count.

  check.py parse FILE                    the rules; prints the series count
  check.py series FILE [LABEL=RE...]     the samples (name, labels, value) as JSON lines,
                                         those whose labels match every LABEL=RE
                                         (__name__ is the sample's name)
  check.py sum FILE [LABEL=RE...]        "SUM N": their values added up, and how many
  check.py get URL [METHOD]              one HTTP request: status, content type, body
"""
import http.client
import json
import math
import re
import sys
import urllib.parse

from prometheus_client.parser import text_string_to_metric_families

LABELS = {"host", "node", "pid"}


def fail(msg):
    print("check.py: FAIL: " + msg)
    sys.exit(1)


def parse(text):
    """The families, after the checks the parser does not make."""
    declared, seen_type, order = {}, set(), []
    for ln in text.splitlines():
        if ln.startswith("# HELP "):
            declared.setdefault(ln.split()[2], set()).add("HELP")
        elif ln.startswith("# TYPE "):
            name = ln.split()[2]
            if name in seen_type:
                fail("TYPE of %s given twice" % name)
            seen_type.add(name)
            declared.setdefault(name, set()).add("TYPE")
            order.append(name)
        elif ln and not ln.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", ln).group(0)
            fam = next((f for f in (order[-1:] or []) if name == f or
                        re.fullmatch(re.escape(f) + r"(_total|_bucket|_sum|_count)", name)), None)
            if fam is None:
                fail("sample %s is not under its family's TYPE line" % name)
            if declared[fam] != {"HELP", "TYPE"}:
                fail("%s has no HELP or no TYPE" % fam)
    fams = list(text_string_to_metric_families(text))
    keys = set()
    for f in fams:
        for s in f.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in keys:
                fail("series %s%s given twice" % key)
            keys.add(key)
            if f.type == "counter" and (s.value < 0 or math.isnan(s.value)):
                fail("counter %s%s is %s" % (s.name, s.labels, s.value))
            if f.name.startswith("r2cc_") and f.name != "r2cc_exporter_pages" and \
                    not LABELS <= set(s.labels):
                fail("%s has labels %s, not host, node, pid" % (s.name, sorted(s.labels)))
        if f.type == "histogram":
            hist(f)
    return fams


def hist(f):
    groups = {}
    for s in f.samples:
        lab = {k: v for k, v in s.labels.items() if k != "le"}
        g = groups.setdefault(tuple(sorted(lab.items())), {"b": []})
        if s.name.endswith("_bucket"):
            g["b"].append((float(s.labels["le"]), s.value))
        else:
            g[s.name.rsplit("_", 1)[1]] = s.value
    for lab, g in groups.items():
        b = sorted(g["b"])
        if not b or b[-1][0] != math.inf:
            fail("%s%s has no +Inf bucket" % (f.name, dict(lab)))
        if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            fail("%s%s: buckets not cumulative: %s" % (f.name, dict(lab), b))
        if b[-1][1] != g.get("count"):
            fail("%s%s: +Inf %s, _count %s" % (f.name, dict(lab), b[-1][1], g.get("count")))
        if "sum" not in g:
            fail("%s%s has no _sum" % (f.name, dict(lab)))


def main():
    cmd = sys.argv[1]
    if cmd == "get":
        u = urllib.parse.urlsplit(sys.argv[2])
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        c.request(sys.argv[3] if len(sys.argv) > 3 else "GET", u.path or "/")
        r = c.getresponse()
        print(r.status, r.getheader("Content-Type"))
        sys.stdout.write(r.read().decode())
        return
    text = open(sys.argv[2], encoding="utf-8").read()
    fams = parse(text)
    if cmd == "parse":
        print(sum(len(f.samples) for f in fams), "series")
    elif cmd in ("series", "sum"):
        want = [a.split("=", 1) for a in sys.argv[3:]]
        got = [s for f in fams for s in f.samples
               if all(k in dict(s.labels, __name__=s.name) and
                      re.fullmatch(v, dict(s.labels, __name__=s.name)[k]) for k, v in want)]
        if cmd == "sum":
            print("%.15g %d" % (sum(s.value for s in got), len(got)))
        for s in got if cmd == "series" else []:
            print(json.dumps({"name": s.name, "labels": s.labels, "value": s.value}))
    else:
        fail("unknown command " + cmd)


main()
