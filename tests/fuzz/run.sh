#!/usr/bin/env bash
# Runs every fuzz target (tests/fuzz/README.md) for SECONDS each, one after the other:
#   tests/fuzz/run.sh FUZZ_DIR SECONDS [keep]
# over its seeds (tests/fuzz/corpus/NAME) and its regression inputs
# (tests/fuzz/regress/NAME, each a reproducer of a fixed finding). With `keep`, the
# grown corpus stays in FUZZ_DIR/corpus/NAME for the next run; crash reproducers go
# to FUZZ_DIR/crash. Prints one line per target (executions, cov, ft, corpus) and
# fails if any target found a crash, a leak or a timeout.
set -u
dir=$1 secs=$2 keep=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir/crash"
rc=0
for bin in "$dir"/fuzz_*; do
	[ -x "$bin" ] || continue
	name=${bin##*/fuzz_}
	if [ "$keep" = keep ]; then
		work=$dir/corpus/$name
	else
		work=$(mktemp -d)
	fi
	mkdir -p "$work"
	extra=()
	[ -d "$here/regress/$name" ] && extra+=("$here/regress/$name")
	log=$dir/$name.log
	"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$dir/crash/$name-" "$work" "$here/corpus/$name" "${extra[@]+"${extra[@]}"}" \
		>"$log" 2>&1
	st=$?
	done_line=$(grep -E '^#[0-9]+\s+DONE' "$log" | tail -1)
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
	ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
	corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$done_line")
	if [ $st -eq 0 ]; then
		echo "fuzz $name: ${execs:-?} execs in ${secs} s, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}, no crash"
	else
		echo "fuzz $name: FAILED (status $st); libFuzzer's log:"
		grep -E 'ERROR|SUMMARY|runtime error|Test unit written|#[0-9]+ ' "$log" | tail -20
		rc=1
	fi
	[ "$keep" = keep ] || rm -rf "$work"
done
out=()
[ "$keep" = keep ] && out=("$dir/corpus/results")
python3 "$here/results_fuzz.py" "$secs" "${out[@]:-}" "$dir/crash" || rc=1
exit $rc
