# tests/drill: the runs of r2cc-verbs-drill (tools/drill, see tools/drill/README.md) that
# make test and make bench make, and the scripts that run it many times over
# (stall-matrix.sh, link-matrix.sh, inject-compare.sh, expect-fail.sh, far-witness.sh;
# bound.sh, the detection bound the two matrices share).

DRILL_TDIR := tests/drill

TEST_DEPS   += $(DRILL) $(DRILL_DIRECT) $(DRILL_RUNTIME)
CPU_TESTS   += 60@$(DRILL):--fault:none:--seeds:3 \
	       60@$(DRILL):--fault:none:--seeds:3:--no-preload \
	       60@$(DRILL):--fault:none:--seeds:3:--procs:4:--nics:2 \
	       60@$(DRILL):--fault:slow:--seeds:2 \
	       60@$(DRILL):--fault:none:--seeds:1:--nccl-stub \
	       60@$(DRILL_TDIR)/expect-fail.sh:corrupt:$(DRILL):--fault:none:--seeds:1:--selftest-corrupt
# NCCL's own port failover on (docs/architecture.md, Interposition facts): for a release that reads the variable
# (the drill's default pattern, 2.30, reports 2.30.3) R2CC steps aside, so the drill fails
# with the error completions the application gets (plain verbs: a peer that only receives
# may then wait for ever, as under plain NCCL); for 2.28, which ignores it, R2CC repairs
# (over 2 fused NICs: over 3, 2.28's connections cannot be repaired, repair/model/cts.h).
# NCCL settings under which re-posted clear-to-send writes are not safe (inline ones; a
# connection's data split over several QPs per NIC): hot repair steps aside with one
# warning naming the setting, and the application gets plain NCCL's errors.
CPU_TESTS   += 60@env:NCCL_IB_USE_INLINE=1:$(DRILL_TDIR)/expect-fail.sh:NCCL_IB_USE_INLINE=1:$(DRILL):--fault:down:--seeds:1:--nccl-stub:--timeout:5 \
	       60@env:NCCL_IB_QPS_PER_CONNECTION=2:NCCL_IB_SPLIT_DATA_ON_QPS=1:$(DRILL_TDIR)/expect-fail.sh:NCCL_IB_QPS_PER_CONNECTION=2:$(DRILL):--fault:down:--seeds:1:--nccl-stub:--timeout:5
CPU_TESTS   += 60@env:NCCL_IB_RESILIENCY_PORT_FAILOVER=1:$(DRILL_TDIR)/expect-fail.sh:exceeded:$(DRILL):--fault:down:--seeds:2:--nccl-stub:--timeout:5 \
	       60@env:NCCL_IB_RESILIENCY_PORT_FAILOVER=1:$(DRILL):--fault:down:--seeds:3:--nccl-version:2.28:--nics:2:--nccl-stub
# Failback (R2CC_FAILBACK_MS, here 300 ms): the faulted NIC restored (--restore), every
# process of its node brings it back, the node's NICs carry a third of its bytes again
# and every message arrives exactly once (with a second NIC down, the QPs it lost are
# spread onto the returned NIC: halves on the two up); a NIC flapping for 30 s (600 ms down, 600 ms
# up) comes back no more often than its doubling hold-down allows.
CPU_TESTS   += 60@$(DRILL):--fault:down:--restore:200:--seeds:6:--messages:512:--nccl-stub \
	       60@$(DRILL):--fault:blackhole:--restore:1500:--seeds:4:--messages:512:--nccl-stub \
	       60@$(DRILL):--fault:down:--restore:200:--seeds:3:--messages:512:--link:roce:--nccl-stub \
	       60@$(DRILL):--fault:down:--restore:300:--seeds:2:--messages:256:--procs:4:--per-node:2:--nccl-stub \
	       60@$(DRILL):--fault:down:--second-fault:50:--restore:300:--qps:2:--seeds:3:--messages:512:--nccl-stub \
	       120@$(DRILL):--fault:flap:--flap-ms:600:--restore:30000:--seeds:1:--messages:8192:--max-size:65536:--nccl-stub
