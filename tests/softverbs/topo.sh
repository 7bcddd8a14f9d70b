#!/usr/bin/env bash
# Writes an NCCL_TOPO_FILE for the software RDMA device's NICs, to stdout.
#
#   tests/softverbs/topo.sh [NIC[:GBPS]...]      (default: the NICs of SOFTVERBS_NICS,
#                                                 else mlx5_0:100 mlx5_1:100 mlx5_2:100)
#
# Soft NICs have no PCI path, so NCCL cannot place them from sysfs ("Could not find any
# local path from gpu 0 to net"). This file declares them in a <nic> block directly under
# a CPU node of NUMA id -1. NCCL loads the file, then adds the GPUs it detects from sysfs
# under their own CPU nodes (ncclTopoFillGpu), finds each <net> by name when the IB
# transport registers the device of that name (so the names must be the ibv device
# names), keeps the nodes it found and connects the CPU nodes with SYS links; the GPUs
# then reach the NICs through the CPUs. List the NICs in the order SOFTVERBS_NICS gives
# them (that is the order of ibv_get_device_list, hence NCCL's dev index). Use with
# NCCL_NET_MERGE_LEVEL=LOC so that NICs without PCI paths are not fused into one.
set -eu
if [ $# -eq 0 ]; then
	IFS=',' read -r -a specs <<<"${SOFTVERBS_NICS:-mlx5_0:100,mlx5_1:100,mlx5_2:100}"
else
	specs=("$@")
fi
arch=$(uname -m)
case "$arch" in
aarch64) arch=arm64 ;;
ppc64le) arch=ppc64 ;;
esac
field() { awk -F': *' -v k="$1" '$1 ~ "^"k"[ \t]*$" {print $2; exit}' /proc/cpuinfo; }
cpu="numaid=\"-1\" arch=\"$arch\""
if [ "$arch" = x86_64 ]; then
	cpu="$cpu vendor=\"$(field vendor_id)\" familyid=\"$(field 'cpu family')\" modelid=\"$(field model)\""
fi
echo '<system version="1">'
echo "  <cpu $cpu>"
echo '    <nic>'
dev=0
for spec in "${specs[@]}"; do
	name=${spec%%:*}
	gbps=100
	[ "$spec" != "$name" ] && gbps=${spec#*:}
	case "$gbps" in '' | *[!0-9]*) echo "topo.sh: bad NIC spec '$spec' (want NAME[:GBPS])" >&2; exit 2 ;; esac
	printf '      <net name="%s" dev="%d" speed="%d" port="1" latency="0.000000" guid="0x%x" maxconn="4096" gdr="0"/>\n' \
		"$name" "$dev" $((gbps * 1000)) $((0x1000 + dev))
	dev=$((dev + 1))
done
echo '    </nic>'
echo '  </cpu>'
echo '</system>'
