#!/usr/bin/env bash
# make install (packaging/module.mk): copies what a user runs out of the build folder
# and the checkout into DESTDIR + PREFIX. Everything of R2CC's own goes in one private
# folder, PKGLIBDIR (PREFIX/lib/r2cc), laid out as a checkout's build folder and
# scripts are, so that every program and script finds its companions there as it does
# in a checkout (programs through /proc/self/exe, scripts with BUILD=.):
#   PKGLIBDIR/lib/libr2cc.so                  the library to LD_PRELOAD
#   PKGLIBDIR/bin/                            the programs (r2cc, r2cc-verbs-drill, ...)
#   PKGLIBDIR/softverbs/libibverbs.so.1       the software RDMA device, and under mlx5/
#                                             its libmlx5 stand-in: never on the default
#                                             library path, where they would replace
#                                             rdma-core's libraries
#   PKGLIBDIR/tests/ncclstub/libnccl.so.2     NCCL's test double (the drill's --nccl-stub)
#   PKGLIBDIR/scripts/                        demo.sh, drill, scenarios/, softfabric.sh
# BINDIR gets links to the programs users run and the wrappers r2cc-demo and
# r2cc-drill; MANDIR/man1 a page per command, made from its --help; DOCDIR the
# documents. Settings come from the environment (packaging/module.mk passes them):
# BUILD DESTDIR PREFIX PKGLIBDIR BINDIR MANDIR DOCDIR VERSION DATE, INSTALL_PERF=1
# (r2cc-perf too, where it was built), STRIP=1 (strip the ELF files, for packages).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
D=${DESTDIR:-}
PREFIX=${PREFIX:-/usr/local}
PKGLIBDIR=${PKGLIBDIR:-$PREFIX/lib/r2cc}
BINDIR=${BINDIR:-$PREFIX/bin}
MANDIR=${MANDIR:-$PREFIX/share/man}
DOCDIR=${DOCDIR:-$PREFIX/share/doc/r2cc}
VERSION=${VERSION:-0}
DATE=${DATE:-$(date -u +%Y-%m-%d)}
P=$D$PKGLIBDIR

# The programs users run, each with its one-line description (for its manual page).
progs=(
	"r2cc:R2CC's command: doctor (pre-flight check), top (live per-NIC view), run (a command under R2CC)"
	"r2cc-verbs-drill:NCCL-shaped RDMA traffic over the software RDMA device, with NIC faults and R2CC's repair"
	"softverbs-ctl:list the software RDMA fabric and inject NIC faults into it"
	"r2cc-plan:R2CC's cost model: predicted AllReduce time with failed NICs, per strategy"
	"r2cc-fit-cost:fit R2CC's cost model (R2CC_COST_MODEL) to measured AllReduce times"
)
scripts=(
	"r2cc-demo:what make demo shows: R2CC repairing a dead NIC on the software RDMA device"
	"r2cc-drill:a fault drill: a workload under R2CC, a plan of NIC faults, one report"
)
perf=()
if [ "${INSTALL_PERF:-0}" = 1 ] && [ -x "$B/bin/r2cc-perf" ]; then
	perf=(all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf
		alltoall_perf sendrecv_perf)
	progs+=("r2cc-perf:nccl-tests-compatible collective benchmark that verifies every result")
fi

for f in "$B/lib/libr2cc.so" "$B/softverbs/libibverbs.so.1" "$B/softverbs/mlx5/libmlx5.so.1" \
	"$B/tests/ncclstub/libnccl.so.2"; do
	[ -e "$f" ] || { echo "install: $f is missing: run make first" >&2; exit 1; }
done

inst() { # MODE SRC DEST (a file)
	install -D -m "$1" "$2" "$3"
	if [ "${STRIP:-0}" = 1 ] && head -c 4 "$3" | grep -q ELF; then
		strip --strip-unneeded --remove-section=.comment --remove-section=.note "$3"
	fi
}