# Lifetimes: connections (with traffic) and QPs made and destroyed all through the
# traffic and the fault, some in the middle of their repair (--churn); R2CC frees the
# records of the destroyed ones meanwhile, and every message arrives once.
CPU_TESTS   += 60@$(DRILL):--fault:down:--churn:--seeds:3:--messages:512:--nccl-stub \
	       60@$(DRILL):--fault:blackhole:--churn:--seeds:3:--messages:512:--nccl-stub \
	       60@$(DRILL):--fault:fatal:--churn:--seeds:3:--messages:512:--nccl-stub \
	       60@$(DRILL):--fault:ackloss:--churn:--link:roce:--seeds:3:--messages:512:--nccl-stub \
	       60@$(DRILL):--fault:down:--churn:--procs:4:--per-node:2:--seeds:2:--messages:512:--nccl-stub
# Hot repair (tools/drill/README.md): each NIC fault kind over 100 seeds (fatal: a dead
# device, whose lost receive completions are made from the peer's record), 4 processes,
# a fault while connecting (a dead device refuses the CQs and QPs NCCL makes after it:
# R2CC stands them in on a sibling; 0 of 4 seeds passed with 4 processes and --flush
# before, IB and RoCE), a second NIC failing during the repair (a dead device's: the
# exchange begins again from another NIC when the initiator's new path is refused after
# the REP; 18 of 24 seeds passed before, at 2 ms; a black hole's second NIC 100 ms
# after the first, with 1,024 messages a connection so that it still meets traffic: at
# 512 the first fault of seed 1 comes 62 % in and the traffic can end first); then the
# faults R2CC cannot repair, which must end in a clean application error, never a hang.
CPU_TESTS   += 120@$(DRILL):--fault:down:--seeds:100:--nccl-stub \
	       180@$(DRILL):--fault:blackhole:--seeds:100:--nccl-stub \
	       120@$(DRILL):--fault:flap:--seeds:100:--nccl-stub \
	       120@$(DRILL):--fault:slow:--seeds:100:--nccl-stub \
	       120@$(DRILL):--fault:fatal:--seeds:100:--nccl-stub \
	       180@$(DRILL):--fault:all:--seeds:5:--procs:4:--nics:2:--nccl-stub \
	       60@$(DRILL):--fault:down:--seeds:5:--fault-phase:connect:--nccl-stub \
	       60@$(DRILL):--fault:fatal:--seeds:5:--fault-phase:connect:--nccl-stub \
	       60@$(DRILL):--fault:fatal:--seeds:5:--fault-phase:connect:--link:roce:--nccl-stub \
	       60@$(DRILL):--fault:fatal:--seeds:4:--fault-phase:connect:--procs:4:--flush:--nccl-stub \
	       60@$(DRILL):--fault:fatal:--seeds:4:--fault-phase:connect:--procs:4:--flush:--link:roce:--nccl-stub \
	       60@$(DRILL):--fault:fatal:--seeds:3:--fault-phase:connect:--churn:--messages:512:--nccl-stub \
	       60@$(DRILL):--fault:down:--seeds:5:--second-fault:2:--nccl-stub \
	       60@$(DRILL):--fault:blackhole:--seeds:5:--second-fault:100:--messages:1024:--nccl-stub \
	       90@$(DRILL):--fault:fatal:--seeds:24:--second-fault:2:--nccl-stub \
	       60@$(DRILL):--fault:fatal:--seeds:8:--second-fault:0:--link:roce:--nccl-stub \
	       60@$(DRILL):--fault:fatal:--seeds:24:--second-fault:0:--flush:--nccl-stub \
	       90@$(DRILL):--fault:down:--fault-nics:all:--expect:clean-error:--seeds:3:--nics:2:--nccl-stub \
	       90@$(DRILL):--fault:blackhole:--fault-nics:all:--expect:clean-error:--seeds:2:--nics:2:--nccl-stub \
	       90@$(DRILL):--kill-peer:--expect:clean-error:--seeds:3:--nccl-stub
