#!/usr/bin/env bash
# Checks that every program and library of rdma-core's Debian packages (perftest,
# ibverbs-utils, rdmacm-utils, librdmacm1, python3-pyverbs, ibverbs-providers) loads
# against the software RDMA device: each libibverbs symbol it links, at its version,
# is exported by the device (objdump -T), and the dynamic linker resolves everything
# with the device first on LD_LIBRARY_PATH (ldd -r, which binds every function as
# LD_BIND_NOW does). Then imports every pyverbs module and runs ibv_devinfo over the
# device. Fails on the first package missing (scripts/deps.sh installs them).
#
#   tests/softverbs/abi.sh BUILD_DIR
set -u
build=${1:-build}
lib=$build/softverbs/libibverbs.so.1
pkgs="perftest ibverbs-utils rdmacm-utils librdmacm1 python3-pyverbs ibverbs-providers"
export LD_LIBRARY_PATH=$PWD/$build/softverbs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# R2CC_TEST_PRELOAD: a sanitizer's runtime, which must be the first library of the
# (uninstrumented) rdma-core programs that load the sanitized device.
[ -n "${R2CC_TEST_PRELOAD:-}" ] && export LD_PRELOAD=$R2CC_TEST_PRELOAD${LD_PRELOAD:+:$LD_PRELOAD}
export SOFTVERBS_FABRIC=svabi-$$ SOFTVERBS_NODE=abi
rc=0
[ -e "$lib" ] || { echo "FAIL abi: $lib not built"; exit 1; }
# "VERSION name" of every symbol the device defines.
exported=$(objdump -T "$lib" | awk '$0 !~ /\*UND\*/ && /IBVERBS/ {v=$(NF-1); gsub(/[()]/, "", v); print v, $NF}')
files=()
for p in $pkgs; do
	if ! dpkg -s "$p" >/dev/null 2>&1; then
		echo "FAIL abi: package $p is not installed (scripts/deps.sh installs it)"
		exit 1
	fi
	while read -r f; do
		[ -f "$f" ] && [ ! -L "$f" ] && head -c 4 "$f" | grep -q ELF && files+=("$f")
	done < <(dpkg -L "$p" | grep -E '/s?bin/|\.so')
done
checked=0
for f in "${files[@]}"; do
	need=$(objdump -T "$f" 2>/dev/null |
		awk '/\*UND\*/ && /IBVERBS/ {v=$(NF-1); gsub(/[()]/, "", v); print v, $NF}')
	[ -n "$need" ] || continue
	checked=$((checked + 1))
	missing=$(comm -23 <(sort -u <<<"$need") <(sort -u <<<"$exported"))
	if [ -n "$missing" ]; then
		echo "FAIL abi: $f links what the device does not export:"
		sed 's/^/    /' <<<"$missing"
		rc=1
	fi
	# The dynamic linker's view: the device is the libibverbs found, and binds everything.
	out=$(ldd -r "$f" 2>&1)
	if ! grep -q "libibverbs.so.1 => $PWD/$lib" <<<"$out"; then
		echo "FAIL abi: $f does not load the device as libibverbs.so.1"
		rc=1
	fi
	if grep -E "not found|undefined symbol" <<<"$out" | grep -qE "IBVERBS|libibverbs|ibv_|verbs_"; then
		echo "FAIL abi: $f:"
		grep -E "not found|undefined symbol" <<<"$out" | sed 's/^/    /'
		rc=1
	fi
done
[ $checked -ge 30 ] || { echo "FAIL abi: only $checked files link libibverbs"; rc=1; }
# pyverbs loads every module of its own at import; a missing name fails the import.
mods=$(cd /usr/lib/python3/dist-packages && find pyverbs -name '*.so' | sed 's/\.cpython.*//; s|/|.|g')
if ! LD_BIND_NOW=1 /usr/bin/python3 -c "import importlib, sys
for m in sys.argv[1:]:
    importlib.import_module(m)" $mods; then
	echo "FAIL abi: a pyverbs module does not import over the device"
	rc=1
fi
if ! LD_BIND_NOW=1 ibv_devinfo -v >/dev/null; then
	echo "FAIL abi: ibv_devinfo -v over the device"
	rc=1
fi
"$build/bin/softverbs-ctl" reset >/dev/null
[ $rc -eq 0 ] && echo "ok abi ($checked files, $(wc -w <<<"$mods") pyverbs modules)"
exit $rc
