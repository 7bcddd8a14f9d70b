#!/usr/bin/env bash
# Writes an NCCL_TOPO_FILE for the software RDMA device's NICs, to stdout.
#
#   softverbs/topo.sh [--fused] [NIC[:GBPS]...]   (default: the NICs of SOFTVERBS_NICS,
#                                                        else mlx5_0:100 mlx5_1:100 mlx5_2:100)
#
# Soft NICs have no PCI path, so NCCL cannot place them from sysfs ("Could not find any
# local path from gpu 0 to net"). NCCL loads this file, then adds the GPUs it detects
# from sysfs under their own CPU nodes (ncclTopoFillGpu), finds each <net> by name when
# the IB transport registers the device of that name (so the names must be the ibv
# device names), keeps the nodes it found and connects the CPU nodes with SYS links; the
# GPUs then reach the NICs through the CPUs. List the NICs in the order SOFTVERBS_NICS
# gives them (that is the order of ibv_get_device_list, hence NCCL's dev index).
#
# Default: the NICs in a <nic> block directly under a CPU node of NUMA id -1. Use it with
# NCCL_NET_MERGE_LEVEL=LOC: NCCL's default merge level (PORT) fuses NICs whose common
# ancestor is a <nic>, and places the fused NIC under the first PCI ancestor of that
# common node or, with none, under the node itself, i.e. in a <nic> inside the <nic>,
# which the topology never reads: no GPU then reaches any network.
#
# SOFTVERBS_TOPO_NIC_BUSID=BUSID gives that <nic> a busid attribute. NCCL 2.19 needs one:
# it keeps a CPU node's children ordered by bus id when it adds the GPU it found in sysfs
# under the same CPU node, and fails ("Attribute busid of node nic not found") on a child
# without one (2.20 skips such a child). Use a bus id above the GPU's, e.g. ffff:ff:1f.7.
#
# --fused: the NICs are the ports of one PCI device (class network, a bus id in PCI
# domain 0x5efe, which no real device uses), as NCCL lays out a multi-port NIC it reads
# from sysfs. At the default merge level NCCL fuses them into one virtual NIC
# ("mlx5_0+mlx5_1+..."), placed in that device's <nic>, which the GPUs reach. This is
# what NCCL >= 2.29's own port failover (NCCL_IB_RESILIENCY_PORT_FAILOVER=1) needs. With
# NCCL_NET_MERGE_LEVEL=LOC the same file gives unfused NICs.
set -eu
fused=0
if [ "${1:-}" = --fused ]; then
	fused=1
	shift
fi
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
# An RoCE port is an Ethernet controller, an IB one an InfiniBand controller.
class=0x020700
[ "${SOFTVERBS_LINK:-ib}" = roce ] && class=0x020000
ind='    '
echo '<system version="1">'
echo "  <cpu $cpu>"
if [ $fused -eq 1 ]; then
	echo "    <pci busid=\"5efe:00:00.0\" class=\"$class\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">"
	ind='      '
fi
nicattr=
if [ -n "${SOFTVERBS_TOPO_NIC_BUSID:-}" ]; then
	case "$SOFTVERBS_TOPO_NIC_BUSID" in
	*[!0-9a-fA-F:.]*) echo "topo.sh: bad SOFTVERBS_TOPO_NIC_BUSID '$SOFTVERBS_TOPO_NIC_BUSID' (want a PCI bus id)" >&2; exit 2 ;;
	esac
	nicattr=" busid=\"$SOFTVERBS_TOPO_NIC_BUSID\""
fi
echo "$ind<nic$nicattr>"
dev=0
for spec in "${specs[@]}"; do
	name=${spec%%:*}
	gbps=100
	[ "$spec" != "$name" ] && gbps=${spec#*:}
	case "$gbps" in '' | *[!0-9]*) echo "topo.sh: bad NIC spec '$spec' (want NAME[:GBPS])" >&2; exit 2 ;; esac
	printf '%s  <net name="%s" dev="%d" speed="%d" port="1" latency="0.000000" guid="0x%x" maxconn="4096" gdr="0"/>\n' \
		"$ind" "$name" "$dev" $((gbps * 1000)) $((0x1000 + dev))
	dev=$((dev + 1))
done
echo "$ind</nic>"
[ $fused -eq 1 ] && echo '    </pci>'
echo '  </cpu>'
echo '</system>'
