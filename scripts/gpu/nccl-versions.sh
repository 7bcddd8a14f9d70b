#!/usr/bin/env bash
# The NCCL libraries of the version matrix (issue #17, scripts/gpu/gpu-compat.sh), made on a
# machine that reaches PyPI for the GPU machine, which reaches no package index and takes at
# most 64 MiB of files per call. The nvidia-nccl-cu12 wheels hold 290-400 MB libraries; the
# slimming tool zeroes the device code of every architecture but sm_90 (H100/H200), keeping
# the file's layout, so that xz brings each library to 13-40 MB.
#
#   scripts/gpu/nccl-versions.sh [-d DIR] [--slim TOOL] [--force] VERSION...
#   scripts/gpu/nccl-versions.sh --list [VERSION...]
#
# For each VERSION: downloads the x86_64 wheel nvidia-nccl-cu12==VERSION (pip download
# --no-deps --only-binary=:all:, into a temporary folder, removed afterwards), takes
# nvidia/nccl/lib/libnccl.so.2 and nvidia/nccl/include/*.h, runs TOOL on the library, and
# writes
#   DIR/libnccl-VERSION-sm90.so.2.xz   the slimmed library (xz -9)
#   DIR/include-VERSION/               the wheel's headers
#   DIR/versions.txt                   one line per version: sizes, sm_90 code kept, sha256
# It then checks what it wrote: the xz file decompresses, the library loads and its
# ncclGetVersion() reports VERSION (no GPU needed for that), and sm_90 code was kept.
# An existing DIR/libnccl-VERSION-sm90.so.2.xz is kept unless --force.
#
# --list: which of the VERSIONs (default: the matrix of issue #17) PyPI holds for cu12, and
# for one it lacks, the nearest that exists (same minor, else the closest release).
#
# DIR: default .artifacts in the checkout. A DIR inside the checkout must be ignored by git:
# nothing fetched is ever committed. TOOL: NCCL_SLIM, default ../shared/tools/nccl-slim.py
# beside the checkout (the tool is not part of this repository). PIP: the pip command,
# default "python3 -m pip".
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
PKG=nvidia-nccl-cu12
MATRIX="2.18.3 2.19.3 2.20.5 2.21.5 2.23.4 2.24.3 2.25.1 2.26.5 2.27.7 2.28.3 2.28.9 2.29.7 2.30.7 2.31.2 2.32.3"
DIR=.artifacts
SLIM=${NCCL_SLIM:-$ROOT/../shared/tools/nccl-slim.py}
read -r -a PIPCMD <<<"${PIP:-python3 -m pip}"
force=0 list=0
vers=()

usage() {
	awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0" >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case $1 in
	-d) [ $# -ge 2 ] || usage; DIR=$2; shift 2 ;;
	--slim) [ $# -ge 2 ] || usage; SLIM=$2; shift 2 ;;
	--force) force=1; shift ;;
	--list) list=1; shift ;;
	-h | --help) usage ;;
	-*) echo "nccl-versions.sh: unknown option $1" >&2; usage ;;
	*)
		[[ $1 =~ ^2\.[0-9]+\.[0-9]+(\.post[0-9]+)?$ ]] || { echo "nccl-versions.sh: $1 is not a version like 2.28.9" >&2; exit 2; }
		vers+=("$1")
		shift
		;;
	esac
done

# The versions PyPI holds for this package and this platform, newest first, one per line.
pypi_versions() {
	"${PIPCMD[@]}" index versions "$PKG" 2>/dev/null | sed -n 's/^Available versions: //p' | tr -d ' ' | tr ',' '\n'
}

# nearest VERSION AVAILABLE...: the highest available patch of VERSION's minor, else the
# available release whose minor is closest (the newer one on a tie).
nearest() {
	local want=$1
	shift
	printf '%s\n' "$@" | awk -F. -v w="$want" '
		BEGIN { split(w, q, "."); wm = q[2] + 0 }
		$0 ~ /post/ { next }
		{ d = $2 - wm; if (d < 0) d = -d
		  key = d * 100000 + ($2 < wm) * 10000 + (1000 - $3)
		  if (best == "" || key < bkey) { best = $0; bkey = key } }
		END { print best }'
}

