#!/usr/bin/env bash
# Tests of `r2cc doctor` over the software RDMA device: runs the doctor with
# --json in set-ups that should pass, warn or fail, and asserts on the parsed
# JSON and the exit status. A stand-in libnccl.so.2 (tests/doctor/nccl_stub.c)
# makes the result independent of the NCCL a machine has.
#
#   tests/doctor/run.sh BUILD [CASE...]     (cases: see the end of the file)
set -u
B=${1:-build}
shift || true
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
B=$(cd "$B" && pwd)
DOC=$B/bin/r2cc
CTL=$B/bin/softverbs-ctl
HOLD=$B/tests/doctor/hold
TMP=$(mktemp -d /tmp/r2cc-doctor-test.XXXXXX)
FABRICS=()
cleanup() {
	for f in "${FABRICS[@]+"${FABRICS[@]}"}"; do "$CTL" --fabric "$f" reset >/dev/null 2>&1; done
	[ -n "${DOCTOR_KEEP:-}" ] && echo "doctor: kept $TMP" || rm -rf "$TMP"
}
trap cleanup EXIT

# A clean, known environment: nothing from the caller's NCCL_/R2CC_/SOFTVERBS_ settings.
for v in $(compgen -e | grep -E '^(NCCL_|R2CC_|SOFTVERBS_)'); do unset "$v"; done
export LD_LIBRARY_PATH=$B/softverbs
export R2CC_DOCTOR_NCCL=$B/tests/doctor/nccl/libnccl.so.2
export NCCL_HOSTID=node0 SOFTVERBS_NICS=mlx5_0:25,mlx5_2:100,mlx5_3:100
export NCCL_NET_MERGE_LEVEL=LOC NCCL_GIN_TYPE=2 NCCL_NET_GDR_LEVEL=LOC NCCL_SOCKET_IFNAME=lo
softverbs/topo.sh mlx5_0:25 mlx5_2:100 mlx5_3:100 >"$TMP/topo3.xml"
softverbs/topo.sh mlx5_0:100 >"$TMP/topo1.xml"
export NCCL_TOPO_FILE=$TMP/topo3.xml

fabric() {
	export SOFTVERBS_FABRIC=r2cc-doctor-$$-$1
	FABRICS+=("$SOFTVERBS_FABRIC")
}

# doctor NAME [ARGS...]: run it with --json into $TMP/NAME.json, exit status in $TMP/NAME.rc.
doctor() {
	local name=$1
	shift
	"$DOC" doctor --json "$@" >"$TMP/$name.json" 2>"$TMP/$name.err"
	echo $? >"$TMP/$name.rc"
}

# check NAME: python assertions (stdin) on j (the JSON), rc, fails(), check(sec, item);
# a failed assertion fails the case even where the case goes on.
check() {
	python3 - "$TMP/$1.json" "$(cat "$TMP/$1.rc")" 3<&0 <<'PY'
import json, sys
rc = int(sys.argv[2])
assert rc < 128, f"doctor crashed (rc={rc})"
j = json.load(open(sys.argv[1]))
assert j["exit"] == rc, (j["exit"], rc)
def check(sec, item):
    m = [c for c in j["checks"] if c["section"] == sec and c["item"] == item]
    assert m, f"no check {sec}/{item}"
    return m[0]
def fails():
    return sorted((c["section"], c["item"]) for c in j["checks"] if c["level"] == "FAIL")
def nic(name):
    return [n for n in j["nics"] if n["name"] == name][0]
exec(open("/dev/fd/3").read())
PY
	local r=$?
	[ $r -eq 0 ] || CHECK_FAILED=1
	return $r
}

