#!/usr/bin/env python3
"""
Dependency direction: every #include "..." of the library, its tools and the
programs beside it runs down the layers, never up. The library's layers, lowest
first:

    include < shim < ctl < repair/model < repair < intercept < strategies < tools

A file may include its own layer and any layer below it (tools/ is the `r2cc`
command and r2cc-ctl-load, which may use any of the library's headers).

Beside the layers, each part includes only itself and what its line allows:

    softverbs/       the software RDMA device: nothing of R2CC's
    tools/ncclstub/  NCCL's test double: nothing of R2CC's
    tools/drill/     r2cc-verbs-drill, which links nothing of R2CC's: include/,
                     shim/ (the layouts the library publishes: its statistics),
                     and of the device only softverbs/wc_status.h, a header-only
                     table of names shared with it (the drill carries its own
                     names, as NCCL does, and must not link the device)
    bench/           benchmark programs: include/
    ops/             cluster integration (the Slurm plugin): include/, shim/ (the
                     settings and their parsers)
    tests/           anything

and nothing includes a part but the part itself and tests/. A folder in none of
these is an error, so that a new one is placed on purpose.

An include that breaks this and is known and not yet undone is an exception
below, with its reason; there are none. An exception that no longer occurs is an
error too, so that the list stays true. Usage: tests/lint/layers.py [ROOT]
(default: the repository this script is in). Exit status 1 on any violation.
"""
import os
import re
import sys

LAYERS = ["include", "shim", "ctl", "repair/model", "repair", "intercept", "strategies", "tools"]

# Each part beside the layers: what else it may include, as folders (a part or
# layer) or single files.
PARTS = {
    "softverbs": (),
    "tools/ncclstub": (),
    "tools/drill": ("include", "shim", "softverbs/wc_status.h"),
    "bench": ("include",),
    "ops": ("include", "shim"),
}
TOOL_PARTS = ("drill", "ncclstub")

SOURCE_EXT = (".c", ".h", ".def", ".cu", ".cc", ".cpp")
SKIP_DIRS = {"build", "logs", "docs", "scripts", "packaging"}

# (includer, included, reason): includes that break the rules, known and kept
# for now. None: every dependency runs one way.
EXCEPTIONS = []


def layer_of(path):
    """The layer or part of a repository path, or None where it has none."""
    parts = path.split("/")
    top = parts[0]
    if len(parts) < 2:
        return None
    if top in ("tests", "softverbs", "bench", "ops"):
        return top
    if top == "tools" and len(parts) > 2:
        return "tools/" + parts[1] if parts[1] in TOOL_PARTS else None
    if top == "repair" and len(parts) > 2:
        return "repair/model" if parts[1] == "model" else None
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
        return "%s is in no layer or part (place its folder in tests/lint/layers.py)" % src
    if b is None:
        return "%s is in no layer or part (place its folder in tests/lint/layers.py)" % dst
    if a == b:
        return None
    if b == "tests":
        return "nothing outside tests/ includes a test"
    if a in PARTS:
        if b in PARTS[a] or dst in PARTS[a]:
            return None
        allowed = [x if x.endswith(".h") else x + "/" for x in PARTS[a]]
        return "%s/ includes only itself%s" % (a, " and " + ", ".join(allowed) if allowed else "")
    if b in PARTS:
        return "nothing includes %s/ but itself, tests/ and a part whose line names it" % b
    if LAYERS.index(b) > LAYERS.index(a):
        return "upward: %s includes %s" % (a, b)
    return None


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
            known = [i for i, e in enumerate(EXCEPTIONS) if e[0] == src and e[1] == dst]
            if known:
                used.update(known)
                continue
            bad.append("%s:%d: #include \"%s\": %s" % (src, n, dst, why))
    for i, (src, dst, _) in enumerate(EXCEPTIONS):
        if i not in used:
            bad.append("tests/lint/layers.py: exception %s -> %s no longer occurs: remove it" %
                       (src, dst))
    for line in bad:
        print(line)
    if bad:
        print("layers: %d violation(s) of the dependency direction (see tests/lint/layers.py)" %
              len(bad))
        return 1
    print("ok layers (%d includes, %d known exception(s))" % (checked, len(EXCEPTIONS)))
    for src, dst, why in EXCEPTIONS:
        print("  exception %s -> %s: %s" % (src, dst, why))
    return 0


if __name__ == "__main__":
    sys.exit(main())
