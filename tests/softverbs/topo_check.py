#!/usr/bin/env python3
"""Checks the NCCL topology files of softverbs/topo.sh (CPU test, `make test`).

Both layouts must be well-formed XML with what NCCL reads from a topology file: a <cpu>
with numaid, arch (and vendor, familyid, modelid on x86_64), one <net> per NIC with its
name, dev index in order, speed, port, guid, maxconn and gdr, and for --fused a <pci>
with busid, a network class, link_speed and link_width.

Then it follows what NCCL 2.28-2.30 do with the file at the default merge level
(NCCL_NET_MERGE_LEVEL=PORT), as read from NCCL's src/graph/topo.cc and xml.cc:
ncclTopoGetPath gives the nets' common ancestor (a <nic> or <net> is PATH_PORT, as
are sibling <pci> functions of one device, so they are fused into one virtual NIC); ncclFindFirstPciParent walks up from it to the
first <pci>, or keeps it when there is none; ncclTopoGetVNicParent moves a fused NIC
whose parent is a <cpu> or a PCI bridge under a new <pci>; ncclTopoFillNet then adds
the fused <net> to the parent's <nic> child (making one when it has none). The system
graph (ncclTopoAddCpu, ncclTopoAddPci, ncclTopoAddNic) only reads a <nic> that is a
child of a <cpu> or of a <pci>, and <net>s that are children of such a <nic>.
The check: with --fused the fused NIC lands where the graph reads it; with the default
layout it lands in a <nic> inside the <nic>, where no GPU reaches it, which is why that
layout needs NCCL_NET_MERGE_LEVEL=LOC (and the test fails if that ever changes).

usage: topo_check.py [TOPO_SH]
"""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

PATH_PORT = "PORT"
PCI_BRIDGE = "0x060400"
NCCL_PCI_GENS = {"2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe",
                 "32.0 GT/s PCIe", "64.0 GT/s PCIe"}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def topo(script, *args, env=None):
    e = dict(os.environ)
    e.pop("SOFTVERBS_NICS", None)
    e.update(env or {})
    out = subprocess.run([script, *args], check=True, capture_output=True, text=True, env=e)
    return ET.fromstring(out.stdout)


def parents(root):
    return {c: p for p in root.iter() for c in p}


def common_path(nets, up):
    """ncclTopoGetPath: the deepest common ancestor of the nets and the path type."""
    chains = []
    for n in nets:
        chain = [n]
        while chain[-1] in up:
            chain.append(up[chain[-1]])
        chains.append(list(reversed(chain)))
    common = None
    for level in zip(*chains):
        if all(x is level[0] for x in level):
            common = level[0]
            continue
        # Functions of one PCI device (bus ids equal but for the last digit): ports.
        ids = [x.get("busid") for x in level]
        if all(ids) and len({(len(b), b[:-1]) for b in ids}) == 1:
            return common, PATH_PORT
        break
    kind = {"system": "SYS", "cpu": "PHB", "nic": PATH_PORT, "net": PATH_PORT}
    return common, kind.get(common.tag, "PXB/PIX")


def first_pci(node, up):
    """ncclFindFirstPciParent: the first <pci> from node upwards, else node itself."""
    n = node
    while n.tag != "pci":
        n = up.get(n)
        if n is None or n.tag == "system":
            return node
    return n


def readable_nets(root):
    """The <net>s NCCL's system graph adds: in a <nic> that is a child of <cpu> or <pci>."""
    found = set()

    def walk(node):
        for c in node:
            if c.tag == "nic" and node.tag in ("cpu", "pci"):
                found.update(n.get("name") for n in c if n.tag == "net")
            if c.tag in ("cpu", "pci"):
                walk(c)

    walk(root)
    return found


def fuse(root):
    """Places the fused NIC as NCCL does; returns its name and whether it merged."""
    up = parents(root)
    nets = list(root.iter("net"))
    common, path = common_path(nets, up)
    if path != PATH_PORT:
        return None, False
    parent = first_pci(common, up)
    if parent.tag == "cpu" or (parent.tag == "pci" and parent.get("class") == PCI_BRIDGE):
        new = ET.SubElement(parent, "pci", {"busid": "made-up", "class": "0x020700"})
        parent = new
    nic = parent.find("nic")
    if nic is None:
        nic = ET.SubElement(parent, "nic")
    name = "+".join(n.get("name") for n in nets)
    ET.SubElement(nic, "net", {"name": name})
    return name, True