case_three() {
	fabric three
	doctor three
	check three <<'PY'
assert rc == 0 and j["status"] == "OK", (rc, j["status"], fails())
assert [n["name"] for n in j["nics"]] == ["mlx5_0", "mlx5_2", "mlx5_3"], j["nics"]
assert [n["gbps"] for n in j["nics"]] == [25, 100, 100]
assert all(n["state"] == "ACTIVE" and n["active"] and n["soft"] for n in j["nics"])
assert all(n["link_layer"] == "InfiniBand" and n["mtu"] == 4096 for n in j["nics"])
assert j["nccl"]["version"] == "2.28.9"
assert check("repair", "verdict")["level"] == "OK"
w = {x["nic"]: x for x in j["if_failed"]}
assert sorted(w) == ["mlx5_0", "mlx5_2", "mlx5_3"]
assert w["mlx5_0"]["shares"] == {"mlx5_2": 0.5, "mlx5_3": 0.5}, w["mlx5_0"]
assert w["mlx5_2"]["balance"] == 1.5 and w["mlx5_2"]["backup"] == 2 and w["mlx5_2"]["ar2"] == 1.5
PY
	# The human report and --nodes 3 (R2CC-AllReduce beats Balance from n = 3).
	"$DOC" doctor --nodes 3 >"$TMP/three.txt" || return 1
	grep -q 'result: OK' "$TMP/three.txt" || return 1
	grep -q 'R2CC-AllReduce at 3 nodes x1.38' "$TMP/three.txt" || return 1
	# --quiet: nothing but the result when all is well.
	"$DOC" doctor --quiet >"$TMP/quiet.txt" || return 1
	! grep -q '^  OK ' "$TMP/quiet.txt" && grep -q 'result: OK' "$TMP/quiet.txt" || return 1
	# A typo and an unwritable report directory are warnings.
	R2CC_MODEE=2 R2CC_REPORT=$TMP/none/report doctor typo
	check typo <<'PY'
assert rc == 1 and check("r2cc", "R2CC_MODEE")["level"] == "WARN", (rc, j["checks"])
assert any(c["item"] == "R2CC_REPORT" and c["level"] == "WARN" for c in j["checks"])
PY
}

case_down() {
	fabric down
	mkfifo "$TMP/fifo"
	"$HOLD" 30 <"$TMP/fifo" >"$TMP/hold.out" &
	local hp=$!
	exec 9>"$TMP/fifo"
	for _ in $(seq 200); do grep -q ready "$TMP/hold.out" && break; sleep 0.05; done
	local ok=0
	{ "$CTL" --fabric "$SOFTVERBS_FABRIC" fault node0 mlx5_2 down >/dev/null &&
		doctor down &&
		"$CTL" --fabric "$SOFTVERBS_FABRIC" fault node0 mlx5_2 up >/dev/null &&
		doctor up; } || ok=1
	exec 9>&-
	kill $hp 2>/dev/null
	wait $hp 2>/dev/null
	[ $ok -eq 0 ] || return 1
	check down <<'PY'
assert nic("mlx5_2")["state"] == "DOWN" and not nic("mlx5_2")["active"], nic("mlx5_2")
assert nic("mlx5_0")["state"] == "ACTIVE" and nic("mlx5_3")["state"] == "ACTIVE"
assert rc == 1 and j["status"] == "WARN", (rc, fails())
assert check("nic", "mlx5_2")["level"] == "WARN"
assert check("repair", "verdict")["level"] == "OK"
w = {x["nic"]: x for x in j["if_failed"]}
assert sorted(w) == ["mlx5_0", "mlx5_3"], w
assert w["mlx5_0"]["balance"] == 3 and w["mlx5_0"]["shares"] == {"mlx5_3": 1}
PY
	check up <<'PY'
assert rc == 0 and nic("mlx5_2")["state"] == "ACTIVE", (rc, nic("mlx5_2"))
PY
}

case_one() {
	fabric one
	SOFTVERBS_NICS=mlx5_0:100 NCCL_TOPO_FILE=$TMP/topo1.xml doctor one
	check one <<'PY'
assert [n["name"] for n in j["nics"]] == ["mlx5_0"]
assert rc == 2 and fails() == [("repair", "verdict")], (rc, fails())
assert j["if_failed"] == []
PY
}

case_badmode() {
	fabric badmode
	R2CC_MODE=7 doctor badmode
	# What the library itself prints for it, without the host:pid:tid prefix.
	R2CC_MODE=7 LD_PRELOAD=${R2CC_TEST_PRELOAD:+$R2CC_TEST_PRELOAD:}$B/lib/libr2cc.so /bin/true 2>"$TMP/lib.err"
	sed -n 's/^[^ ]* R2CC WARN //p' "$TMP/lib.err" >"$TMP/lib.line"
	[ -s "$TMP/lib.line" ] || { echo "libr2cc.so printed no error line"; return 1; }
	LIB_LINE=$(cat "$TMP/lib.line") check badmode <<'PY'
import os
c = check("r2cc", "R2CC_MODE")
assert c["level"] == "FAIL", c
ours = c["message"].split(" R2CC WARN ", 1)[1]
assert ours == os.environ["LIB_LINE"], (ours, os.environ["LIB_LINE"])
assert "R2CC_MODE='7' is not valid: it accepts 0, 1, 2, 3 or auto" in ours
assert rc == 2 and check("repair", "verdict")["level"] == "FAIL"
assert j["r2cc"]["mode"] == -1
PY
	# A bad declared failure goes through the library's failspec parser.
	R2CC_FAILED_HCA=mlx5_2 doctor badspec
	check badspec <<'PY'
c = check("r2cc", "R2CC_FAILED_*")
assert c["level"] == "FAIL" and "R2CC_FAILED" in c["message"], c
PY
}

