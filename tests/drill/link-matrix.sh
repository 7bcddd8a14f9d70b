#!/usr/bin/env bash
# Exactly once on both link layers: every NIC fault kind of the drill x {InfiniBand,
# RoCE v2} x {2, 4 processes} x {GPU flush off, on}, each cell over its own seeds. The
# flush cells put each connection on one NIC with 2 QPs (--no-fusion --qps 2), so that a
# repair spreads its data over NICs NCCL's flush QP is not on.
# RoCE runs a subnet per rail, routed between rails, with a lossless class that every
# byte must keep (--link roce); jitter must pass with no repair at all. Prints one row
# per cell: scenarios passed, the first incident (fault to the first verdict), every
# process's detection and migration times (median / max, ms).
# Detection bound, as tests/drill/stall-matrix.sh (tests/drill/bound.sh): for each
# black-hole kind and process count, the first incidents of its cells (both link layers,
# GPU flush off and on: 4 x SEEDS scenarios, 8 at least, so SEEDS of 2 or more) must have
# a median under DETECT_MEDIAN_MS (50) and a 99th percentile under DETECT_P99_MS (100);
# with SEEDS of 8 or more, each cell's too. 4-process cells on fewer than 4 cores (a starved emulation) are held to 150 / 400.
#   tests/drill/link-matrix.sh BUILD [SEEDS] [KINDS] [DRILL]
# SEEDS per cell (default 5: 40 per kind over the 8 cells of a kind); KINDS, a
# comma-separated list, defaults to every kind (- too); DRILL, the drill program's name
# in BUILD/bin (default r2cc-verbs-drill; r2cc-verbs-drill-direct reaches verbs by
# symbol, with no dlvsym). Exit status 1 if any cell failed.
set -u
B=${1:-build}
SEEDS=${2:-5}
KINDS=${3:--}
[ "$KINDS" = - ] && KINDS=down,blackhole,flap,slow,ackloss,blackhole-tx,blackhole-rx,fatal,jitter
KINDS=${KINDS//,/ }
D=$B/bin/${4:-r2cc-verbs-drill}
[ -x "$D" ] || { echo "link-matrix: $D missing (make)" >&2; exit 2; }
# shellcheck source=tests/drill/bound.sh
. "$(dirname "$0")/bound.sh"
pool=$(mktemp -d)
trap 'rm -rf "$pool"' EXIT
fail=0 cell=0
printf '%-13s %-5s %5s %-5s %9s %7s %22s %22s %22s\n' fault link procs flush scenarios passed \
	first_incident_ms detection_ms migration_ms
for kind in $KINDS; do
	for link in ib roce; do
		for procs in 2 4; do
			for flush in off on; do
				# every cell its own seeds, so that the suite covers SEEDS x 8 per kind
				args=(--fault "$kind" --link "$link" --procs "$procs" --seeds "$SEEDS"
					--first-seed $((1000 + cell * SEEDS)) --nccl-stub --timeout 60
					--summary "$pool/cell")
				cell=$((cell + 1))
				[ "$procs" = 4 ] && args+=(--nics 2)
				# GPU flush with a connection on one NIC and 2 QPs: a repair spreads
				# its data over NICs that NCCL's flush QP is not on
				[ "$flush" = on ] && args+=(--flush --no-fusion --qps 2)
				[ "$kind" = jitter ] && args+=(--expect no-repair)
				out=$("$D" "${args[@]}" 2>&1)
				rc=$?
				[ -f "$pool/cell" ] && sed -n 's/.* detect_ms=\([0-9.]*\) .*/\1/p' "$pool/cell" >>"$pool/$kind-$procs"
				rm -f "$pool/cell"
				last=$(echo "$out" | tail -1)
				passed=$(echo "$last" | sed -n 's/.*scenarios \([0-9]*\)\/\([0-9]*\).*/\1/p')
				det=$(echo "$last" | sed -n 's/.* detection median \([0-9.]*\) ms max \([0-9.]*\) ms.*/\1 \/ \2/p')
				first=$(echo "$last" | sed -n 's/.* first-incident median \([0-9.]*\) ms max \([0-9.]*\) ms p99 \([0-9.]*\) ms.*/\1 \/ \3/p')
				mig=$(echo "$last" | sed -n 's/.*migration median \([0-9.]*\) ms max \([0-9.]*\) ms.*/\1 \/ \2/p')
				printf '%-13s %-5s %5s %-5s %9s %7s %22s %22s %22s\n' "$kind" "$link" "$procs" \
					"$flush" "$SEEDS" "${passed:-0}" "${first:--}" "${det:--}" "${mig:--}"
				case $kind in blackhole | ackloss | blackhole-tx | blackhole-rx)
					[ "$SEEDS" -ge 8 ] && { first_bound "$first" "$procs" || fail=1; }
					;;
				esac
				if [ $rc -ne 0 ]; then
					fail=1
					{ echo "$out" | grep -E "FAIL|R2CC WARN" || echo "$out" | tail -3; } |
						head -8 | cut -c1-400 | sed 's/^/    /'
				fi
			done
		done
	done
	case $kind in blackhole | ackloss | blackhole-tx | blackhole-rx)
		for procs in 2 4; do
			[ -s "$pool/$kind-$procs" ] || continue
			n=$(wc -l <"$pool/$kind-$procs")
			stats=$(sort -n "$pool/$kind-$procs" | awk '{ v[NR] = $1 } END {
				m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
				k = int((99 * NR + 99) / 100); printf "%.1f / %.1f", m, v[k] }')
			if [ "$n" -lt 8 ]; then
				echo "    $kind, $procs processes, every cell: first incident $stats ms (median / p99 of $n: too few for the bound)"
				continue
			fi
			echo "    $kind, $procs processes, every cell: first incident $stats ms (median / p99 of $n)"
			first_bound "$stats" "$procs" || fail=1
		done
		;;
	esac
done
exit $fail