# Every NIC of a node black-holed behind a slow transport (QP timeout 1.7 s): each path
# R2CC tries fails only at that timeout, too seldom for the 5 s churn window; the repair
# must still give up (barren moves in a row) and the application get its error.
CPU_TESTS   += 120@$(DRILL):--fault:blackhole:--fault-nics:all:--expect:clean-error:--seeds:4:--time-scale:0.05:--bound:25:--timeout:30:--nccl-stub
# Exactly once on both link layers (tests/drill/link-matrix.sh): every fault kind x
# {InfiniBand, RoCE v2: a subnet per rail, routed, a lossless class no byte may leave}
# x {2, 4 processes} x {flush off, on}, 3 seeds a cell (24 a kind); with the rows above
# and the stall matrix, at least 100 seeds of every kind. The same matrix once more,
# one seed a cell, through r2cc-verbs-drill-direct: the worker linked against
# libibverbs, whose verbs R2CC reaches by symbol (HPC-X's net plugin's door).
CPU_TESTS   += 600@$(DRILL_TDIR)/link-matrix.sh:$(BUILD):3 \
	       300@$(DRILL_TDIR)/link-matrix.sh:$(BUILD):1:-:r2cc-verbs-drill-direct \
	       120@$(DRILL):--fault:blackhole-tx:--seeds:76:--nccl-stub \
	       120@$(DRILL):--fault:blackhole-rx:--seeds:76:--nccl-stub \
	       60@$(DRILL):--fault:ackloss:--seeds:20:--nccl-stub \
	       90@$(DRILL):--fault:jitter:--expect:no-repair:--seeds:20:--nccl-stub
BENCHES     += $(DRILL_TDIR)/link-matrix.sh:$(BUILD):13
# Far probes (repair/farprobe.c): every NIC with one sibling, a black hole and lost
# acknowledgements found by the self-test's far witness in every scenario, under 250 ms
# (the one-sibling timing without them: 324-356 ms).
CPU_TESTS   += 180@$(DRILL_TDIR)/far-witness.sh:$(BUILD):2
# Never silently unprotected (intercept/netcheck.h): NCCL's test double loads a net
# plugin of the project's own that opens no RDMA device (tools/ncclstub/testnet.c),
# named as a plugin of its own and as HPC-X's answers over UCX, or NCCL_NET names
# sockets: every worker's report must say "not protected" for that network; without
# either, the same expectation must fail (NCCL's IB carries the drill's traffic).
CPU_TESTS   += 60@$(DRILL):--fault:none:--seeds:1:--nccl-stub:--net-plugin:testnet:--expect-unprotected:TestNet \
	       60@env:TESTNET_NAME=UCX:$(DRILL):--fault:none:--seeds:1:--nccl-stub:--net-plugin:testnet:--expect-unprotected:UCX \
	       60@$(DRILL):--fault:none:--seeds:1:--nccl-stub:--nccl-net:Socket:--expect-unprotected:NCCL_NET=Socket \
	       60@$(DRILL_TDIR)/expect-fail.sh:reports:$(DRILL):--fault:none:--seeds:1:--nccl-stub:--expect-unprotected:Socket