case_hca() {
	fabric hca
	NCCL_IB_HCA=mlx5_2 doctor hca
	NCCL_IB_HCA=mlx5_2,mlx5_3 doctor hca2
	check hca <<'PY'
c = check("nccl", "NCCL_IB_HCA")
assert c["level"] == "WARN" and "restricts NCCL to one NIC" in c["message"], c
assert "mlx5_0,mlx5_2,mlx5_3" in c["fix"], c
assert [n["name"] for n in j["nics"] if n["nccl_uses"]] == ["mlx5_2"]
assert rc == 1, (rc, fails())
assert check("repair", "verdict")["level"] == "WARN"
PY
	check hca2 <<'PY'
assert rc == 0 and check("nccl", "NCCL_IB_HCA")["level"] == "OK", (rc, fails())
assert [x["nic"] for x in j["if_failed"]] == ["mlx5_2", "mlx5_3"]
PY
}

case_noverbs() {
	# No library at all: an explicit path that does not exist.
	R2CC_DOCTOR_IBVERBS=$TMP/none/libibverbs.so.1 doctor nolib
	check nolib <<'PY'
assert rc == 2 and j["nics"] == [] and j["devices"] == -1, (rc, j["devices"])
c = check("nic", "libibverbs")
assert c["level"] == "FAIL" and "cannot load libibverbs" in c["message"] and c["fix"], c
PY
	# The loader's own search without the software device: rdma-core without
	# devices (lists none), no rdma-core (cannot load), or real NICs.
	mkdir -p "$TMP/empty"
	LD_LIBRARY_PATH=$TMP/empty doctor system
	check system <<'PY'
if j["devices"] <= 0:
    assert rc == 2 and j["nics"] == []
    assert any(c["section"] == "nic" and c["level"] == "FAIL" for c in j["checks"]), j["checks"]
    print("system libibverbs:", j["ibverbs"] or "none", "devices:", j["devices"])
else:
    assert all(not n["soft"] for n in j["nics"]), "software device found without it on the path"
PY
}

case_nccl() {
	fabric nccl
	DOCTOR_STUB_NCCL_VERSION=21703 doctor old
	check old <<'PY'
assert rc == 2 and fails() == [("nccl", "libnccl")], (rc, fails())
PY
	NCCL_IB_RESILIENCY_PORT_FAILOVER=1 doctor res28
	DOCTOR_STUB_NCCL_VERSION=22907 NCCL_IB_RESILIENCY_PORT_FAILOVER=1 doctor res29
	check res28 <<'PY'
assert rc == 0, (rc, fails())
PY
	check res29 <<'PY'
assert rc == 2 and ("nccl", "NCCL_IB_RESILIENCY_PORT_FAILOVER") in fails(), (rc, fails())
PY
	# settings under which the library turns hot repair off
	NCCL_IB_USE_INLINE=1 doctor inline
	NCCL_IB_QPS_PER_CONNECTION=2 NCCL_IB_SPLIT_DATA_ON_QPS=1 doctor split
	NCCL_IB_QPS_PER_CONNECTION=2 doctor nosplit
	check inline <<'PY'
assert rc == 2 and fails() == [("nccl", "NCCL_IB_USE_INLINE")], (rc, fails())
PY
	check split <<'PY'
assert rc == 2 and fails() == [("nccl", "NCCL_IB_QPS_PER_CONNECTION")], (rc, fails())
PY
	check nosplit <<'PY'
assert rc == 0, (rc, fails())
PY
	# NIC fusion of 3 soft NICs: NCCL before 2.29 cannot be repaired there (repair/model/cts.h)
	env -u NCCL_NET_MERGE_LEVEL "$DOC" doctor --json >"$TMP/fuse28.json"
	echo $? >"$TMP/fuse28.rc"
	env -u NCCL_NET_MERGE_LEVEL DOCTOR_STUB_NCCL_VERSION=22907 "$DOC" doctor --json \
		>"$TMP/fuse29.json"
	echo $? >"$TMP/fuse29.rc"
	check fuse28 <<'PY'
c = check("nccl", "NIC fusion")
assert c["level"] == "WARN" and "2.28" in c["message"] and "3 soft NICs" in c["message"], c
assert check("nccl", "NCCL_NET_MERGE_LEVEL")["level"] == "WARN"
PY
	check fuse29 <<'PY'
assert not [c for c in j["checks"] if c["item"] == "NIC fusion"], j["checks"]
PY
	env -u NCCL_GIN_TYPE -u NCCL_TOPO_FILE "$DOC" doctor --json >"$TMP/gin.json"
	echo $? >"$TMP/gin.rc"
	check gin <<'PY'
assert ("nccl", "NCCL_GIN_TYPE") in fails() and ("nccl", "NCCL_TOPO_FILE") in fails(), fails()
PY
}

