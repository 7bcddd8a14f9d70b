#!/usr/bin/env bash
# 1 KiB against 2 KiB write latency over the soft device (the goal: 1 KiB at most 1.5
# times 2 KiB): ROUNDS rounds of `ib_write_lat -s 1024` then `-s 2048` (-n 5000 -F),
# each between two emulated nodes on a fresh fabric; prints every round's t_typical and
# the medians, their ratio and the per-round ratio's median and quartiles.
#   tests/softverbs/lat-ratio.sh BUILD_DIR [ROUNDS]     (ROUNDS default 15)
set -u
build=${1:-build}
rounds=${2:-15}
command -v ib_write_lat >/dev/null || { echo "ib_write_lat not installed (scripts/deps.sh)"; exit 1; }
export LD_LIBRARY_PATH=$PWD/$build/softverbs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# one SIZE: t_typical in microseconds, or nothing
lat() {
	local port=$((30000 + RANDOM % 20000)) srv
	export SOFTVERBS_FABRIC=svlat-$$-$1-$RANDOM
	SOFTVERBS_NODE=node0 timeout 60 ib_write_lat -s "$1" -n 5000 -F -p $port >"$out/srv" 2>&1 &
	srv=$!
	sleep 0.4
	SOFTVERBS_NODE=node1 timeout 60 ib_write_lat -s "$1" -n 5000 -F -p $port localhost \
		>"$out/cli" 2>&1
	wait $srv
	"$build/bin/softverbs-ctl" reset >/dev/null 2>&1
	grep -E "^ *$1 " "$out/cli" | awk '{print $5}'
}

for _ in $(seq 1 "$rounds"); do
	echo "$(lat 1024) $(lat 2048)"
done | tee "$out/rows"
python3 - "$out/rows" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 2]
if not rows:
    sys.exit("no complete round")
a = [float(r[0]) for r in rows]
b = [float(r[1]) for r in rows]
q = sorted(x / y for x, y in zip(a, b))
print("rounds %d: t_typical medians 1 KiB %.2f us, 2 KiB %.2f us, ratio %.2f; per-round "
      "ratio median %.2f, quartiles %.2f %.2f" % (len(rows), st.median(a), st.median(b),
      st.median(a) / st.median(b), st.median(q), q[len(q) // 4], q[3 * len(q) // 4]))
PY