# mlx5 Direct Verbs (the device's libmlx5 stand-in): data QPs made by mlx5dv_create_qp,
# reached through dlvsym at MLX5_1.3 (as NCCL 2.30) and by symbol (the direct drill),
# are repaired exactly once; with an out-of-order receive queue (NCCL_IB_OOO_RQ=1's
# QPs) R2CC refuses them with one warning naming the setting, and the application
# gets its error, as under plain NCCL.
# With --flush the receive rings are registered by mlx5dv_reg_dmabuf_mr (data direct's
# call): a repair across NICs needs R2CC's mirror of them.
CPU_TESTS   += 60@$(DRILL):--fault:down:--seeds:5:--mlx5dv:plain:--nccl-stub \
	       60@$(DRILL_DIRECT):--fault:blackhole:--seeds:3:--mlx5dv:plain:--link:roce:--nccl-stub \
	       60@$(DRILL):--fault:down:--seeds:3:--mlx5dv:plain:--flush:--nccl-stub \
	       60@$(DRILL_DIRECT):--fault:blackhole:--seeds:2:--mlx5dv:plain:--flush:--no-fusion:--qps:2:--nccl-stub \
	       60@$(DRILL_TDIR)/expect-fail.sh:NCCL_IB_OOO_RQ:$(DRILL):--fault:down:--seeds:1:--mlx5dv:ooo:--nccl-stub:--timeout:5 \
	       60@$(DRILL_TDIR)/expect-fail.sh:NCCL_IB_OOO_RQ:$(DRILL_DIRECT):--fault:blackhole:--seeds:1:--mlx5dv:ooo:--nccl-stub:--timeout:5
# RoCE's self-test: with transport timeouts of 1.7 s (time scale 0.05), a black hole or
# lost acknowledgements on a RoCE NIC must be found by the stall scan and the self-test,
# well before the transport error (which was the only detection there before).
CPU_TESTS   += 90@$(DRILL):--link:roce:--fault:blackhole:--seeds:4:--time-scale:0.05:--detect-within:1200:--nccl-stub \
	       90@$(DRILL):--link:roce:--fault:ackloss:--seeds:4:--time-scale:0.05:--detect-within:1200:--nccl-stub
# One message in flight per connection: once it waits on the black hole, no other path
# of either process has work, and nothing completes anywhere. The stall scan suspects
# such a wait too, one stall floor later (before, only the transport error found it in
# about a third of the seeds). The bound is under the transport error's 3,436 ms (time
# scale 0.1). A NIC that went black within its first 100 ms of busy time used to be
# measured at the few bytes it drained before (2 MB/s), which explained a wait of 1.4 s
# and put detection at 3,054 ms once in 200 scenarios; a wait no completion ended now
# measures nothing (repair/model/stall.c, tests/unit/test_stall.c), and 200 scenarios of the
# RoCE row stay under 438 ms.
# On RoCE a self-test counts only siblings known to be routed to the NIC. A NIC that went
# black before any sibling had answered it (the fault while connecting, or, about once
# in 90 scenarios of the traffic row, before its calibration came round) was never
# confirmed dead, and only the transport error found it: 2 and 3 of 8 seeds passed the
# connect rows before (repair/localise.c, selftest_reaches), and CI saw the traffic row
# fail so (1,722 ms at time scale 0.05, 3,442 ms at 0.1).
CPU_TESTS   += 90@$(DRILL):--fault:blackhole:--window:1:--seeds:8:--time-scale:0.1:--detect-within:3000:--nccl-stub \
	       90@$(DRILL):--link:roce:--fault:blackhole:--window:1:--seeds:8:--time-scale:0.1:--detect-within:3000:--nccl-stub \
	       90@$(DRILL):--link:roce:--fault:blackhole:--fault-phase:connect:--window:1:--seeds:8:--time-scale:0.1:--detect-within:3000:--nccl-stub \
	       90@$(DRILL):--link:roce:--fault:blackhole:--fault-phase:connect:--seeds:8:--time-scale:0.05:--detect-within:1200:--nccl-stub
# Scale: 16 processes x 2 NICs (240 connections, 480 data QPs); above 4 workers the drill's
# defaults shrink to fit 2 cores (tools/drill/README.md).
CPU_TESTS   += 240@$(DRILL):--procs:16:--nics:2:--fault:down:--seeds:5:--nccl-stub \
	       240@$(DRILL):--procs:16:--nics:2:--fault:blackhole:--seeds:5:--nccl-stub
