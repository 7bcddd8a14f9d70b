#!/usr/bin/env bash
# make deb (packaging/module.mk): the Debian package r2cc, with dpkg-deb and no
# debhelper. `make install` into a staging root (PREFIX=/usr, the library and the
# software RDMA device in /usr/lib/r2cc, the commands linked from /usr/bin, ELF files
# stripped), then what Debian's tools would add: the copyright file, a
# changelog.Debian.gz, DEBIAN/control with the shared-library dependencies
# dpkg-shlibdeps finds, DEBIAN/md5sums; files owned by root (--root-owner-group).
#   BUILD=build DEB_DIR=build/deb DEB_VERSION=0.1+git123.abcdef0-1 packaging/deb/build.sh
# Prints the path of the .deb last.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
B=${BUILD:-build}
OUT=$(mkdir -p "${DEB_DIR:-$B/deb}" && cd "${DEB_DIR:-$B/deb}" && pwd)
VERSION=${DEB_VERSION:?DEB_VERSION (e.g. 0.1+git123.abcdef0-1)}
ARCH=$(dpkg --print-architecture)
MAINTAINER=${DEB_MAINTAINER:-R2CC maintainers <maintainers@users.noreply.a-seed-6a85c3d0.example>}
COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# Dates from the commit, so that the same commit gives the same package.
EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH=$EPOCH
S=$OUT/root
rm -rf "$S" "$OUT/shlibs"
mkdir -p "$S/DEBIAN"

DESTDIR=$S PREFIX=/usr PKGLIBDIR=/usr/lib/r2cc BINDIR=/usr/bin MANDIR=/usr/share/man \
	DOCDIR=/usr/share/doc/r2cc INSTALL_PERF=0 STRIP=1 BUILD=$B VERSION=${VERSION%-*} \
	DATE=$(date -u -d "@$EPOCH" +%Y-%m-%d) packaging/install.sh >/dev/null

doc=$S/usr/share/doc/r2cc
install -m 0644 packaging/deb/copyright "$doc/copyright"
sed -e "s|@VERSION@|$VERSION|" -e "s|@COMMIT@|$COMMIT|" -e "s|@MAINTAINER@|$MAINTAINER|" \
	-e "s|@DATE@|$(LC_ALL=C date -u -R -d "@$EPOCH")|" packaging/deb/changelog.in |
	gzip -9n >"$doc/changelog.Debian.gz"
chmod 0644 "$doc/changelog.Debian.gz"
install -D -m 0644 packaging/deb/lintian-overrides "$S/usr/share/lintian/overrides/r2cc"

# The libraries' and programs' dependencies, as dpkg-shlibdeps sees them; the private
# folders are searched first, so that the software device's libibverbs.so.1 (which
# r2cc-verbs-drill does not link, but libmlx5's stand-in does) counts as the package's.
mkdir -p "$OUT/shlibs/debian"
printf 'Source: r2cc\n\nPackage: r2cc\nArchitecture: any\n' >"$OUT/shlibs/debian/control"
mapfile -t elves < <(find "$S/usr" -type f -exec sh -c 'head -c 4 "$1" | grep -q ELF' sh {} \; -print | sort)
depends=$(cd "$OUT/shlibs" && dpkg-shlibdeps -O -l"$S/usr/lib/r2cc/softverbs" \
	-l"$S/usr/lib/r2cc/softverbs/mlx5" -l"$S/usr/lib/r2cc/lib" "${elves[@]}" 2>"$OUT/shlibs/log" |
	sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { cat "$OUT/shlibs/log" >&2; echo "deb: dpkg-shlibdeps found nothing" >&2; exit 1; }
# The scripts: bash (essential) and python3 (scripts/scenarios/results.py, the drill's report).
depends="$depends, python3"

size=$(du -sk --exclude=DEBIAN "$S" | cut -f1)
sed -e "s|@VERSION@|$VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@MAINTAINER@|$MAINTAINER|" \
	-e "s|@SIZE@|$size|" -e "s|@DEPENDS@|$depends|" packaging/deb/control.in >"$S/DEBIAN/control"
(cd "$S" && find usr -type f -print0 | sort -z | xargs -0 md5sum >DEBIAN/md5sums)
chmod 0644 "$S/DEBIAN/control" "$S/DEBIAN/md5sums"
find "$S" -type d -exec chmod 0755 {} +
find "$S" -exec touch -h -d "@$EPOCH" {} +

deb=$OUT/r2cc_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$S" "$deb" >/dev/null
cd "$ROOT"
echo "$deb"
