#!/usr/bin/env python3
"""
Dependency direction: every #include "..." of the library and its tools runs
down the layers, never up. Lowest first:

    include < shim < ctl < repair/model < repair < intercept < strategies < tools

A file may include its own layer and any layer below it. Beside the layers:
ops/ and bench/ may include what they need, and nothing includes them (but
themselves); softverbs/, the software RDMA device, includes nothing of R2CC's,
and R2CC's library includes nothing of it; tests/ may include anything, and
nothing outside tests/ includes a test. The control plane and the models still
under repair/ (ctl*, hmap, job; qp_shadow, mr_mirror, cts, ledger, stall) count
as ctl and repair/model.

An upward include that is known and not yet undone is an exception below, with
its reason; an exception that no longer occurs is an error too, so that the
list stays true. Usage: tests/lint/layers.py [ROOT] (default: the repository
this script is in). Exit status 1 on any violation.
"""
import os
import re
import sys

LAYERS = ["include", "shim", "ctl", "repair/model", "repair", "intercept", "strategies", "tools"]
LIBRARY = set(LAYERS) - {"tools"}
SOURCE_EXT = (".c", ".h", ".def", ".cu", ".cc", ".cpp")
SKIP_DIRS = {"build", "logs", "docs", "scripts", "packaging"}

# repair/ files that belong to the lower layers (before they move to ctl/ and
# repair/model/).
CTL_STEMS = re.compile(r"^(ctl.*|hmap|job)$")
MODEL_STEMS = re.compile(r"^(qp_shadow|mr_mirror|cts|ledger|stall)$")

# (includer, included, reason): upward includes known and kept for now. An
# includer may be named by its path before and after the move of the control
# plane and the models out of repair/.
EXCEPTIONS = [
]


def layer_of(path):
    """The layer or part of a repository path, or None where it has none."""
    parts = path.split("/")
    top = parts[0]
    if top in ("tests", "softverbs", "ops", "bench"):
        return top
    if top == "repair":
        if len(parts) > 2 and parts[1] == "model":
            return "repair/model"
        stem = os.path.splitext(parts[-1])[0]
        if len(parts) == 2 and CTL_STEMS.match(stem):
            return "ctl"
        if len(parts) == 2 and MODEL_STEMS.match(stem):
            return "repair/model"
        return "repair"
    if top in LAYERS:
        return top
    return None


def sources(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(
            d for d in dirnames
            if not d.startswith(".") and not (rel_dir == "." and d in SKIP_DIRS))
        for name in sorted(filenames):
            if name.endswith(SOURCE_EXT):
                yield os.path.normpath(os.path.join(rel_dir, name))


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def includes(root, path):
    """(line number, included path as the repository names it) of each quoted include."""
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            name = m.group(1)
            beside = os.path.normpath(os.path.join(os.path.dirname(path), name))
            if not os.path.exists(os.path.join(root, name)) and os.path.exists(
                    os.path.join(root, beside)):
                name = beside
            yield n, os.path.normpath(name)


def verdict(src, dst):
    """None when src may include dst, else why not."""
    a, b = layer_of(src), layer_of(dst)
    if a == "tests":
        return None
    if a is None:
        return "%s is in no layer (add its folder to tests/lint/layers.py)" % src
    if b is None:
        return "%s is in no layer (add its folder to tests/lint/layers.py)" % dst
    if b == "tests":
        return "nothing outside tests/ includes a test"
    if b in ("ops", "bench") and a != b:
        return "nothing includes %s/" % b
    if a == "softverbs" and b != "softverbs":
        return "softverbs/ includes nothing of R2CC's"
    if b == "softverbs" and a in LIBRARY:
        return "the library includes nothing of softverbs/"
    if a in LAYERS and b in LAYERS and LAYERS.index(b) > LAYERS.index(a):
        return "upward: %s includes %s" % (a, b)
    return None


def names(includer):
    return (includer,) if isinstance(includer, str) else includer


def main():
    root = os.path.abspath(
        sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    bad = []
    used = set()
    checked = 0
    for src in sources(root):
        for n, dst in includes(root, src):
            checked += 1
            why = verdict(src, dst)
            if why is None:
                continue
            known = [i for i, e in enumerate(EXCEPTIONS) if src in names(e[0]) and e[1] == dst]
            if known:
                used.update(known)
                continue
            bad.append("%s:%d: #include \"%s\": %s" % (src, n, dst, why))
    for i, (src, dst, _) in enumerate(EXCEPTIONS):
        if i not in used:
            bad.append("tests/lint/layers.py: exception %s -> %s no longer occurs: remove it" %
                       (" or ".join(names(src)), dst))
    for line in bad:
        print(line)
    if bad:
        print("layers: %d violation(s) of the dependency direction (see tests/lint/layers.py)" %
              len(bad))
        return 1
    print("ok layers (%d includes, %d known exception(s))" % (checked, len(EXCEPTIONS)))
    for src, dst, why in EXCEPTIONS:
        print("  exception %s -> %s: %s" % (" or ".join(names(src)), dst, why))
    return 0


if __name__ == "__main__":
    sys.exit(main())