# Keys the peer registered after the move (--fresh-mr), the peer then stopped for 1 s: no
# ibv_post_send may wait for it (each took 1,006-1,016 ms when the post fetched the map).
CPU_TESTS   += 60@$(DRILL):--fault:down:--fresh-mr:--seeds:6:--nccl-stub \
	       60@$(DRILL):--fault:fatal:--fresh-mr:--seeds:6:--nccl-stub \
	       60@$(DRILL):--fault:down:--fresh-mr:--seeds:4:--link:roce:--procs:4:--nccl-stub
# GPU Direct flush (--flush): receive rings are device memory (dmabuf MRs) and every
# receive connection also has a loopback QP per NIC, connected to itself, that reads
# each message back; hot repair must move those too. A message passes only if every NIC
# that wrote bytes of it was read through since (softverbs_unflushed). With each
# connection on one NIC (--no-fusion), a repair spreads its QPs over NICs NCCL's flush
# QP is not on: R2CC's helper READs there (repair/gpuflush.c). Before them 1-2, 4-5, 3
# and 5 of 6 seeds passed the last four rows in two runs (logs/repair/gpu-flush/).
CPU_TESTS   += 60@$(DRILL):--fault:none:--seeds:3:--flush:--nccl-stub \
	       120@$(DRILL):--fault:down:--seeds:20:--flush:--nccl-stub \
	       120@$(DRILL):--fault:blackhole:--seeds:20:--flush:--nccl-stub \
	       60@$(DRILL):--fault:none:--seeds:2:--flush:--no-fusion:--qps:2:--procs:4:--nccl-stub \
	       90@$(DRILL):--fault:down:--seeds:6:--flush:--no-fusion:--qps:2:--procs:4:--nccl-stub \
	       60@$(DRILL):--fault:down:--seeds:6:--flush:--no-fusion:--nccl-stub \
	       60@$(DRILL):--fault:fatal:--seeds:6:--flush:--no-fusion:--qps:2:--link:roce:--nccl-stub \
	       60@$(DRILL):--fault:blackhole:--seeds:6:--flush:--no-fusion:--qps:2:--nccl-stub
# Other NCCL releases' verbs patterns (--nccl-version, docs/nccl-versions.md): 2.18-2.19
# (64 request slots, 32-byte FIFO elements, each connection on one NIC with its
# clear-to-send on qps[0]; 4 processes so that every NIC carries connections), 2.20-2.23
# (idx at 32, at most 2 fused NICs) and 2.30-2.32 (idx at 56, no receive queue on the
# QPs that receive nothing; the default), healthy and through hot repair.
# The landed check (repair/model/cts.h): with 3 fused NICs (the default) some repair must find
# clear-to-send writes landed at the peer and leave them out; 2.28 clears a consumed
# element, so over 3 fused NICs its QPs are refused (NCCL gets its error in bounded
# time) and over 2 they are repaired.
CPU_TESTS   += 60@$(DRILL):--fault:none:--seeds:2:--nccl-version:2.18:--procs:4 \
	       120@$(DRILL):--fault:down:--seeds:10:--nccl-version:2.18:--procs:4:--nccl-stub \
	       120@$(DRILL):--fault:blackhole:--seeds:10:--nccl-version:2.18:--procs:4:--nccl-stub \
	       90@$(DRILL):--fault:down:--seeds:5:--nccl-version:2.18:--procs:4:--flush:--nccl-stub \
	       60@$(DRILL):--fault:down:--seeds:5:--nccl-version:2.21:--nics:2:--messages:256:--nccl-stub \
	       90@$(DRILL):--fault:blackhole:--seeds:10:--nccl-version:2.30:--messages:256:--nccl-stub \
	       60@$(DRILL):--fault:down:--seeds:5:--nccl-version:2.30:--flush:--nccl-stub \
	       60@$(DRILL_TDIR)/expect-fail.sh:corrupt:$(DRILL):--fault:none:--seeds:1:--nccl-version:2.18:--selftest-corrupt \
	       60@$(DRILL):--fault:down:--seeds:4:--expect-landed:--nccl-stub \
	       60@$(DRILL):--fault:blackhole:--seeds:3:--expect-landed:--link:roce:--procs:4:--nccl-stub \
	       60@$(DRILL):--fault:down:--seeds:3:--nccl-version:2.28:--expect:clean-error:--nccl-stub \
	       60@$(DRILL):--fault:blackhole:--seeds:4:--nccl-version:2.28:--nics:2:--nccl-stub
