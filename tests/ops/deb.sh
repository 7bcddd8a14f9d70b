#!/usr/bin/env bash
# The package on this machine, with dpkg itself (make test-ops; needs root): lintian
# reports no error and no warning; dpkg -i installs it, and the installed r2cc finds
# its library and runs r2cc doctor and r2cc run from /; the software RDMA device stays
# off the default library path; a second version installs over the first (upgrade);
# dpkg -r and dpkg -P leave nothing of it behind. Lintian is installed with apt-get
# where missing. A machine where r2cc is installed already is left alone.
#   tests/ops/deb.sh BUILD
set -u
B=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || fail "dpkg -i needs root"
if dpkg-query -W -f '${Status}' r2cc 2>/dev/null | grep -q installed; then
	fail "r2cc is installed on this machine already ($(dpkg-query -W -f '${Version}' r2cc)): not touching it"
fi
trap 'dpkg -P r2cc >/dev/null 2>&1; rm -rf "$T"' EXIT
say() { echo "\$ $*"; "$@"; }

for v in 1 2; do
	make --no-print-directory -s -C "$ROOT" deb BUILD="$B" DEB_DIR="$T/v$v" \
		DEB_VERSION="0.1+opstest$v-1" >"$T/make$v" 2>&1 || { cat "$T/make$v"; fail "make deb"; }
done
v1=$(ls "$T"/v1/*.deb) v2=$(ls "$T"/v2/*.deb)

if ! command -v lintian >/dev/null; then
	echo "installing lintian"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lintian >/dev/null ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lintian >/dev/null; } ||
		fail "cannot install lintian"
fi
echo "\$ lintian $(basename "$v1")"
lintian "$v1" 2>&1 | grep -v 'running with root privileges' | tee "$T/lintian"
grep -qE '^[EW]: ' "$T/lintian" && fail "lintian: errors or warnings"
echo "lintian: no error, no warning ($(lintian --version))"

installed() { # VERSION: dpkg's status and version, the files dpkg recorded intact
	[ "$(dpkg-query -W -f '${Status} ${Version}' r2cc)" = "install ok installed $1" ] ||
		fail "dpkg-query: $(dpkg-query -W -f '${Status} ${Version}' r2cc 2>&1), expected $1"
	dpkg -V r2cc || fail "dpkg -V r2cc: files changed"
	(cd / && r2cc --help >/dev/null) || fail "r2cc --help from /"
	(cd / && r2cc doctor --json >"$T/doctor.json" 2>/dev/null)
	[ "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["r2cc"]["library"])' \
		"$T/doctor.json")" = /usr/lib/r2cc/lib/libr2cc.so ] ||
		fail "the installed r2cc doctor does not find /usr/lib/r2cc/lib/libr2cc.so"
	[ "$(cd / && r2cc run -- sh -c 'grep -o "/[^ ]*libr2cc.so" /proc/self/maps | sort -u')" = \
		/usr/lib/r2cc/lib/libr2cc.so ] || fail "r2cc run does not preload /usr/lib/r2cc/lib/libr2cc.so"
	ldconfig -p | grep -E 'lib(ibverbs|mlx5|nccl|r2cc)\.so' | grep /usr/lib/r2cc &&
		fail "a library of the package is on the default library path"
	echo "installed $1: dpkg -V clean; r2cc doctor and r2cc run from / use /usr/lib/r2cc/lib/libr2cc.so; nothing of it on ldconfig's path"
}
gone() {
	local left
	left=$(ls -d /usr/lib/r2cc /usr/bin/r2cc* /usr/bin/softverbs-ctl /usr/share/doc/r2cc \
		/usr/share/man/man1/r2cc*.1.gz /usr/share/lintian/overrides/r2cc 2>/dev/null)
	[ -z "$left" ] || fail "left behind: $left"
}

say dpkg -i "$v1" || fail "dpkg -i"
installed 0.1+opstest1-1
say dpkg -i "$v2" || fail "dpkg -i (upgrade)"
installed 0.1+opstest2-1
say dpkg -r r2cc || fail "dpkg -r"
dpkg-query -W -f '${Status}\n' r2cc 2>/dev/null | grep -qv 'not-installed' &&
	fail "after dpkg -r: $(dpkg-query -W -f '${Status}' r2cc)"
gone
echo "removed: no file of r2cc left"
say dpkg -i "$v1" || fail "dpkg -i again"
installed 0.1+opstest1-1
say dpkg -P r2cc || fail "dpkg -P"
dpkg-query -W r2cc >/dev/null 2>&1 && [ -n "$(dpkg-query -W -f '${Status}' r2cc | grep -v not-installed)" ] &&
	fail "after dpkg -P: $(dpkg-query -W -f '${Status}' r2cc)"
gone
echo "purged: no file of r2cc left, dpkg knows no r2cc"
echo "PASS: lintian clean; install, upgrade, remove and purge of r2cc"
