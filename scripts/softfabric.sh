# Sourced by the GPU scripts: the environment that runs NCCL's own IB transport
# over the software RDMA device (tests/softverbs), as DESIGN.md §7 describes.
#   softfabric_env NICSPEC [NAME]   e.g. softfabric_env mlx5_0:25,mlx5_2:25,mlx5_3:25
# Sets LD_LIBRARY_PATH (device first), SOFTVERBS_*, NCCL_* and writes the
# topology file; NCCL_HOSTID/SOFTVERBS_NODE are set per rank by the launcher.
# SOFTFABRIC_FUSED=1: the NICs as ports of one device (topo.sh --fused) and NCCL's
# default merge level, so that NCCL fuses them into one virtual NIC.
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
	"$root"/tests/softverbs/topo.sh ${fused[@]+"${fused[@]}"} "${nics[@]}" >"$topo"
	local hca= nic
	for nic in "${nics[@]}"; do hca=${hca:+$hca,}${nic%%:*}; done
	# A leading '=' asks NCCL for exact names, so mlx5_2 never matches mlx5_20.
	hca="=$hca"
	export NCCL_NET=IB NCCL_IB_HCA=$hca NCCL_SOCKET_IFNAME=lo NCCL_NET_GDR_LEVEL=LOC \
		NCCL_DMABUF_ENABLE=0 NCCL_NET_MERGE_LEVEL=LOC NCCL_GIN_TYPE=2 NCCL_TOPO_FILE=$topo
	export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
	[ ${#fused[@]} -eq 0 ] || unset NCCL_NET_MERGE_LEVEL
}

softfabric_reset() {
	"${R2CC_ROOT:-$PWD}/${BUILD:-build}"/bin/softverbs-ctl --fabric "$SOFTVERBS_FABRIC" reset >/dev/null 2>&1 || true
}
