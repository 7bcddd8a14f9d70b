#!/usr/bin/env bash
# GPU check of R2CC-AllReduce with several degraded nodes and inside CUDA graphs (GPU
# machine only; run it under scripts/gpu/with-mps.sh: up to 4 emulated nodes share the
# GPU). Over the software fabric, 3 soft NICs a node, R2CC_MODE=3:
#   nt-*        NVIDIA's nccl-tests (NCCL_TESTS_DIR) all_reduce_perf -d all -o all with two
#               nodes declared degraded (different NICs), at 4 x 1 and 3 x 1 (one healthy
#               node then helps both); every row's #wrong must be 0
#   ntbh-*      one node declared, a second degraded by a black hole (R2CC_DRILL, the
#               library cutting the NIC) while the job runs (-d all -o all, as nt-*): the
#               ranks take the new view together, R2CC-AllReduce runs on both degraded
#               nodes for the types that follow; #wrong 0
#   graph-*     tests/gpu/torch_graph.py check: all_reduce captured into CUDA graphs,
#               replayed through a black hole that changes the view, every replay checked;
#               with a declared failure (the graph captured degraded) and without (a healthy
#               job's graph, then one captured after the repair)
#   quiet       a healthy mode-3 job with graphs: its log must hold no R2CC WARN
#   cost-*      tests/gpu/torch_graph.py cost: graph replay and eager time, plain NCCL
#               against R2CC healthy, R2CC Balance (mode 2) and R2CC-AllReduce (mode 3)
#               with a declared failure
# RUN_T: the time limit of each run, seconds (default 300). GRAPH_S: how long the graph
# runs replay (default 14).
# Every run fails on an R2CC-AllReduce step-aside warning (not for Avg: by design).
# Prints one line per run, and the R2CC lines that count (views, what ran); the logs go
# to LOGDIR. R2CC_LIB names the library (default BUILD/lib/libr2cc.so).
#   scripts/gpu/with-mps.sh scripts/gpu/gpu-ar2-multi.sh LOGDIR [PARTS]
# PARTS: a comma list of nt, ntbh, graph, graph-healthy, quiet, cost, cost-balance (default
# all).
set -u
cd "$(dirname "$0")/../.."
export R2CC_ROOT=$PWD
B=${BUILD:-build}
LIB=${R2CC_LIB:-$PWD/$B/lib/libr2cc.so}
LOG=${1:-logs/local}
PARTS=,${2:-nt,ntbh,graph,graph-healthy,quiet,cost,cost-balance},
mkdir -p "$LOG"
. scripts/softfabric.sh
fail=0
NICS=mlx5_0:100,mlx5_2:100,mlx5_3:100

# The R2CC lines that say what ran, counted.
r2cc_lines() {
	grep -hoE "R2CC (WARN .*|INFO (comm .*R2CC-AllReduce ran.*|comm .*failure view.*|comm .*node [0-9]+ has .*|comm .*repaired.*|comm .*auto: .*|R2CC-AllReduce: [0-9]+ ranks on .*))" "$1" |
		sed -E 's/comm 0x[0-9a-f]+( rank [0-9]+)?/comm/; s/helper rank [0-9]+/helper rank N/' |
		sort | uniq -c | sed 's/^/    /'
}

# nccl-tests' rows: how many have a nonzero #wrong (out of place, in place)
nt_wrong() {
	awk '/^ +[0-9]+ +[0-9]+ +[a-z0-9]+ +[a-z]+ +-?[0-9]+ / {
		rows++; if ($9 != "0" && $9 != "N/A") bad++; if ($13 != "0" && $13 != "N/A") bad++ }
		END { printf "%d rows, %d with wrong results", rows, bad }' "$1"
}

# expect NAME REGEX WHAT / expect_not NAME REGEX WHAT: a line of NAME's log that must
# (must not) be there, or the run fails with WHAT
expect() {
	grep -qE "$2" "$LOG/$1.log" || { echo "    FAILED: $3"; fail=1; }
}
expect_not() {
	! grep -qE "$2" "$LOG/$1.log" || { echo "    FAILED: $3: $(grep -m1 -E "$2" "$LOG/$1.log")"; fail=1; }
}
STEP_ASIDE='R2CC WARN R2CC-AllReduce: running Balance instead \((called|CUDA graph|more than|every node|a degraded|sub-comm)'

