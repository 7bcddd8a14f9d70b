#!/usr/bin/env bash
# The fault-injection walk (shim/fault.h): one drill scenario (a NIC cut during
# traffic, hot repair, every byte checked) is run once with R2CC_FAULT_INJECT=count
# to count R2CC's allocations, own verbs calls, control-plane sends and slow-path
# posts (an injected one is refused as by a dead device) in each worker, then once
# per injection point N (kind:N, in every worker) and each run is classified:
#   pass         the job completed with every byte correct (R2CC degraded or repaired)
#   clean-error  the application got an error (an error completion, or a verbs call
#                such as post_send that returned an error) and every process exited
#                on its own
#   CRASH / HANG / WRONG   a worker died of a signal / the drill's deadline struck /
#                          delivered data was corrupt, duplicated or late
# Any of the last three fails the walk.
#   [WALK_SCENARIO="drill options"] tests/fault/walk.sh BUILD POINTS [TABLE] [+]
# POINTS 0 walks every point; POINTS K walks K points of each kind spread evenly over
# its calls (CI: tests/fault/module.mk). TABLE gets one line per run: kind N outcome
# seconds detail. With '+', every call of the kind fails from the Nth on (kind:N+):
# memory, verbs or the control plane stay unavailable, as in a real shortage.
set -u
B=${1:-build} points=${2:-0} table=${3:-} from=${4:-}
# WALK_SCENARIO: another scenario's drill options instead (e.g. "--fault down --seeds 1
# --first-seed 2 --flush --no-fusion --qps 2" for the GPU flush's helpers; "flush" is
# short for that)
[ "${WALK_SCENARIO:-}" = flush ] && WALK_SCENARIO="--fault down --seeds 1 --first-seed 2 --flush --no-fusion --qps 2"
read -r -a scenario <<<"${WALK_SCENARIO:---fault down --seeds 1 --first-seed 7}"
drill=("$B/bin/r2cc-verbs-drill" "${scenario[@]}" --nccl-stub --timeout 30)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}

R2CC_FAULT_INJECT="count:$tmp/count.%p" "${drill[@]}" >"$tmp/count.out" 2>&1 ||
	{ echo "walk: the counting run failed:"; cat "$tmp/count.out"; exit 1; }
kinds=(alloc verbs send post)
declare -A max
for k in "${kinds[@]}"; do
	max[$k]=$(cat "$tmp"/count.* 2>/dev/null | awk -v k=$k '$1 == k && $2 > m { m = $2 } END { print m + 0 }')
done
[ "${max[alloc]}" -gt 0 ] || { echo "walk: no counts were written"; exit 1; }
# A scenario whose fault hit no connection (nothing detected) walks no repair.
if grep -q 'detection n/a' "$tmp/count.out"; then
	echo "walk: the scenario's fault moved no QP (detection n/a); pick another seed:"
	tail -n2 "$tmp/count.out"
	exit 1
fi
counts="alloc ${max[alloc]}, verbs ${max[verbs]}, send ${max[send]}, post ${max[post]}"
walking="walking ${points/#0/all}${from:+, each failing from N on}"
echo "walk: ${drill[*]}"
echo "walk: injection points per worker: $counts ($walking)"
[ -n "$table" ] && {
	echo "# ${drill[*]}"
	echo "# injection points per worker: $counts; $walking"
	echo "# kind N outcome detail"
} >"$table"

bad=0
declare -A tally
for k in "${kinds[@]}"; do
	# Two more than counted: the counts vary a little from run to run.
	last=$((max[$k] + 2)) stride=1
	[ "$points" -gt 0 ] && stride=$(((last + points - 1) / points))
	for ((n = 1; n <= last; n += stride)); do
		out=$tmp/run.out
		start=$(date +%s.%N)
		R2CC_FAULT_INJECT=$k:$n$from timeout 120 "${drill[@]}" >"$out" 2>&1
		st=$?
		secs=$(echo "$(date +%s.%N) - $start" | bc)
		line=$(grep -m1 -E '^down +seed' "$out")
		detail=${line##* -- }
		[ "$detail" = "$line" ] && detail=""
		if tail -n1 "$out" | grep -q '^PASS'; then
			what=pass
		elif [ $st -eq 124 ] || grep -q 'stalled: timed out' <<<"$line"; then
			what=HANG
		elif grep -q 'died of signal' <<<"$line"; then
			what=CRASH
		elif grep -qE 'corrupt|duplicate|check failure' <<<"$line"; then
			what=WRONG
		elif grep -qE 'exited with status|error completion|failed|(post_send|post_recv|poll_cq|ibv_[a-z_]+)[^:]*: [A-Z]' <<<"$line"; then
			what=clean-error
		else
			what=UNKNOWN
		fi
		tally[$what]=$((${tally[$what]:-0} + 1))
		case $what in pass | clean-error) ;; *)
			bad=1
			echo "walk: $k:$n$from $what: $detail"
			sed -n '1,40p' "$out"
			;;
		esac
		[ -n "$table" ] && printf '%s %d %s %.1fs %s\n' "$k" "$n" "$what" "$secs" "$detail" >>"$table"
	done
done
summary=""
for w in pass clean-error CRASH HANG WRONG UNKNOWN; do
	[ -n "${tally[$w]:-}" ] && summary+="$w ${tally[$w]}, "
done
echo "walk: ${summary%, }"
[ -n "$table" ] && echo "# outcomes: ${summary%, }" >>"$table"
exit $bad