def check_common(root, what, names, speeds):
    check(root.tag == "system" and root.get("version") == "1", f"{what}: <system version=1>")
    cpus = root.findall("cpu")
    if not check(len(cpus) == 1, f"{what}: one <cpu>"):
        return
    cpu = cpus[0]
    check(cpu.get("numaid") == "-1" and cpu.get("arch"), f"{what}: cpu numaid/arch")
    if cpu.get("arch") == "x86_64":
        check(all(cpu.get(k) for k in ("vendor", "familyid", "modelid")),
              f"{what}: x86_64 cpu vendor/familyid/modelid")
    nets = list(root.iter("net"))
    if not check([n.get("name") for n in nets] == names, f"{what}: nets in order {names}"):
        return
    for i, n in enumerate(nets):
        check(n.get("dev") == str(i), f"{what}: {n.get('name')} dev {i}")
        check(n.get("speed") == str(speeds[i] * 1000), f"{what}: {n.get('name')} speed")
        check(n.get("gdr") == "0" and n.get("port") == "1" and n.get("maxconn"),
              f"{what}: {n.get('name')} gdr/port/maxconn")
        check(n.get("guid", "").startswith("0x"), f"{what}: {n.get('name')} guid")
    check(len({n.get("guid") for n in nets}) == len(nets), f"{what}: unique guids")
    check(readable_nets(root) == set(names), f"{what}: every NIC readable by NCCL")


def gpu_fits_under_cpu_219(root):
    """NCCL 2.19's ncclTopoGetPciNode path (xml.cc): the GPU found in sysfs is added
    under the <cpu> of its NUMA node (numaid -1 here, the same node as the file's), and
    the CPU's children are kept sorted by bus id, read with xmlGetAttrStr, which fails
    on a child without one. 2.20 reads it with xmlGetAttr and skips such a child."""
    return all(c.get("busid") is not None for c in root.find("cpu"))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    script = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "softverbs", "topo.sh")
    names, speeds = ["mlx5_0", "mlx5_2", "mlx5_3"], [100, 25, 200]
    specs = [f"{n}:{s}" for n, s in zip(names, speeds)]

    plain = topo(script, *specs)
    check_common(plain, "default", names, speeds)
    check(plain.find("cpu/nic") is not None, "default: <nic> directly under <cpu>")
    name, merged = fuse(plain)
    check(merged and name not in readable_nets(plain),
          "default: NCCL fuses the NICs and cannot reach the fused one (needs MERGE_LEVEL=LOC)")

    for env, cls in (({}, "0x020700"), ({"SOFTVERBS_LINK": "roce"}, "0x020000")):
        what = "fused" + (" roce" if env else "")
        fused = topo(script, "--fused", *specs, env=env)
        check_common(fused, what, names, speeds)
        pci = fused.findall("cpu/pci")
        if check(len(pci) == 1 and pci[0].find("nic") is not None, f"{what}: cpu/pci/nic"):
            p = pci[0]
            check(p.get("class") == cls, f"{what}: pci class {cls}")
            check(p.get("busid") == "5efe:00:00.0", f"{what}: pci busid in domain 5efe")
            check(p.get("link_speed") in NCCL_PCI_GENS and p.get("link_width") == "16",
                  f"{what}: pci link_speed/link_width NCCL knows")
        name, merged = fuse(fused)
        check(merged and name == "mlx5_0+mlx5_2+mlx5_3", f"{what}: NCCL fuses all NICs")
        check(name in readable_nets(fused), f"{what}: the fused NIC is reachable")

    # NCCL 2.19 stops at init on a child of the GPU's CPU node without a bus id; the
    # matrix gives the <nic> one for 2.19 (scripts/gpu/gpu-compat.sh).
    check(not gpu_fits_under_cpu_219(plain), "default: 2.19 would find a <nic> without busid")
    nb = topo(script, *specs, env={"SOFTVERBS_TOPO_NIC_BUSID": "ffff:ff:1f.7"})
    check_common(nb, "nic busid", names, speeds)
    check(nb.find("cpu/nic").get("busid") == "ffff:ff:1f.7", "nic busid: written")
    check(gpu_fits_under_cpu_219(nb), "nic busid: 2.19 can add the GPU under the CPU")
    bad = subprocess.run([script, *specs], capture_output=True, text=True,
                         env={**os.environ, "SOFTVERBS_TOPO_NIC_BUSID": "x y"})
    check(bad.returncode == 2 and "SOFTVERBS_TOPO_NIC_BUSID" in bad.stderr,
          "bad nic busid: exit 2 naming the variable")

    # SOFTVERBS_NICS is the default list.
    env_nics = topo(script, "--fused", env={"SOFTVERBS_NICS": "a:10,b:20"})
    check([n.get("name") for n in env_nics.iter("net")] == ["a", "b"], "SOFTVERBS_NICS default")
    bad = subprocess.run([script, "--fused", "x:fast"], capture_output=True, text=True)
    check(bad.returncode == 2 and "bad NIC spec" in bad.stderr, "bad spec: exit 2")

    for f in failures:
        print("FAIL topo:", f)
    print("ok topo" if not failures else f"{len(failures)} topology checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
