# Sourced by the GPU scripts: the environment that runs NCCL's own IB transport
# over the software RDMA device (softverbs/), as docs/softfabric.md describes.
#   softfabric_env NICSPEC [NAME]   e.g. softfabric_env mlx5_0:25,mlx5_2:25,mlx5_3:25
# Sets LD_LIBRARY_PATH (device first), SOFTVERBS_*, NCCL_* and writes the
# topology file; NCCL_HOSTID/SOFTVERBS_NODE are set per rank by the launcher.
# SOFTFABRIC_FUSED=1: the NICs as ports of one device (topo.sh --fused) and NCCL's
# default merge level, so that NCCL fuses them into one virtual NIC.
# SOFTFABRIC_PLUGIN_DIR=DIR: a net plugin's libnccl-net.so there (HPC-X's IBext, built
# against the device), found by NCCL as it finds HPC-X's: on the library path, NCCL_NET
# unset; the device's libmlx5 stand-in (build/softverbs/mlx5) goes on the path with it.
# SOFTFABRIC_MLX5DV=1: the soft NICs pass for mlx5 devices (SOFTVERBS_MLX5DV=1, the
# stand-in on the path), for NCCL 2.30's NCCL_IB_OOO_RQ=1.
softfabric_env() {
	local spec=$1 name=${2:-r2cc-$$}
	local root=${R2CC_ROOT:-$PWD}
	local b=${BUILD:-build}
	export LD_LIBRARY_PATH=$root/$b/softverbs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	export SOFTVERBS_FABRIC=$name SOFTVERBS_NICS=$spec
	local topo=${TMPDIR:-/tmp}/$name.topo.xml
	local nics
	IFS=',' read -r -a nics <<<"$spec"
	local fused=()
	[ "${SOFTFABRIC_FUSED:-0}" = 1 ] && fused=(--fused)
	"$root"/softverbs/topo.sh ${fused[@]+"${fused[@]}"} "${nics[@]}" >"$topo"
	local hca= nic
	for nic in "${nics[@]}"; do hca=${hca:+$hca,}${nic%%:*}; done
	# A leading '=' asks NCCL for exact names, so mlx5_2 never matches mlx5_20.
	hca="=$hca"
	export NCCL_NET=IB NCCL_IB_HCA=$hca NCCL_SOCKET_IFNAME=lo NCCL_NET_GDR_LEVEL=LOC \
		NCCL_DMABUF_ENABLE=0 NCCL_NET_MERGE_LEVEL=LOC NCCL_GIN_TYPE=2 NCCL_TOPO_FILE=$topo
	export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
	[ ${#fused[@]} -eq 0 ] || unset NCCL_NET_MERGE_LEVEL
	if [ "${SOFTFABRIC_MLX5DV:-0}" = 1 ]; then
		export SOFTVERBS_MLX5DV=1 LD_LIBRARY_PATH=$root/$b/softverbs/mlx5:$LD_LIBRARY_PATH
	fi
	if [ -n "${SOFTFABRIC_PLUGIN_DIR:-}" ]; then
		unset NCCL_NET
		export LD_LIBRARY_PATH=$SOFTFABRIC_PLUGIN_DIR:$root/$b/softverbs/mlx5:$LD_LIBRARY_PATH
	fi
}

# The mpirun command that starts NP ranks over the soft fabric, one emulated node each
# (NCCL_HOSTID=nodeR), into the array SOFTFABRIC_MPIRUN: the given VAR=VALUE, every
# NCCL_* and SOFTVERBS_* variable of the caller (NCCL_TESTS_DIR aside), R2CC_STDBUF when
# it is set (a prefix of the program, e.g. "stdbuf -oL"), PATH and LD_LIBRARY_PATH.
# MPIRUN names another mpirun (the CPU tests' double).
#   softfabric_mpirun NP [VAR=VALUE...]; "${SOFTFABRIC_MPIRUN[@]}" PROGRAM ARGS...
softfabric_mpirun() {
	local np=$1 e
	shift
	SOFTFABRIC_MPIRUN=("${MPIRUN:-mpirun}" --allow-run-as-root -np "$np" --oversubscribe --bind-to none)
	for e in "$@"; do SOFTFABRIC_MPIRUN+=(-x "$e"); done
	for e in $(compgen -e | grep -E '^(NCCL_|SOFTVERBS_)' | grep -v '^NCCL_TESTS_DIR$'); do
		SOFTFABRIC_MPIRUN+=(-x "$e")
	done
	[ -n "${R2CC_STDBUF:-}" ] && SOFTFABRIC_MPIRUN+=(-x R2CC_STDBUF)
	# shellcheck disable=SC2016 # expanded by the rank's shell
	SOFTFABRIC_MPIRUN+=(-x PATH -x LD_LIBRARY_PATH bash -c
		'export NCCL_HOSTID=node$OMPI_COMM_WORLD_RANK; exec $R2CC_STDBUF "$0" "$@"')
}

softfabric_reset() {
	"${R2CC_ROOT:-$PWD}/${BUILD:-build}"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" reset >/dev/null 2>&1 || true
}