if [ $list = 1 ]; then
	[ ${#vers[@]} -gt 0 ] || read -r -a vers <<<"$MATRIX"
	mapfile -t avail < <(pypi_versions)
	[ ${#avail[@]} -gt 0 ] || { echo "nccl-versions.sh: pip index versions $PKG gave nothing (no network?)" >&2; exit 1; }
	echo "PyPI $PKG: ${avail[*]}"
	miss=0
	for v in "${vers[@]}"; do
		if printf '%s\n' "${avail[@]}" | grep -qxF "$v"; then
			echo "$v available"
		else
			echo "$v MISSING; nearest available: $(nearest "$v" "${avail[@]}")"
			miss=1
		fi
	done
	exit $miss
fi

[ ${#vers[@]} -gt 0 ] || usage
[ -r "$SLIM" ] || { echo "nccl-versions.sh: slimming tool $SLIM not found (set NCCL_SLIM or --slim)" >&2; exit 2; }
for t in unzip xz sha256sum python3; do
	command -v $t >/dev/null || { echo "nccl-versions.sh: needs $t" >&2; exit 2; }
done
mkdir -p "$DIR" || exit 2
DIR=$(cd "$DIR" && pwd)
case $DIR/ in
"$ROOT"/*)
	git -C "$ROOT" check-ignore -q "$DIR/x.xz" ||
		{ echo "nccl-versions.sh: $DIR is inside the checkout but not ignored by git: use an ignored folder (.artifacts/)" >&2; exit 2; }
	;;
esac

# The code ncclGetVersion() gives for VERSION (2.18.3 -> 21803).
version_code() { awk -F. '{ printf "%d\n", $1 * 10000 + $2 * 100 + $3 }' <<<"${1%%.post*}"; }

# Loads LIB on the CPU and prints its ncclGetVersion() code.
loaded_version() {
	python3 - "$1" <<'PY'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
v = ctypes.c_int(0)
rc = lib.ncclGetVersion(ctypes.byref(v))
print(v.value if rc == 0 else -1)
PY
}

# One version; status 0 when its files are written and checked.
make_one() {
	local v=$1 out="$DIR/libnccl-$1-sm90.so.2.xz" tmp whl slimlog
	if [ -e "$out" ] && [ $force = 0 ]; then
		echo "$v: $out exists (--force remakes it)"
		return 0
	fi
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/nccl-$v.XXXXXX") || return 1
	# x86_64 wheels whatever this machine is: the GPU machine is x86_64; the platform tags
	# the wheels of 2.18-2.32 carry (manylinux2014 also matches manylinux2010 and 1)
	if ! "${PIPCMD[@]}" download -q --no-deps --only-binary=:all: --no-cache-dir \
		--platform manylinux_2_27_x86_64 --platform manylinux_2_18_x86_64 \
		--platform manylinux2014_x86_64 -d "$tmp" "$PKG==$v"; then
		echo "$v: pip download failed; --list says what PyPI holds"
		rm -rf "$tmp"
		return 1
	fi
	local whls=("$tmp"/*.whl)
	whl=${whls[0]}
	if [ ! -e "$whl" ] || ! unzip -q -o -j "$whl" nvidia/nccl/lib/libnccl.so.2 -d "$tmp/lib"; then
		echo "$v: no nvidia/nccl/lib/libnccl.so.2 in ${whl:-the download}"
		rm -rf "$tmp"
		return 1
	fi
	rm -rf "$DIR/include-$v"
	mkdir -p "$DIR/include-$v"
	unzip -q -o -j "$whl" 'nvidia/nccl/include/*.h' -d "$DIR/include-$v" || {
		echo "$v: no headers in $whl"
		rm -rf "$tmp"
		return 1
	}
	slimlog=$(python3 "$SLIM" "$tmp/lib/libnccl.so.2" "$tmp/slim.so.2") || {
		echo "$v: $SLIM failed"
		rm -rf "$tmp"
		return 1
	}
	echo "$v: $(tail -n1 <<<"$slimlog")"
	# -T1: the best ratio, and one core of a shared build machine
	if ! nice xz -9 -T1 -c "$tmp/slim.so.2" >"$out.part" || ! mv "$out.part" "$out"; then
		echo "$v: xz failed"
		rm -f "$out.part"
		rm -rf "$tmp"
		return 1
	fi
	# What the GPU machine will do: decompress, then load the library.
	local got want kept wsz lsz xsz sum
	if ! xz -dc "$out" >"$tmp/back.so.2" || ! cmp -s "$tmp/back.so.2" "$tmp/slim.so.2"; then
		echo "$v: $out does not decompress to the slimmed library"
		rm -rf "$tmp"
		return 1
	fi
	got=$(loaded_version "$tmp/back.so.2" 2>&1 | tail -n1)
	want=$(version_code "$v")
	kept=$(sed -nE 's/^kept ([0-9.]+) MiB for sm_90.*/\1/p' <<<"$slimlog")
	wsz=$(stat -c %s "$whl")
	lsz=$(stat -c %s "$tmp/lib/libnccl.so.2")
	xsz=$(stat -c %s "$out")
	sum=$(sha256sum "$out" | cut -d' ' -f1)
	rm -rf "$tmp"
	if [ "$got" != "$want" ]; then
		echo "$v: the library reports version '$got', expected $want"
		return 1
	fi
	if ! awk -v k="${kept:-0}" 'BEGIN { exit !(k > 0) }'; then
		echo "$v: no sm_90 code kept ($slimlog): it would not run on an H100/H200"
		return 1
	fi
	touch "$DIR/versions.txt"
	grep -v "^$v " "$DIR/versions.txt" >"$DIR/versions.txt.new"
	printf '%s wheel=%s lib=%s sm90_kept_MiB=%s xz=%s xz_MiB=%.1f sha256=%s\n' "$v" "$wsz" "$lsz" \
		"$kept" "$xsz" "$(awk -v s="$xsz" 'BEGIN { print s / 1048576 }')" "$sum" >>"$DIR/versions.txt.new"
	sort -V "$DIR/versions.txt.new" >"$DIR/versions.txt"
	rm -f "$DIR/versions.txt.new"
	echo "$v: $out $(awk -v s="$xsz" 'BEGIN { printf "%.1f MiB", s / 1048576 }'), ncclGetVersion $got, headers in $DIR/include-$v"
}

fail=0
for v in "${vers[@]}"; do
	make_one "$v" || fail=1
done
exit $fail
