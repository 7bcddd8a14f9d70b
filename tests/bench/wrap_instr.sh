#!/usr/bin/env bash
# The instructions R2CC's verbs wrappers execute per call, counted by valgrind's
# callgrind over tests/bench/wrap_cost's verbs loops on the software device (make
# bench, when valgrind is installed). Unlike wrap_cost's nanoseconds, which move by
# +- 10 ns between runs of the same build, the counts are the same run after run: a
# change to the wrappers shows in them exactly. What they leave out is what an
# instruction costs (cache misses, locked instructions); wrap_cost has that.
#   tests/bench/wrap_instr.sh [LIB] [QPS]   (LIB: a libr2cc.so, default BUILD's; QPS:
#   how many QPs wrap_cost's round turns over, default 1)
# Prints, per call: the post wrapper's own instructions (the provider's post left
# out), the poll wrapper's (most polls find nothing; the provider's poll left out),
# and per completion the shadow's retirement and the QP lookup by number.
set -eu
B=${BUILD:-build}
LIB=${1:-$PWD/$B/lib/libr2cc.so}
QPS=${2:-1}
case $QPS in '' | *[!0-9]*) QPS=0 ;; esac
if [ "$QPS" -lt 1 ] || [ "$QPS" -gt 256 ]; then
	echo "wrap_instr: QPS: a number of QPs from 1 to 256 (wrap_cost's limit), not '${2:-}'" >&2
	exit 2
fi
command -v valgrind >/dev/null || {
	echo "wrap_instr: no valgrind (apt-get install valgrind): left out"
	exit 0
}
export LD_LIBRARY_PATH=$PWD/$B/softverbs SOFTVERBS_FABRIC=r2cc-instr-$$ SOFTVERBS_NODE=n0
export SOFTVERBS_NICS=mlx5_0:100
out=$(mktemp)
trap '"$B"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" reset >/dev/null 2>&1 || true; rm -f "$out"' EXIT
LD_PRELOAD=$LIB valgrind --tool=callgrind --callgrind-out-file="$out" \
	"$B"/tests/bench/wrap_cost verbs "$QPS" >/dev/null 2>&1
{
	callgrind_annotate --auto=no --threshold=100 "$out"
	echo "== calls"
	callgrind_annotate --auto=no --tree=calling --threshold=100 "$out"
} 2>/dev/null | QPS=$QPS python3 -c '
import os, re, sys
# Own instructions (callgrind self cost) of the functions each wrapper runs, summed over
# every source file their code came from (inlined headers show as entries of their
# own); divided by the calls of the provider function the wrapper called.
POST = {"wrap_post_send", "post_send_slow", "post_send_mended", "record_sends",
        "r2cc_qp_shadow_post_send_all", "r2cc_qp_shadow_post_send",
        "r2cc_qp_shadow_unpost_send", "r2cc_cts_tag"}
POLL = {"wrap_poll_cq", "poll_slow", "poll_got", "r2cc_qp_shadow_wc",
        "r2cc_qp_shadow_send_completed", "r2cc_qp_shadow_recv_completed", "r2cc_qp_by_num",
        "r2cc_qp_by_num_hot", "r2cc_repair_probe_done"}
RETIRE = {"r2cc_qp_shadow_wc", "r2cc_qp_shadow_send_completed", "r2cc_qp_shadow_recv_completed"}
BYNUM = {"r2cc_qp_by_num", "r2cc_qp_by_num_hot"}
MISS = "r2cc_map_get_miss"  # misses of the lookup caches, shared out to their callers
own, calls, cur, tree = {}, {}, None, False
for line in sys.stdin:
    if line.startswith("== calls"):
        tree = True
        continue
    if not tree:
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S+?):(\S+)", line)
        if m:
            fn = m.group(3)
            own[fn] = own.get(fn, 0) + int(m.group(1).replace(",", ""))
        continue
    m = re.match(r"\s*[\d,]+ \([^)]*\)\s+(\*|>)\s+\S+?:(\S+)(?: \(([\d,]+)x\))?", line)
    if not m:
        continue
    if m.group(1) == "*":
        cur = m.group(2)
    elif cur and m.group(3):
        calls[(cur, m.group(2))] = calls.get((cur, m.group(2)), 0) + int(m.group(3).replace(",", ""))
def ncalls(callers, callee):
    return sum(calls.get((c, callee), 0) for c in callers)
misses = sum(n for (c, f), n in calls.items() if f == MISS)
def per(fns, n):
    miss = own.get(MISS, 0) * ncalls(fns, MISS) / misses if misses else 0
    return (sum(own.get(f, 0) for f in fns) + miss) / n if n else float("nan")
nposts = ncalls(POST, "sv_post_send")
npolls = ncalls(POLL, "sv_poll_cq")
nwc = ncalls(POLL, "r2cc_qp_shadow_wc")
print("R2CC instructions (round over %s QPs): %.0f a post (%d posts), %.1f a poll call (%d calls, %d completions); "
      "a completion: %.0f in the shadow retirement, %.0f in the QP lookup by number"
      % (os.environ["QPS"], per(POST, nposts), nposts, per(POLL, npolls), npolls, nwc,
         per(RETIRE, nwc), per(BYNUM, nwc)))
'
