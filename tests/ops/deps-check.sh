#!/usr/bin/env bash
# A plain `make` where a build dependency is missing stops at once, before compiling
# anything, with the list of what is missing and the command that installs it
# (scripts/deps.sh --check, run by the top Makefile), not with a compiler error.
# Missing headers are simulated without uninstalling anything: the compiler is given
# an include folder whose infiniband/verbs.h (or openssl/evp.h) is an #error, found
# before the system's; nccl.h by pointing CUDA_HOME and BUILD where there is none.
#   tests/ops/deps-check.sh
set -u
# The make that runs the tests passes its own variables (a sanitizer's CC, BUILD) down
# in MAKEFLAGS: the makes here must see only what each case gives them.
unset MAKEFLAGS MFLAGS MAKELEVEL
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
nfail=0
fail() { echo "FAIL: $*"; nfail=$((nfail + 1)); }

# expect DESC WANT... -- MAKE-ARGS: make -n (nothing would be built anyway) stops with
# the check's message holding every WANT, before any compiler ran and in seconds.
expect() {
	local desc=$1 wants=() rc start secs
	shift
	while [ "$1" != -- ]; do wants+=("$1"); shift; done
	shift
	start=$(date +%s%N)
	make --no-print-directory -n -C "$ROOT" BUILD="$T/build" "$@" >"$T/out" 2>"$T/err"
	rc=$?
	secs=$(( ($(date +%s%N) - start) / 1000000 ))
	local ok=1
	[ $rc -ne 0 ] || ok=0
	for w in "${wants[@]}"; do grep -qF -- "$w" "$T/err" || ok=0; done
	grep -q "missing build dependencies (listed above).  Stop." "$T/err" || ok=0
	grep -qE "No such file or directory|#error" "$T/err" "$T/out" && ok=0
	[ ! -e "$T/build" ] || ok=0
	if [ $ok = 1 ]; then
		echo "ok: $desc: make stops in $secs ms:"
		sed 's/^/    /' "$T/err"
	else
		fail "$desc (exit $rc)"; cat "$T/err"; head -5 "$T/out"
	fi
}

mkdir -p "$T/noverbs/infiniband" "$T/nossl/openssl"
echo '#error simulated: not installed' >"$T/noverbs/infiniband/verbs.h"
echo '#error simulated: not installed' >"$T/nossl/openssl/evp.h"
expect "no libibverbs-dev" "infiniband/verbs.h (libibverbs-dev)" "apt-get install libibverbs-dev" \
	"make deps" -- CC="cc -I$T/noverbs"
expect "no libibverbs-dev, no libssl-dev" "infiniband/verbs.h (libibverbs-dev)" \
	"openssl/evp.h (libssl-dev)" "apt-get install libibverbs-dev libssl-dev" -- \
	CC="cc -I$T/noverbs -I$T/nossl"
expect "no C compiler" "(the C compiler)" "apt-get install gcc" -- CC="$T/no-such-cc"
if [ ! -e /usr/include/nccl.h ]; then
	expect "no nccl.h" "nccl.h (NCCL's headers" "scripts/deps.sh" -- CUDA_HOME=/nonexistent NCCL_HOME=
fi
# With everything there the check says nothing; DEPS_CHECK=0 skips it.
make --no-print-directory -n -C "$ROOT" all >/dev/null 2>"$T/err" && [ ! -s "$T/err" ] ||
	{ fail "make -n all with every dependency there"; cat "$T/err"; }
make --no-print-directory -n -C "$ROOT" BUILD="$T/build" DEPS_CHECK=0 CC="cc -I$T/noverbs" all \
	>/dev/null 2>"$T/err" || { fail "DEPS_CHECK=0 did not skip the check"; cat "$T/err"; }
[ $nfail = 0 ] && echo "PASS: missing build dependencies stop make at once, with what to install"
[ $nfail = 0 ]
