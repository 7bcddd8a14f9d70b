# shellcheck shell=bash
# Sourced by stall-matrix.sh and link-matrix.sh: the detection bound of a row of a
# black-hole kind. first_bound "MEDIAN / P99[ / MAX]" CORES: status 1, and a line saying
# why, when the first incident (fault to the first verdict) has a median of
# DETECT_MEDIAN_MS (50) or more or a 99th percentile of DETECT_P99_MS (100) or more; on a
# machine with fewer than CORES cores (the row's emulation starves there) the guard
# bounds, ALL_MEDIAN_MS (150) and ALL_MAX_MS (400), and a line saying so.
first_bound() {
	local first=$1 need=$2 have m=${DETECT_MEDIAN_MS:-50} p=${DETECT_P99_MS:-100}
	have=$(nproc)
	if [ "$have" -lt "$need" ]; then
		m=${ALL_MEDIAN_MS:-150} p=${ALL_MAX_MS:-400}
		echo "    $have cores, fewer than the $need this row's emulation needs: guard bounds only"
	fi
	if [ -z "$first" ] || ! awk -v d="$first" -v m="$m" -v p="$p" \
		'BEGIN { split(d, a, " / "); exit !(a[1] < m && a[2] < p) }'; then
		echo "    first incident ${first:-missing} ms (median / p99): bound median < $m, p99 < $p"
		return 1
	fi
}
