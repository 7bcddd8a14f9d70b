#!/usr/bin/python3
"""
A transcript of verbs calls made through pyverbs (rdma-core's Python bindings) on one
device of one process: queries, a loopback RC pair (two QPs connected to each other)
moving data with RDMA WRITE, READ, SEND and the ibv_wr_* API, and many calls that must
fail. One line per step: its name, then "ok <values>" or "errno <n>" (PyverbsRDMAError),
or the class and message of another exception. tests/preload/rdma-core.sh runs it
without and with LD_PRELOAD=libr2cc.so: the transcripts must be identical, and contain
at least --min-failures failing steps.

The values printed are the ones a run decides, never addresses, keys or QP numbers,
which are the device's to choose (R2CC may make objects of its own on the device); a
QP's peer is printed as whether it is the other QP of the pair.

Every failing step fails as it does on a mlx5 NIC unless its comment says otherwise
(checked against rdma-core's code and tests, not on a NIC: this machine has none).
Two steps go through ctypes, because pyverbs closes an object's children before
the object itself and so never lets ibv_dealloc_pd or ibv_destroy_cq see one in use;
they look the names up in the global scope, as a program linked against libibverbs
binds them (the preload first).

    pyverbs_errno.py [--dev NAME] [--min-failures N]
"""
import argparse
import ctypes
import sys
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from pyverbs.wr import SGE, RecvWR, SendWR

failures = 0


def step(name, fn):
    """Runs fn() and prints its line; returns what fn returned, or None on failure."""
    global failures
    try:
        got = fn()
    except PyverbsRDMAError as err:
        failures += 1
        print(f"{name:<34} errno {err.error_code}")
        return None
    except PyverbsError as err:
        failures += 1
        print(f"{name:<34} {type(err).__name__} {err}")
        return None
    values = got if isinstance(got, str) else ""
    print(f"{name:<34} ok{' ' + values if values else ''}")
    return got if got is not None else True


def wait_wc(cq, n=1, timeout=5.0):
    """The next n completions of cq, as 'opcode/status/byte_len' strings."""
    out = []
    end = time.monotonic() + timeout
    while len(out) < n:
        got, wcs = cq.poll(n - len(out))
        # byte_len is undefined in a completion with an error
        out += [f"op{wc.opcode}/st{wc.status}" + (f"/len{wc.byte_len}" if not wc.status else "")
                for wc in wcs[:got]]
        if time.monotonic() > end:
            raise PyverbsError(f"timeout after {len(out)} of {n} completions")
    return " ".join(out)


