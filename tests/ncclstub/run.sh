#!/usr/bin/env bash
# Runs the NCCL pass-through test one way (the entries of CPU_TESTS in module.mk):
#   run.sh DIR LIBR2CC direct        no preload: every NCCL call goes straight to the stub
#   run.sh DIR LIBR2CC preload MODE  under LD_PRELOAD=LIBR2CC with R2CC_MODE=MODE; MODE 0
#                                    promises plain NCCL, so it runs with --strict
#   run.sh DIR LIBR2CC old MODE      the NCCL 2.18-like stub (DIR/old): bare, then preloaded
#   run.sh DIR LIBR2CC wrapped MODE  preloaded, and LIBR2CC must interpose NCCL's functions
#   run.sh DIR LIBR2CC negative      each planted wrong expectation must make the check fail
# DIR is the build folder of tests/ncclstub. Exit status 0: the test passed.
set -u
if [ $# -lt 3 ]; then
	echo "usage: $0 DIR LIBR2CC direct|preload|old|wrapped|negative [MODE]" >&2
	exit 2
fi
dir=$1 lib=$2 how=$3 mode=${4:-2}

preloaded() {
	local strict=()
	[ "$mode" = 0 ] && strict=(--strict)
	echo "run.sh: LD_PRELOAD=$lib R2CC_MODE=$mode $* ${strict[*]}"
	# R2CC_TEST_PRELOAD: what must come first (a sanitizer's runtime; README: Tests).
	LD_PRELOAD=${R2CC_TEST_PRELOAD:+$R2CC_TEST_PRELOAD:}$lib R2CC_MODE=$mode "$@" "${strict[@]+"${strict[@]}"}"
}

if [ "$how" != direct ] && [ "$how" != negative ]; then
	[ -f "$lib" ] || { echo "run.sh: $lib is not built" >&2; exit 2; }
	lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
fi
case $how in
direct) exec "$dir/passthrough" --expect-direct ;;
preload) preloaded "$dir/passthrough" ;;
old) "$dir/old/passthrough" --expect-direct && preloaded "$dir/old/passthrough" ;;
wrapped) preloaded "$dir/passthrough" --expect-wrapped ;;
negative)
	bad=0
	for kind in arg id result out missing extra; do
		"$dir/passthrough" --inject="$kind" >/dev/null
		rc=$?
		if [ $rc -eq 1 ]; then
			echo "run.sh: --inject=$kind detected"
		else
			echo "run.sh: --inject=$kind NOT detected (exit status $rc, want 1)"
			bad=1
		fi
	done
	exit $bad
	;;
*)
	echo "run.sh: unknown way '$how'" >&2
	exit 2
	;;
esac
