#!/usr/bin/env bash
# Installs, when missing, what R2CC's build and CPU tests need on Debian/Ubuntu:
# rdma-core's verbs headers, Criterion, libunwind, OpenSSL's libcrypto, bc,
# g++ (the benchmark's host emulation test), perftest, ibverbs-utils, rdmacm-utils
# and pyverbs (run over the software RDMA device), clang and its libFuzzer (the fuzz
# targets). Also makes sure
# nccl.h is reachable (from CUDA_HOME, the system, or the nvidia-nccl-cu12 wheel
# unpacked under build/deps). Quiet when everything is already there.
#
#   scripts/deps.sh --check   installs nothing: checks what a plain `make` needs (the
#                             compiler, the verbs and OpenSSL headers, nccl.h) and, when
#                             something is missing, lists it with the command that
#                             installs it and exits 1. The top Makefile runs it first.
#                             CC: the compiler to probe (default cc); NCCL_INC: the
#                             folder with nccl.h that the Makefile found (empty: none).
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" = --check ]; then
	cc=${CC:-cc}
	# package:header pairs, probed through the compiler as the build will include them.
	hdrs=(libc6-dev:stdio.h linux-libc-dev:rdma/ib_user_verbs.h libibverbs-dev:infiniband/verbs.h
		libibverbs-dev:infiniband/mlx5dv.h libssl-dev:openssl/evp.h)
	probe() { printf '#include <%s>\n' "$@" | $cc -E -x c - >/dev/null 2>&1; }
	missing=() pkgs=()
	if ! command -v "${cc%% *}" >/dev/null; then
		missing+=("${cc%% *} (the C compiler)"); pkgs+=(gcc)
	elif ! probe "${hdrs[@]#*:}"; then
		for h in "${hdrs[@]}"; do
			probe "${h#*:}" && continue
			missing+=("${h#*:} (${h%%:*})")
			case " ${pkgs[*]} " in *" ${h%%:*} "*) ;; *) pkgs+=("${h%%:*}") ;; esac
		done
	fi
	nccl=0
	if [ -z "${NCCL_INC:-}" ]; then
		missing+=("nccl.h (NCCL's headers: none under NCCL_HOME, CUDA_HOME, /usr/include or build/deps)")
		nccl=1
	fi
	[ ${#missing[@]} -eq 0 ] && exit 0
	SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo "
	echo "R2CC cannot be built here yet; missing:"
	printf '  %s\n' "${missing[@]}"
	echo "Install them with:"
	[ ${#pkgs[@]} -eq 0 ] || echo "  ${SUDO}apt-get install ${pkgs[*]}"
	[ $nccl -eq 0 ] || echo "  scripts/deps.sh   (unpacks nccl.h from PyPI's nvidia-nccl-cu12 wheel; or set NCCL_HOME)"
	echo "or run 'make deps', which installs everything the build and the tests need."
	exit 1
fi
need=()
have_hdr() { [ -e "$1" ]; }
have_hdr /usr/include/infiniband/verbs.h || need+=(libibverbs-dev)
have_hdr /usr/include/criterion/criterion.h || need+=(libcriterion-dev)
have_hdr /usr/include/libunwind.h || have_hdr /usr/include/x86_64-linux-gnu/libunwind.h || need+=(libunwind-dev)
have_hdr /usr/include/openssl/hmac.h || need+=(libssl-dev)
command -v bc >/dev/null || need+=(bc)
command -v cc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
command -v g++ >/dev/null || need+=(g++)
command -v python3 >/dev/null || need+=(python3)
# rdma-core's own programs, run over the software RDMA device (softverbs/).
for p in perftest ibverbs-utils rdmacm-utils python3-pyverbs ibverbs-providers; do
	dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
dpkg -s python3-prometheus-client >/dev/null 2>&1 || need+=(python3-prometheus-client) # tests/exporter's parser
# clang with libFuzzer, for the fuzz targets only (tests/fuzz).
{ command -v clang >/dev/null && [ -e "$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]; } ||
	need+=(clang libclang-rt-dev)
command -v dpkg-shlibdeps >/dev/null || need+=(dpkg-dev) # make deb: the package's dependencies
command -v xz >/dev/null || need+=(xz-utils) # tests/compat packs its stand-in libraries as scripts/gpu/nccl-versions.sh does
# Debian's matplotlib, for scripts/plot.py (it falls back to /usr/bin/python3).
python3 -c 'import matplotlib' 2>/dev/null || /usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
	need+=(python3-matplotlib)
if [ ${#need[@]} -gt 0 ]; then
	echo "deps: installing ${need[*]}"
	SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
	export DEBIAN_FRONTEND=noninteractive
	$SUDO apt-get update -qq
	$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -e "${NCCL_HOME:-/nonexistent}/include/nccl.h" ] && [ ! -e "$CUDA_HOME/include/nccl.h" ] &&
	[ ! -e /usr/include/nccl.h ] && [ ! -e build/deps/nccl/include/nccl.h ]; then
	echo "deps: no nccl.h found; unpacking the nvidia-nccl-cu12 wheel into build/deps"
	mkdir -p build/deps/wheels
	python3 -m pip download -q --no-deps --only-binary=:all: -d build/deps/wheels nvidia-nccl-cu12==2.28.9
	python3 - <<'PY'
import glob, zipfile, os
w = glob.glob("build/deps/wheels/nvidia_nccl_cu12-*.whl")[0]
with zipfile.ZipFile(w) as z:
    for n in z.namelist():
        if n.startswith("nvidia/nccl/include/"):
            d = os.path.join("build/deps/nccl/include", os.path.basename(n))
            os.makedirs(os.path.dirname(d), exist_ok=True)
            open(d, "wb").write(z.read(n))
PY
fi
if [ ! -e "$CUDA_HOME/include/cuda_runtime_api.h" ] && [ ! -e build/deps/cuda/include/cuda_runtime_api.h ]; then
	echo "deps: no CUDA headers under $CUDA_HOME; unpacking the nvidia-cuda-runtime wheel into build/deps"
	mkdir -p build/deps/wheels
	python3 -m pip download -q --no-deps --only-binary=:all: -d build/deps/wheels "nvidia-cuda-runtime-cu12==12.8.*"
	python3 - <<'PY'
import glob, zipfile, os
w = glob.glob("build/deps/wheels/nvidia_cuda_runtime_cu12-*.whl")[0]
with zipfile.ZipFile(w) as z:
    for n in z.namelist():
        if "/include/" in n and not n.endswith("/"):
            d = os.path.join("build/deps/cuda/include", n.split("/include/", 1)[1])
            os.makedirs(os.path.dirname(d), exist_ok=True)
            open(d, "wb").write(z.read(n))
PY
fi
