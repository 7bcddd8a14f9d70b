#!/usr/bin/env bash
# Runs verbs_preload over the software RDMA device without and with
# LD_PRELOAD=libr2cc.so: both transcripts must match line for line, and the
# preloaded run must show R2CC's wrappers and counters. Then the same for
# verbs_preload_direct (linked against libibverbs: by symbol).
#   tests/preload/run.sh [PROGRAM]     (default: both, one after the other)
set -u
B=${BUILD:-build}
if [ $# -eq 0 ]; then
	"$0" verbs_preload && exec "$0" verbs_preload_direct
fi
prog=$1
export LD_LIBRARY_PATH=$PWD/$B/softverbs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SOFTVERBS_FABRIC=r2cc-preload-$$ SOFTVERBS_NODE=node0 SOFTVERBS_NICS=mlx5_0:100
export R2CC_DEBUG=${R2CC_DEBUG:-WARN}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; "$B"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" reset >/dev/null 2>&1' EXIT
rc=0
"$B"/tests/preload/$prog --expect-real >"$tmp/plain" 2>&1 || { echo "plain run failed:"; cat "$tmp/plain"; rc=1; }
# R2CC_TEST_PRELOAD: what must come first (a sanitizer's runtime; README: Tests).
P=${R2CC_TEST_PRELOAD:+$R2CC_TEST_PRELOAD:}
LD_PRELOAD=$P$PWD/$B/lib/libr2cc.so "$B"/tests/preload/$prog --expect-wrapped >"$tmp/wrapped" 2>"$tmp/wrapped.err" ||
	{ echo "preloaded run failed:"; cat "$tmp/wrapped" "$tmp/wrapped.err"; rc=1; }
if ! diff -u "$tmp/plain" "$tmp/wrapped"; then
	echo "transcripts differ"; rc=1
fi
# Whose QPs they are (intercept/transport.h): what comes through the dlvsym door is
# NCCL's transport, even from a program that does not export pncclGetVersion; what
# comes by symbol from such a program is not, and says so once.
unprot=$(grep -c "NOT PROTECTED: queue pairs of $prog" "$tmp/wrapped.err")
want=0
[ "$prog" = verbs_preload_direct ] && want=1
if [ "$unprot" -ne $want ]; then
	echo "$prog: $unprot 'NOT PROTECTED' lines for its queue pairs, expected $want"
	grep "R2CC WARN" "$tmp/wrapped.err"
	rc=1
fi
# By symbol the names bind to libr2cc.so's exports whatever the mode; with R2CC_MODE=0
# they forward, and the data-path ops stay the provider's.
mode0=--expect-real
[ "$prog" = verbs_preload_direct ] && mode0=--expect-forwarded
LD_PRELOAD=$P$PWD/$B/lib/libr2cc.so R2CC_MODE=0 "$B"/tests/preload/$prog $mode0 >"$tmp/mode0" 2>&1 ||
	{ echo "R2CC_MODE=0 run is not pure pass-through:"; cat "$tmp/mode0"; rc=1; }
[ $rc -eq 0 ] && echo "$prog: preload transcripts identical ($(wc -l <"$tmp/plain") lines); wrappers, patched ops and counters seen"
exit $rc
