#!/usr/bin/env bash
# The Debian package builds (packaging/deb/build.sh, what make deb runs once all is
# built), its contents are where they belong (the
# software RDMA device's libibverbs.so.1 and libmlx5.so.1 only in the private
# folder, the commands on /usr/bin), and, unpacked into a scratch root with
# dpkg-deb -x, its programs run from there with no checkout in reach: r2cc doctor
# (over the installed software device and NCCL stand-in: exit 0, the installed
# libr2cc.so found), r2cc top, r2cc run as the program of the test double of mpirun
# (preloading the installed library), the drill through a NIC fault, the manual pages.
# As root, the checkout is hidden under an empty tmpfs in a mount namespace of the
# test's own (unshare -m); otherwise the programs run from another folder.
#   tests/ops/install.sh BUILD
set -u
B=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

if [ -n "${R2CC_TEST_PRELOAD:-}" ]; then
	echo "skipped under a sanitizer build: the package is made from the plain build"
	exit 0
fi
# What `make deb` runs once `all` is built (make test built it).
deb=$(cd "$ROOT" && BUILD=$B DEB_DIR=$T/deb DEB_VERSION=0.1+test-1 packaging/deb/build.sh 2>"$T/make.err" | tail -1)
[ -f "$deb" ] || { cat "$T/make.err"; fail "make deb made no package"; }
echo "built $(basename "$deb"), $(stat -c %s "$deb") bytes"
dpkg-deb -c "$deb" | awk '{s = $1 " " $6; if ($7) s = s " " $7 " " $8; print s}' >"$T/list"
dpkg-deb -f "$deb" Package Version Architecture Depends
grep -qE '^-rw-r--r-- \./usr/lib/r2cc/lib/libr2cc.so$' "$T/list" || fail "libr2cc.so not in /usr/lib/r2cc/lib"
grep -E 'lib(ibverbs|mlx5)\.so' "$T/list" | grep -v ' \./usr/lib/r2cc/softverbs/' &&
	fail "the software device outside /usr/lib/r2cc/softverbs"
for c in r2cc r2cc-verbs-drill softverbs-ctl r2cc-plan r2cc-fit-cost r2cc-demo r2cc-drill; do
	grep -qE "^lrwxrwxrwx \./usr/bin/$c -> \.\./lib/r2cc/bin/$c$" "$T/list" || fail "/usr/bin/$c missing"
	grep -q " \./usr/share/man/man1/$c.1.gz$" "$T/list" || fail "no manual page for $c"
done
grep -q ' \./usr/share/doc/r2cc/copyright$' "$T/list" || fail "no copyright file"
grep -vE ' \./usr/(bin|lib/r2cc|share/(doc|man|lintian/overrides))(/|$)' "$T/list" |
	grep -vE ' \./(usr/((lib|share|share/lintian)/)?)?$' &&
	fail "files outside /usr/bin, /usr/lib/r2cc, /usr/share/{doc,man,lintian}"
echo "contents: $(grep -c '^-' "$T/list") files, $(grep -c '^l' "$T/list") links, all in place"

R=$T/root
dpkg-deb -x "$deb" "$R" || fail "dpkg-deb -x"
# Nothing installed may point back into the checkout.
grep -rlF "$ROOT" "$R" && fail "installed files name the checkout $ROOT"

# The checks, run from the scratch root in a folder of their own.
cat >"$T/check.sh" <<'EOF'
set -u
R=$1 MPIRUN=$2
P=$R/usr/lib/r2cc
cd "$(dirname "$R")"
unset LD_PRELOAD LD_LIBRARY_PATH
for v in $(env | sed -n 's/^\(R2CC_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
export SOFTVERBS_FABRIC=r2cc-install-$$ SOFTVERBS_NICS=mlx5_0:100,mlx5_1:100 NCCL_HOSTID=node0
trap '"$R"/usr/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" reset >/dev/null 2>&1' EXIT
"$P"/softverbs/topo.sh mlx5_0:100 mlx5_1:100 >topo.xml || { echo "FAIL: topo.sh"; exit 1; }
LD_LIBRARY_PATH=$P/softverbs NCCL_TOPO_FILE=$PWD/topo.xml NCCL_GIN_TYPE=2 NCCL_NET_MERGE_LEVEL=LOC \
	"$R"/usr/bin/r2cc doctor --json --nccl "$P"/tests/ncclstub/libnccl.so.2 >doctor.json
rc=$?
python3 - "$P" doctor.json $rc <<'PY' || exit 1
import json, sys
p, d, rc = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
lib = [c for c in d["checks"] if c["item"] == "libr2cc.so"]
bad = [(c["level"], c["item"], c["message"]) for c in d["checks"] if c["level"] in ("WARN", "FAIL")]
ok = rc == 0 and d["status"] == "OK" and len(d["nics"]) == 2 and lib and lib[0]["level"] == "OK" \
    and lib[0]["message"].startswith(p + "/lib/libr2cc.so;")
print("r2cc doctor: exit %d, %s, %d NICs, %s" % (rc, d["status"], len(d["nics"]), lib and lib[0]["message"]))
if not ok:
    print("FAIL: r2cc doctor from the scratch root", bad)
    sys.exit(1)
PY
"$R"/usr/bin/r2cc top --once --interval 0.1 >top.txt || { echo "FAIL: r2cc top"; exit 1; }
echo "r2cc top: $(head -1 top.txt | cut -c1-60)"
out=$("$MPIRUN" -np 2 "$R"/usr/bin/r2cc run --mode 2 -- sh -c 'grep -o "/[^ ]*libr2cc.so" /proc/self/maps | sort -u')
[ "$(echo "$out" | sort -u)" = "$P/lib/libr2cc.so" ] || { echo "FAIL: r2cc run preloaded: $out"; exit 1; }
echo "mpirun -np 2 r2cc run: both ranks preload $P/lib/libr2cc.so"
"$R"/usr/bin/r2cc-verbs-drill --fault down --seeds 1 --nccl-stub >drill.txt 2>&1 ||
	{ echo "FAIL: the installed drill"; cat drill.txt; exit 1; }
echo "r2cc-verbs-drill: $(tail -1 drill.txt)"
if command -v man >/dev/null; then
	man -l "$R"/usr/share/man/man1/r2cc.1.gz 2>&1 | grep -q "usage: r2cc run" ||
		{ echo "FAIL: man r2cc has no r2cc run"; exit 1; }
	echo "man r2cc: renders, with each subcommand's --help"
else
	zcat "$R"/usr/share/man/man1/r2cc.1.gz | grep -q "usage: r2cc run" ||
		{ echo "FAIL: the r2cc page has no r2cc run"; exit 1; }
	echo "the r2cc page has each subcommand's --help (no man here to render it)"
fi
EOF
cp "$ROOT/tests/compat/fake/mpirun" "$T/mpirun" # the test double of Open MPI's mpirun
where="another folder"
mkdir "$T/probe"
if [ "$(id -u)" = 0 ] && unshare --mount --propagation private mount -t tmpfs none "$T/probe" 2>/dev/null; then
	where="a mount namespace with the checkout ($ROOT) hidden under an empty tmpfs"
	unshare --mount --propagation private bash -c \
		'mount -t tmpfs none "$1" && shift && exec bash "$@"' sh "$ROOT" \
		"$T/check.sh" "$R" "$T/mpirun"
	rc=$?
else
	bash "$T/check.sh" "$R" "$T/mpirun"
	rc=$?
fi
[ $rc = 0 ] || fail "the installed programs (run in $where)"
echo "PASS: the package builds, and its programs run from a scratch root, in $where"