# one KIND NAME NP VAR=VALUE... -- ARGS: KIND nt (all_reduce_perf ARGS under mpirun, R2CC
# preloaded in mode 3) or torch (tests/gpu/torch_graph.py ARGS, the environment as given)
one() {
	local kind=$1 name=$2 np=$3 t0=$SECONDS rc ok=0 note='' rows
	shift 3
	local -a env=()
	while [ "$1" != -- ]; do env+=("$1"); shift; done
	shift
	softfabric_env $NICS "ar2m-$name-$$"
	echo "=== $name: ${np}x1 ${env[*]} $kind $*"
	if [ "$kind" = nt ]; then
		export NCCL_TESTS_DEVICE=0 # every rank on GPU 0 (the ranks share it)
		softfabric_mpirun "$np" LD_PRELOAD="$LIB" R2CC_MODE=3 R2CC_DEBUG=INFO "${env[@]}"
		timeout "${RUN_T:-300}" "${SOFTFABRIC_MPIRUN[@]}" "$NCCL_TESTS_DIR/all_reduce_perf" -g 1 -c 1 "$@" \
			>"$LOG/$name.log" 2>&1
		rc=$?
		note=": $(nt_wrong "$LOG/$name.log")"
		[ $rc = 0 ] && grep -q ' 0 with wrong' <<<"$note" && ! grep -q ' 0 rows' <<<"$note" && ok=1
		rows="Out of bounds|Avg bus"
	else
		env "${env[@]}" timeout "${RUN_T:-300}" python3 tests/gpu/torch_graph.py "$1" "$np" "${@:2}" \
			>"$LOG/$name.log" 2>&1
		rc=$?
		[ $rc = 0 ] && grep -q '^torch_graph .*: PASS' "$LOG/$name.log" && ok=1
		rows="^(torch |cost: |t=)"
	fi
	if [ $ok = 1 ]; then
		echo "    ok ($((SECONDS - t0)) s)$note"
	else
		echo "    FAILED rc=$rc ($((SECONDS - t0)) s)$note"
		fail=1
	fi
	grep -E "$rows" "$LOG/$name.log" | sed 's/^/    /'
	r2cc_lines "$LOG/$name.log"
	expect_not "$name" "$STEP_ASIDE" "$name: R2CC-AllReduce stepped aside"
	softfabric_reset
}
nt() { one nt "$@"; }
torch_run() { one torch "$@"; }

if [[ $PARTS == *,nt,* ]]; then
	nt nt-4x1-two-declared 4 'R2CC_FAILED_HCA=0:mlx5_2;2:mlx5_0' -- \
		-b 16M -e 32M -f 2 -n 2 -w 1 -d all -o all
	nt nt-3x1-two-declared 3 'R2CC_FAILED_HCA=0:mlx5_2;1:mlx5_3' -- \
		-b 16M -e 32M -f 2 -n 2 -w 1 -d all -o all
	for n in nt-4x1-two-declared nt-3x1-two-declared; do
		expect $n 'R2CC-AllReduce: [0-9]+ ranks on [0-9]+ nodes, 2 degraded nodes' \
			"$n: the two-node schedule was never set up"
	done
fi
if [[ $PARTS == *,ntbh,* ]]; then
	nt ntbh-4x1-declared-blackhole 4 R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2 \
		R2CC_DRILL=node2/mlx5_0=blackhole@3s -- -b 16M -e 32M -f 2 -n 4 -w 1 -d all -o all
	nt ntbh-3x1-declared-blackhole 3 R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2 \
		R2CC_DRILL=node1/mlx5_0=blackhole@3s -- -b 16M -e 32M -f 2 -n 4 -w 1 -d all -o all
	for n in ntbh-4x1-declared-blackhole ntbh-3x1-declared-blackhole; do
		expect $n 'failure view: [0-9]+ nodes, several degraded nodes' \
			"$n: the view never held the second degraded node"
	done
fi
if [[ $PARTS == *,graph,* ]]; then
	torch_run graph-3x1-declared-blackhole 3 LD_PRELOAD="$LIB" R2CC_MODE=3 R2CC_DEBUG=INFO \
		R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2 R2CC_DRILL=node1/mlx5_0=blackhole@3s -- check "${GRAPH_S:-14}"
	expect graph-3x1-declared-blackhole 'R2CC-AllReduce ran [0-9]+ times \([1-9][0-9]* of them captured' \
		"graph-3x1-declared-blackhole: no captured R2CC-AllReduce counted"
	expect graph-3x1-declared-blackhole 'failure view: [0-9]+ nodes, several degraded nodes' \
		"graph-3x1-declared-blackhole: the view never held the repaired node"
	[[ $PARTS == *,graph-healthy,* ]] && torch_run graph-3x1-healthy-blackhole 3 LD_PRELOAD="$LIB" R2CC_MODE=3 R2CC_DEBUG=INFO \
		R2CC_DRILL=node1/mlx5_0=blackhole@3s -- check 14
fi
if [[ $PARTS == *,quiet,* ]]; then
	torch_run quiet-3x1-healthy 3 LD_PRELOAD="$LIB" R2CC_MODE=3 R2CC_DEBUG=INFO -- check 4
	n=$(grep -c 'R2CC WARN' "$LOG/quiet-3x1-healthy.log")
	echo "    R2CC WARN lines in the healthy mode-3 job: $n"
	[ "$n" = 0 ] || fail=1
fi
if [[ $PARTS == *,cost,* ]]; then
	sizes="$((1 << 18)) $((16 << 20))"
	# shellcheck disable=SC2086
	torch_run cost-3x1-plain 3 R2CC_NONE=1 -- cost 40 $sizes
	# shellcheck disable=SC2086
	torch_run cost-3x1-r2cc-healthy 3 LD_PRELOAD="$LIB" R2CC_MODE=3 -- cost 40 $sizes
	# shellcheck disable=SC2086
	[[ $PARTS == *,cost-balance,* ]] && torch_run cost-3x1-r2cc-declared-balance 3 LD_PRELOAD="$LIB" R2CC_MODE=2 \
		R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2 -- cost 40 $sizes
	# shellcheck disable=SC2086
	torch_run cost-3x1-r2cc-declared-ar2 3 LD_PRELOAD="$LIB" R2CC_MODE=3 R2CC_DEBUG=INFO \
		R2CC_FAILED_NODE=0 R2CC_FAILED_HCA=mlx5_2 -- cost 40 $sizes
fi
exit $fail