class Verbs:
    """The real verbs names in the global scope, as a linked program binds them."""

    def __init__(self):
        ctypes.CDLL("libibverbs.so.1", mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(None, use_errno=True)
        vp, ci = ctypes.c_void_p, ctypes.c_int
        self.fn = {}
        for name, res, args in [
            ("ibv_get_device_list", vp, [ctypes.POINTER(ci)]),
            ("ibv_free_device_list", None, [vp]),
            ("ibv_get_device_name", ctypes.c_char_p, [vp]),
            ("ibv_open_device", vp, [vp]),
            ("ibv_close_device", ci, [vp]),
            ("ibv_alloc_pd", vp, [vp]),
            ("ibv_dealloc_pd", ci, [vp]),
            ("ibv_reg_mr", vp, [vp, vp, ctypes.c_size_t, ci]),
            ("ibv_dereg_mr", ci, [vp]),
            ("ibv_create_cq", vp, [vp, ci, vp, vp, ci]),
            ("ibv_destroy_cq", ci, [vp]),
            ("ibv_create_qp", vp, [vp, vp]),
            ("ibv_destroy_qp", ci, [vp]),
        ]:
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
            self.fn[name] = f

    def __getattr__(self, name):
        return self.fn["ibv_" + name]

    def open(self, dev):
        n = ctypes.c_int()
        lst = ctypes.cast(self.get_device_list(ctypes.byref(n)), ctypes.POINTER(ctypes.c_void_p))
        ctx = None
        for i in range(n.value):
            if self.get_device_name(lst[i]).decode() == dev:
                ctx = self.open_device(lst[i])
        self.free_device_list(lst)
        return ctx


class QPInitAttrC(ctypes.Structure):
    """struct ibv_qp_init_attr"""
    _fields_ = [("qp_context", ctypes.c_void_p), ("send_cq", ctypes.c_void_p),
                ("recv_cq", ctypes.c_void_p), ("srq", ctypes.c_void_p),
                ("max_send_wr", ctypes.c_uint32), ("max_recv_wr", ctypes.c_uint32),
                ("max_send_sge", ctypes.c_uint32), ("max_recv_sge", ctypes.c_uint32),
                ("max_inline_data", ctypes.c_uint32), ("qp_type", ctypes.c_int),
                ("sq_sig_all", ctypes.c_int)]


def rc_or_errno(rc):
    if rc:
        raise PyverbsRDMAError("call failed", rc)
    return ""


def in_use_steps(dev):
    """ibv_dealloc_pd of a PD with an MR, ibv_destroy_cq of a CQ a QP uses: EBUSY."""
    v = Verbs()
    ctx = v.open(dev)
    pd = v.alloc_pd(ctx)
    buf = ctypes.create_string_buffer(4096)
    mr = v.reg_mr(pd, buf, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    step("dealloc_pd with an MR", lambda: rc_or_errno(v.dealloc_pd(pd)))
    cq = v.create_cq(ctx, 16, None, None, 0)
    init = QPInitAttrC(send_cq=cq, recv_cq=cq, max_send_wr=4, max_recv_wr=4,
                       max_send_sge=1, max_recv_sge=1, qp_type=e.IBV_QPT_RC)
    qp = v.create_qp(pd, ctypes.byref(init))
    step("destroy_cq a QP uses", lambda: rc_or_errno(v.destroy_cq(cq)))
    step("ctypes teardown", lambda: rc_or_errno(
        v.destroy_qp(qp) or v.destroy_cq(cq) or v.dereg_mr(mr) or v.dealloc_pd(pd)
        or v.close_device(ctx)))


def connect(qp, peer_qpn, lid, port):
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.pkey_index, attr.port_num = 0, port
    attr.qp_access_flags = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                            | e.IBV_ACCESS_REMOTE_READ)
    qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
              | e.IBV_QP_ACCESS_FLAGS)
    attr = QPAttr(qp_state=e.IBV_QPS_RTR)
    attr.path_mtu, attr.dest_qp_num, attr.rq_psn = e.IBV_MTU_1024, peer_qpn, 0
    attr.max_dest_rd_atomic, attr.min_rnr_timer = 1, 12
    attr.ah_attr = AHAttr(dlid=lid, port_num=port)
    qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
              | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn, attr.max_rd_atomic = \
        14, 7, 7, 0, 1
    qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT
              | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
    return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dev", default="mlx5_0")
    ap.add_argument("--min-failures", type=int, default=0)
    args = ap.parse_args()
    port = 1
    rw = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ

    ctx = step("open_device", lambda: Context(name=args.dev))
    if not ctx:
        return 1
    dattr = ctx.query_device()
    step("query_device", lambda: f"max_qp_wr={dattr.max_qp_wr} max_sge={dattr.max_sge} "
         f"max_cqe={dattr.max_cqe} phys_port_cnt={dattr.phys_port_cnt}")
    pattr = ctx.query_port(port)
    step("query_port 1", lambda: f"state={pattr.state} lid={pattr.lid} "
         f"active_mtu={pattr.active_mtu} link_layer={pattr.link_layer}")
    step("query_port 0", lambda: ctx.query_port(0) and "")
    step("query_port 2 (one port)", lambda: ctx.query_port(2) and "")
    step("query_port 255", lambda: ctx.query_port(255) and "")
    step("query_gid 1/0", lambda: str(ctx.query_gid(port, 0)))
    # ibv_query_gid answers -1, not an errno value (libibverbs' verbs.c), on any device.
    step("query_gid 1/4096 (no such index)", lambda: str(ctx.query_gid(port, 4096)))
    step("query_gid 2/0 (no such port)", lambda: str(ctx.query_gid(2, 0)))
    step("query_pkey 1/0", lambda: str(ctx.query_pkey(port, 0)))

    pd = step("alloc_pd", lambda: PD(ctx))
    step("reg_mr REMOTE_WRITE w/o LOCAL_WRITE",
         lambda: MR(pd, 4096, e.IBV_ACCESS_REMOTE_WRITE) and "")
    step("reg_mr REMOTE_ATOMIC w/o LOCAL_WRITE",
         lambda: MR(pd, 4096, e.IBV_ACCESS_REMOTE_ATOMIC) and "")
    step("reg_mr REMOTE_READ", lambda: MR(pd, 4096, e.IBV_ACCESS_REMOTE_READ) and "")
    mr1 = step("reg_mr 1 (rw)", lambda: MR(pd, 4096, rw))
    mr2 = step("reg_mr 2 (rw)", lambda: MR(pd, 4096, rw))

    step("create_cq cqe=max_cqe+1", lambda: CQ(ctx, dattr.max_cqe + 1) and "")
    step("create_cq cqe=0", lambda: CQ(ctx, 0) and "")
    step("create_cq comp_vector=num_comp_vectors",
         lambda: CQ(ctx, 16, None, None, ctx.num_comp_vectors) and "")
    cq = step("create_cq 64", lambda: CQ(ctx, 64))
    step("resize_cq max_cqe+1", lambda: cq.resize(dattr.max_cqe + 1))

    def rc_qp(**cap):
        c = dict(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
        c.update(cap)
        return QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(**c)))

    # max_qp_wr and max_sge are the device's receive queue limits; its send queues take
    # more (32768 WRs, 30 SGEs), so these two succeed where a mlx5 NIC answers EINVAL.
    step("create_qp max_send_wr>max_qp_wr", lambda: rc_qp(max_send_wr=dattr.max_qp_wr + 1) and "")
    step("create_qp max_send_sge>max_sge", lambda: rc_qp(max_send_sge=dattr.max_sge + 1) and "")
    step("create_qp max_send_wr=1M", lambda: rc_qp(max_send_wr=1 << 20) and "")
    step("create_qp max_send_sge=64", lambda: rc_qp(max_send_sge=64) and "")
    step("create_qp max_recv_wr>max_qp_wr", lambda: rc_qp(max_recv_wr=dattr.max_qp_wr + 1) and "")
    step("create_qp max_recv_sge>max_sge", lambda: rc_qp(max_recv_sge=dattr.max_sge + 1) and "")
    step("create_qp max_inline_data=1MiB", lambda: rc_qp(max_inline_data=1 << 20) and "")
    # The device is RC only: UC and UD QPs fail with EOPNOTSUPP (a mlx5 NIC makes them).
    step("create_qp UD", lambda: QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq,
                                                  cap=QPCap())) and "")
    qp1 = step("create_qp 1", lambda: rc_qp())
    qp2 = step("create_qp 2", lambda: rc_qp())

    def q(qp):
        a, i = qp.query(e.IBV_QP_STATE | e.IBV_QP_CAP | e.IBV_QP_DEST_QPN | e.IBV_QP_PATH_MTU)
        peer = "qp2" if qp is qp1 else "qp1"
        other = qp2 if qp is qp1 else qp1
        return (f"state={a.qp_state} max_send_wr>={int(a.cap.max_send_wr >= 16)} "
                f"max_recv_wr>={int(a.cap.max_recv_wr >= 16)} "
                f"dest={peer if a.dest_qp_num == other.qp_num else 'other'} "
                f"init_type={i.qp_type}")

    step("query_qp 1 (RESET)", lambda: q(qp1))
    sge = SGE(mr1.buf, 64, mr1.lkey)
    # EINVAL is what rdma-core's own tests expect of a post in RESET (utils.py,
    # post_sq_state_bad_flow, through ibv_wr_*); that mlx5's ibv_post_send answers the
    # same is not checked here (no NIC on this machine).
    step("post_send on RESET", lambda: qp1.post_send(SendWR(num_sge=1, sg=[sge])))
    step("post_recv on RESET", lambda: qp1.post_recv(RecvWR(num_sge=1, sg=[sge])))
    step("modify_qp RESET->RTS", lambda: qp1.modify(QPAttr(qp_state=e.IBV_QPS_RTS),
                                                     e.IBV_QP_STATE))
    step("modify_qp RESET->RTR", lambda: qp1.modify(QPAttr(qp_state=e.IBV_QPS_RTR),
                                                     e.IBV_QP_STATE))

    def bad_init():
        attr = QPAttr(qp_state=e.IBV_QPS_INIT)
        attr.port_num = 2
        qp1.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                   | e.IBV_QP_ACCESS_FLAGS)

    step("modify_qp RESET->INIT port 2", bad_init)
    step("modify_qp RESET->INIT no attrs", lambda: qp1.modify(QPAttr(qp_state=e.IBV_QPS_INIT),
                                                               e.IBV_QP_STATE))
    lid = pattr.lid
    step("connect qp1->qp2", lambda: connect(qp1, qp2.qp_num, lid, port))
    step("connect qp2->qp1", lambda: connect(qp2, qp1.qp_num, lid, port))
    step("query_qp 1 (RTS)", lambda: q(qp1))
    step("query_qp 2 (RTS)", lambda: q(qp2))
    step("modify_qp RTS->INIT", lambda: qp1.modify(QPAttr(qp_state=e.IBV_QPS_INIT),
                                                    e.IBV_QP_STATE))

    data = bytes((i * 7 + 3) % 251 for i in range(1024))

    def write():
        mr1.write(data, len(data))
        wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(mr1.buf, 1024, mr1.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(mr2.rkey, mr2.buf)
        qp1.post_send(wr)
        wc = wait_wc(cq)
        return f"{wc} data={'same' if mr2.read(1024, 0) == data else 'differs'}"

    def read():
        mr1.write(bytes(1024), 1024)
        wr = SendWR(opcode=e.IBV_WR_RDMA_READ, num_sge=1, sg=[SGE(mr1.buf, 1024, mr1.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(mr2.rkey, mr2.buf)
        qp1.post_send(wr)
        wc = wait_wc(cq)
        return f"{wc} data={'same' if mr1.read(1024, 0) == data else 'differs'}"

    def send():
        qp2.post_recv(RecvWR(wr_id=7, num_sge=1, sg=[SGE(mr2.buf + 2048, 2048, mr2.lkey)]))
        wr = SendWR(opcode=e.IBV_WR_SEND_WITH_IMM, num_sge=1, imm_data=0x1234,
                    sg=[SGE(mr1.buf, 512, mr1.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        qp1.post_send(wr)
        wcs = sorted(wait_wc(cq, 2).split())
        same = mr2.read(512, 2048) == data[:512]
        return f"{' '.join(wcs)} data={'same' if same else 'differs'}"

    step("RDMA WRITE 1 KiB", write)
    step("RDMA READ 1 KiB", read)
    step("SEND_WITH_IMM 512 B", send)
    step("post_send 2 SGEs (max_send_sge 1)", lambda: qp1.post_send(
        SendWR(num_sge=2, sg=[sge, sge], send_flags=e.IBV_SEND_SIGNALED)))

    def bad_rkey():
        wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(mr2.rkey ^ 0x5a5a00, mr2.buf)
        qp2.post_send(wr)
        return wait_wc(cq)

    step("RDMA WRITE bad rkey", bad_rkey)
    # No query_qp here: the device may still report RTS for a moment after the error
    # completion is polled (a mlx5 QP is in ERR by then), so the line would race.
    step("modify_qp 2 ->ERR", lambda: qp2.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE))
    step("query_qp 2 (ERR)", lambda: q(qp2))
    step("modify_qp 2 ERR->RTS", lambda: qp2.modify(QPAttr(qp_state=e.IBV_QPS_RTS),
                                                     e.IBV_QP_STATE))
    step("modify_qp 2 ->RESET", lambda: qp2.modify(QPAttr(qp_state=e.IBV_QPS_RESET),
                                                    e.IBV_QP_STATE))
    step("query_qp 2 (RESET)", lambda: q(qp2))

    def qpex_write():
        xcq = CQ(ctx, 16)
        attr = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=xcq, rcq=xcq, pd=pd,
                            cap=QPCap(max_send_wr=4, max_recv_wr=4),
                            comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                            send_ops_flags=e.IBV_QP_EX_WITH_RDMA_WRITE)
        qa, qb = QPEx(ctx, attr), QPEx(ctx, attr)
        connect(qa, qb.qp_num, lid, port)
        connect(qb, qa.qp_num, lid, port)
        mr1.write(data[::-1], 1024)
        qa.wr_start()
        qa.wr_id, qa.wr_flags = 9, e.IBV_SEND_SIGNALED
        qa.wr_rdma_write(mr2.rkey, mr2.buf)
        qa.wr_set_sge(SGE(mr1.buf, 1024, mr1.lkey))
        qa.wr_complete()
        wc = wait_wc(xcq)
        same = mr2.read(1024, 0) == data[::-1]
        qa.close()
        qb.close()
        xcq.close()
        return f"{wc} data={'same' if same else 'differs'}"

    step("create_qp_ex + ibv_wr_rdma_write", qpex_write)

    in_use_steps(args.dev)
    step("destroy qp1, qp2, cq", lambda: (qp1.close(), qp2.close(), cq.close()) and "")
    step("close device", lambda: ctx.close())
    print(f"{failures} steps failed")
    if failures < args.min_failures:
        print(f"fewer than {args.min_failures} failing steps", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