# The library's own drill (R2CC_DRILL; --inject, tools/drill/README.md) against the
# device's fault, tests/drill/inject-compare.sh: each kind the drill has (down, blackhole,
# blackhole-tx, blackhole-rx, ackloss, flap) x {IB, RoCE} x {2 processes, 4 on 2 nodes},
# the same seeds both ways at time scale 1 (transport timeouts of 34 s: R2CC's own
# detection finds the fault), per seed the same verdict, evidence classes and queue
# pairs moved, and every message exactly once: 3 seeds a cell here (12 a kind), 22
# more in the bench (from seed 1000): 100 a kind. Then the plan's other steps: a second
# NIC 100 ms later, and every NIC of the node with the clean error (the drill times a
# queue pair out at its own RTS attributes, unscaled: time scale 1 and NCCL_IB_TIMEOUT
# 14, 537 ms both ways, or the survivor waits 34 s); and plans that cannot be carried
# out, which the reports must say: a NIC no node has (its node's reports), a node not
# in the job, a time after the job's end (every report).
INJECT_SEEDS := 3
CPU_TESTS   += 600@$(DRILL_TDIR)/inject-compare.sh:$(BUILD):$(INJECT_SEEDS):1 \
	       60@$(DRILL):--fault:blackhole:--inject:--second-fault:100:--seeds:3:--messages:1024:--nccl-stub \
	       90@$(DRILL):--fault:down:--inject:--fault-nics:all:--expect:clean-error:--seeds:2:--nics:2:--time-scale:1:--ib-timeout:14:--nccl-stub \
	       60@$(DRILL):--drill-plan:node0/mlx5_9=down@0:--expect-drill-problem:mlx5_9:--seeds:2:--nccl-stub \
	       60@$(DRILL):--drill-plan:node7/mlx5_0=down@0:--expect-drill-problem:job:--seeds:2:--nccl-stub \
	       60@$(DRILL):--drill-plan:node1/mlx5_1=down@600s:--expect-drill-problem:ended:--seeds:2:--nccl-stub
BENCHES     += $(DRILL_TDIR)/inject-compare.sh:$(BUILD):22:1000
# A healthy job is never taken down (tests/drill/stall-matrix.sh): slow NICs, many QPs,
# several processes per node, large messages with a declared failure; no repair at all
# without a fault or under jitter, every message exactly once through a black hole, a
# link down or lost acknowledgements: 300 scenarios, 120 of them with no repair allowed,
# and the detection of black holes and lost acknowledgements within the script's guard
# bound. The bench runs the no-fault and jitter rows 67 times over (2,010 no-repair
# scenarios) and every fault, the one-way black holes too, 8 times over.
STALL_KINDS := none,jitter,blackhole,down,ackloss
CPU_TESTS   += 600@$(DRILL_TDIR)/stall-matrix.sh:$(BUILD):4:$(STALL_KINDS)
BENCHES     += $(DRILL_TDIR)/stall-matrix.sh:$(BUILD):67:none,jitter \
	       $(DRILL_TDIR)/stall-matrix.sh:$(BUILD):8:blackhole,down,ackloss,blackhole-tx,blackhole-rx
BENCH_TARGETS += $(DRILL) $(DRILL_RUNTIME)