# A fake sysfs (R2CC_DOCTOR_SYSROOT) turns the soft NICs into "real" ones with PCI
# paths, next to two GPUs: PCI address, NUMA node, driver, sysfs rate, nearest GPU,
# GPUDirect; then only one of them with a PCI path: soft and real NICs mixed.
mkdev() { # DIR NUMA [VENDOR CLASS]
	mkdir -p "$1"
	echo "$2" >"$1/numa_node"
	echo "${3:-0x15b3}" >"$1/vendor"
	echo "${4:-0x020700}" >"$1/class"
}
case_sysfs() {
	local r=$TMP/root d=$TMP/root/sys/devices
	mkdev "$d/pci0000:00/0000:00:01.0/0000:01:00.0" 0
	mkdev "$d/pci0000:00/0000:00:01.0/0000:02:00.0" 0 0x10de 0x030200
	mkdev "$d/pci0000:80/0000:80:01.0/0000:81:00.0" 1
	mkdev "$d/pci0000:80/0000:80:02.0/0000:82:00.0" 1 0x10de 0x030200
	mkdev "$d/pci0000:c0/0000:c0:01.0/0000:c1:00.0" 1
	mkdir -p "$r/sys/bus/pci/devices" "$r/sys/module/nvidia_peermem" \
		"$r/proc/driver/nvidia/gpus/0000:02:00.0"
	printf 'Model: \t NVIDIA H200\nIRQ: 1\n' >"$r/proc/driver/nvidia/gpus/0000:02:00.0/information"
	local nic bdf path
	for x in mlx5_0=pci0000:00/0000:00:01.0/0000:01:00.0 \
		mlx5_2=pci0000:80/0000:80:01.0/0000:81:00.0 \
		mlx5_3=pci0000:c0/0000:c0:01.0/0000:c1:00.0 \
		gpu=pci0000:00/0000:00:01.0/0000:02:00.0 gpu=pci0000:80/0000:80:02.0/0000:82:00.0; do
		nic=${x%%=*} path=${x#*=} bdf=${x##*/}
		ln -s "../../../devices/$path" "$r/sys/bus/pci/devices/$bdf"
		[ "$nic" = gpu ] && continue
		mkdir -p "$r/sys/class/infiniband/$nic/ports/1"
		ln -s "../../../devices/$path" "$r/sys/class/infiniband/$nic/device"
		ln -s "../../../../bus/pci/drivers/mlx5_core" "$d/$path/driver"
	done
	echo "400 Gb/sec (4X NDR)" >"$r/sys/class/infiniband/mlx5_0/ports/1/rate"
	fabric sysfs
	R2CC_DOCTOR_SYSROOT=$r env -u NCCL_TOPO_FILE -u NCCL_GIN_TYPE "$DOC" doctor --json \
		>"$TMP/sysfs.json" 2>"$TMP/sysfs.err"
	echo $? >"$TMP/sysfs.rc"
	check sysfs <<'PY'
assert rc == 0 and fails() == [], (rc, fails())
assert j["gpus"] == 2 and j["gpudirect"] is True
n0, n2, n3 = nic("mlx5_0"), nic("mlx5_2"), nic("mlx5_3")
assert not (n0["soft"] or n2["soft"] or n3["soft"])
assert (n0["pci"], n0["numa"], n0["driver"]) == ("0000:01:00.0", 0, "mlx5_core"), n0
assert n0["gbps"] == 400 and n0["speed"] == "4X NDR", n0
assert n0["nearest_gpu"] == "0000:02:00.0" and "PCIe switch" in n0["gpu_relation"], n0
assert n2["nearest_gpu"] == "0000:82:00.0" and "PHB" in n2["gpu_relation"], n2
assert n3["nearest_gpu"] == "0000:82:00.0" and "NUMA" in n3["gpu_relation"], n3
PY
	rm "$r/sys/class/infiniband/mlx5_2/device" "$r/sys/class/infiniband/mlx5_3/device"
	R2CC_DOCTOR_SYSROOT=$r doctor mixed
	check mixed <<'PY'
assert rc == 2 and ("nccl", "soft+real") in fails(), (rc, fails())
PY
}

# The net plugin NCCL would load (tools/doctor_env.c, net_plugin): the project's test
# plugin (tools/ncclstub/testnet.c) on the library path, as libnccl-net.so (the default
# name) and by NCCL_NET_PLUGIN; passing for HPC-X's before its init ("NCCL RDMA Plugin",
# net API v8: a release whose layout R2CC does not know), over UCX, disabled.
case_plugin() {
	fabric plugin
	mkdir -p "$TMP/plug"
	cp "$B/tests/ncclstub/libnccl-net-testnet.so" "$TMP/plug/libnccl-net.so"
	doctor noplugin
	LD_LIBRARY_PATH=$TMP/plug:$LD_LIBRARY_PATH doctor default
	LD_LIBRARY_PATH=$B/tests/ncclstub:$LD_LIBRARY_PATH NCCL_NET_PLUGIN=testnet doctor named
	LD_LIBRARY_PATH=$TMP/plug:$LD_LIBRARY_PATH NCCL_NET_PLUGIN=none doctor none
	LD_LIBRARY_PATH=$TMP/plug:$LD_LIBRARY_PATH NCCL_NET=IB doctor netib
	export TESTNET_PREINIT_NAME="NCCL RDMA Plugin v8"
	LD_LIBRARY_PATH=$TMP/plug:$LD_LIBRARY_PATH doctor ibext8
	LD_LIBRARY_PATH=$TMP/plug:$LD_LIBRARY_PATH NCCL_PLUGIN_P2P=ucx doctor ucx
	LD_LIBRARY_PATH=$TMP/plug:$LD_LIBRARY_PATH NCCL_IBEXT_DISABLE=1 doctor ibextoff
	unset TESTNET_PREINIT_NAME
	check noplugin <<'PY'
c = check("nccl", "net plugin")
assert rc == 0 and c["level"] == "OK" and "none found" in c["message"], (rc, c)
PY
	check default <<'PY'
c = check("nccl", "net plugin")
assert rc == 2 and c["level"] == "FAIL" and "libnccl-net.so" in c["message"], (rc, c)
assert "TestNet" in c["message"] and "NCCL_NET_PLUGIN=none" in c["fix"], c
PY
	check named <<'PY'
c = check("nccl", "net plugin")
assert c["level"] == "FAIL" and "libnccl-net-testnet.so" in c["message"], c
PY
	check none <<'PY'
assert rc == 0 and check("nccl", "net plugin")["level"] == "OK", (rc, fails())
PY
	check netib <<'PY'
c = check("nccl", "net plugin")
assert rc == 0 and c["level"] == "OK" and "NCCL_NET=IB" in c["message"], (rc, c)
PY
	check ibext8 <<'PY'
c = check("nccl", "net plugin")
assert c["level"] == "FAIL" and "HPC-X" in c["message"] and "v8" in c["message"], c
PY
	check ucx <<'PY'
c = check("nccl", "net plugin")
assert c["level"] == "FAIL" and "ucx" in c["message"], c
PY
	check ibextoff <<'PY'
assert rc == 0 and check("nccl", "net plugin")["level"] == "OK", (rc, fails())
PY
}

cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(three down one badmode hca noverbs nccl sysfs plugin)
pass=0
failed=()
for c in "${cases[@]}"; do
	CHECK_FAILED=0
	if "case_$c" && [ $CHECK_FAILED -eq 0 ]; then
		pass=$((pass + 1))
		echo "doctor: ok   $c"
	else
		failed+=("$c")
		echo "doctor: FAIL $c"
		for f in "$TMP"/*.err; do [ -s "$f" ] && sed "s|^|  $(basename "$f"): |" "$f"; done
	fi
done
echo "doctor: ${pass} passed, ${#failed[@]} failed${failed[*]:+ (${failed[*]})}"
[ ${#failed[@]} -eq 0 ]