inst 0644 "$B/lib/libr2cc.so" "$P/lib/libr2cc.so"
inst 0644 "$B/softverbs/libibverbs.so.1" "$P/softverbs/libibverbs.so.1"
ln -sfn libibverbs.so.1 "$P/softverbs/libibverbs.so"
inst 0644 "$B/softverbs/mlx5/libmlx5.so.1" "$P/softverbs/mlx5/libmlx5.so.1"
ln -sfn libmlx5.so.1 "$P/softverbs/mlx5/libmlx5.so"
inst 0644 "$B/tests/ncclstub/libnccl.so.2" "$P/tests/ncclstub/libnccl.so.2"
inst 0755 softverbs/topo.sh "$P/softverbs/topo.sh"

mkdir -p "$D$BINDIR"
# A link from BINDIR into the private tree: relative where both share BINDIR's parent;
# none where BINDIR is the private tree's bin/ (PKGLIBDIR=PREFIX).
link() { # NAME
	local rel=${PKGLIBDIR#"${BINDIR%/*}"/}
	[ "$PKGLIBDIR/bin" != "$BINDIR" ] || return 0
	if [ "$rel" != "$PKGLIBDIR" ]; then
		ln -sfn "../$rel/bin/$1" "$D$BINDIR/$1"
	else
		ln -sfn "$PKGLIBDIR/bin/$1" "$D$BINDIR/$1"
	fi
}
for p in "${progs[@]}"; do
	inst 0755 "$B/bin/${p%%:*}" "$P/bin/${p%%:*}"
	link "${p%%:*}"
done
for l in ${perf[@]+"${perf[@]}"}; do ln -sfn r2cc-perf "$P/bin/$l"; done
inst 0755 packaging/r2cc-script "$P/bin/r2cc-script"
for s in "${scripts[@]}"; do
	ln -sfn r2cc-script "$P/bin/${s%%:*}"
	link "${s%%:*}"
done

inst 0755 scripts/demo.sh "$P/scripts/demo.sh"
inst 0755 scripts/drill "$P/scripts/drill"
inst 0644 scripts/softfabric.sh "$P/scripts/softfabric.sh"
inst 0644 scripts/scenarios/common.sh "$P/scripts/scenarios/common.sh"
inst 0755 scripts/scenarios/results.py "$P/scripts/scenarios/results.py"
for s in scripts/scenarios/[0-9][0-9].*.sh; do inst 0755 "$s" "$P/$s"; done

# Manual pages, from each command's own --help (r2cc's: each subcommand's too).
man=$D$MANDIR/man1
mkdir -p "$man"
page() { # NAME DESC (the text on stdin)
	packaging/man.sh "$1" "$2" "$VERSION" "$DATE" "$DOCDIR" | gzip -9n >"$man/$1.1.gz"
	chmod 0644 "$man/$1.1.gz"
}
{
	"$B/bin/r2cc" --help
	for c in $("$B/bin/r2cc" --help | awk '/^commands:/ {on = 1; next} on && NF {print $1}'); do
		printf '\n'
		"$B/bin/r2cc" "$c" --help 2>&1 || true
	done
} | page r2cc "${progs[0]#*:}"
for p in "${progs[@]:1}"; do
	# A program that cannot start here (r2cc-perf without its NCCL) gets no page.
	help=$("$B/bin/${p%%:*}" --help 2>&1 | sed "s|$B/bin/||g") || true
	if grep -qi usage <<<"$help"; then
		page "${p%%:*}" "${p#*:}" <<<"$help"
	else
		echo "install: no manual page for ${p%%:*}: its --help printed no usage here" >&2
	fi
done
BUILD=. "$P/bin/r2cc-demo" --help | page r2cc-demo "${scripts[0]#*:}"
scripts/drill --help | sed 's|scripts/drill|r2cc-drill|g' | page r2cc-drill "${scripts[1]#*:}"

# The documents.
doc=$D$DOCDIR
install -D -m 0644 README.md "$doc/README.md"
for f in docs/*.md; do install -m 0644 "$f" "$doc/$(basename "$f")"; done
install -m 0644 tools/README.md "$doc/tools.md"
install -m 0644 tools/drill/README.md "$doc/drill.md"
install -m 0644 softverbs/README.md "$doc/softverbs.md"
install -m 0644 scripts/scenarios/README.md "$doc/scenarios.md"
echo "installed R2CC in $D$PREFIX: the library at $PKGLIBDIR/lib/libr2cc.so, the commands in $BINDIR"
