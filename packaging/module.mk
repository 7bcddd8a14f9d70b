# packaging: `make install` and `make deb` (packaging/install.sh, packaging/deb/build.sh),
# and the tests of them and of the top Makefile's build-dependency check.
#
#   make install [PREFIX=/usr/local] [DESTDIR=...] [PKGLIBDIR=$(PREFIX)/lib/r2cc]
#       the library, the software RDMA device and the programs in the private folder
#       PKGLIBDIR (the library at PKGLIBDIR/lib/libr2cc.so; PKGLIBDIR=$(PREFIX) gives
#       PREFIX/lib/libr2cc.so), links to the commands in BINDIR, manual pages, documents
#   make deb [DEB_VERSION=...]
#       build/deb/r2cc_VERSION_ARCH.deb: PREFIX=/usr, library in /usr/lib/r2cc
#
# The programs find the library and the device relative to themselves
# (/proc/self/exe), so an installed tree needs no checkout and may be moved whole.

PREFIX     ?= /usr/local
DESTDIR    ?=
PKGLIBDIR  ?= $(PREFIX)/lib/r2cc
BINDIR     ?= $(PREFIX)/bin
MANDIR     ?= $(PREFIX)/share/man
DOCDIR     ?= $(PREFIX)/share/doc/r2cc
# r2cc-perf (a GPU program, linked against the cluster's NCCL) where it was built; never
# in the package, whose dependencies are Debian's.
INSTALL_PERF ?= 1
DEB_DIR    ?= $(BUILD)/deb
DEB_COMMITS  = $(shell git rev-list --count HEAD 2>/dev/null || echo 0)
DEB_HASH     = $(shell git rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
DEB_VERSION ?= 0.1+git$(DEB_COMMITS).$(DEB_HASH)-1

INSTALL_ENV = BUILD=$(BUILD) PREFIX=$(PREFIX) PKGLIBDIR=$(PKGLIBDIR) BINDIR=$(BINDIR) \
	MANDIR=$(MANDIR) DOCDIR=$(DOCDIR) INSTALL_PERF=$(INSTALL_PERF) \
	VERSION=0.1-$(DEB_HASH)

.PHONY: install deb
install: all
	@DESTDIR=$(DESTDIR) $(INSTALL_ENV) packaging/install.sh

deb: all
	@BUILD=$(BUILD) DEB_DIR=$(DEB_DIR) DEB_VERSION=$(DEB_VERSION) packaging/deb/build.sh

# make test: a missing build dependency stops `make` at once with what to install (the
# top Makefile's check, scripts/deps.sh --check).
CPU_TESTS += 30@tests/ops/deps-check.sh
# make test: the package builds, installs into a scratch root (dpkg-deb -x) and its
# r2cc doctor, r2cc top, r2cc run and drill run from there, with no checkout in reach.
CPU_TESTS += 120@tests/ops/install.sh:$(BUILD)
# make test-ops (tests/ops/module.mk): lintian on the package; dpkg -i, an upgrade to
# a second version, dpkg -r and dpkg -P on this machine (root).
OPS_TESTS += 300@tests/ops/deb.sh:$(BUILD)
# make test-ops: r2cc run under the real mpirun (Open MPI), tests/run/run.sh's checks.
# (Here rather than in tools/module.mk, which is read before tests/ops sets OPS_TESTS.)
OPS_TESTS += 120@tests/ops/mpirun.sh:$(BUILD)
