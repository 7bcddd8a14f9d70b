# shellcheck shell=bash
# Shared settings and helpers of the seed's six scenario scripts (01-06) and of
# scripts/drill. Sourced, never run. Everything is set from the environment; the
# README next to this file lists every variable. In short:
#
#   R2CC_TARGET=soft (default)  one GPU host: NODES x GPUS_PER_NODE emulated nodes over
#                               the software RDMA fabric, 3 soft NICs per node
#                               (SOFT_NICS, shaped to SOFT_GBPS each, like the seed's
#                               equal-speed topology file)
#   R2CC_TARGET=cluster         mpirun over HOSTFILE, NP ranks, real NICs R2CC_NICS
#   NCCL_TESTS_DIR=DIR          use NVIDIA nccl-tests' binaries from DIR instead of
#                               build/bin's r2cc-perf links
#   R2CC_FAULT_METHOD=soft|inject|ovs|iplink|nft|ibportstate   how a NIC is cut (drills,
#                               01/02); inject: the library cuts it inside the job (R2CC_DRILL)
#   DRY_RUN=1                   print every command, run none of them
#   SAVE_LOG=1                  also save the whole output to LOG_DIR/<NN>.<name>.log
#
# Functions are prefixed scn_; variables the scripts read after sourcing are SCN_*.

SCN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SCN_DIR=$SCN_ROOT/scripts/scenarios
SCN_BUILD=${BUILD:-build}
SCN_BIN=${R2CC_BIN_DIR:-$SCN_ROOT/$SCN_BUILD/bin}
SOFTVERBS_CTL=${SOFTVERBS_CTL:-$SCN_BIN/softverbs-ctl}
R2CC_LIB=${R2CC_LIB:-$SCN_ROOT/$SCN_BUILD/lib/libr2cc.so}
R2CC_TARGET=${R2CC_TARGET:-soft}
NODES=${NODES:-2}
GPUS_PER_NODE=${GPUS_PER_NODE:-2}
NP=${NP:-$((NODES * GPUS_PER_NODE))}
FAILED_NODE=${FAILED_NODE:-0}
FAILED_NIC=${FAILED_NIC:-mlx5_2}
SOFT_NICS=${SOFT_NICS:-mlx5_0,mlx5_2,mlx5_3}
SOFT_GBPS=${SOFT_GBPS:-25}
R2CC_NICS=${R2CC_NICS:-mlx5_0,mlx5_2,mlx5_3}
R2CC_FAULT_METHOD=${R2CC_FAULT_METHOD:-}
MPIRUN=${MPIRUN:-mpirun}
SSH=${SSH:-ssh -o BatchMode=yes -o ConnectTimeout=10}
DRY_RUN=${DRY_RUN:-0}
# names (as ps shows them, at most 15 characters) of the benchmarks check_idle looks for
IDLE_PROCS=${IDLE_PROCS:-r2cc-perf r2cc-perf-emu all_reduce_perf all_gather_perf reduce_scatter_ broadcast_perf reduce_perf alltoall_perf sendrecv_perf}

SCN_PY=${PYTHON:-python3}
SCN_LDPATH0=${LD_LIBRARY_PATH:-}
SCN_RESULTS=$SCN_DIR/results.py

scn_die() { # message: one line, then exit 2 (usage or set-up error)
	echo "${SCN_NAME:-scenario}: $*" >&2
	exit 2
}

scn_dry() { [ "$DRY_RUN" = 1 ]; }

# scn_show CMD...: prints a command line the way a shell would read it back
scn_show() {
	local out='' a
	for a in "$@"; do
		if [[ $a =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then out+=" $a"; else out+=" $(printf '%q' "$a")"; fi
	done
	printf '%s\n' "${out# }"
}

scn_check_settings() {
	case $R2CC_TARGET in
	soft | cluster) ;;
	*) scn_die "R2CC_TARGET=$R2CC_TARGET: accepts soft or cluster" ;;
	esac
	[[ $NODES =~ ^[1-9][0-9]*$ ]] || scn_die "NODES=$NODES: accepts a positive integer"
	[[ $GPUS_PER_NODE =~ ^[1-9][0-9]*$ ]] || scn_die "GPUS_PER_NODE=$GPUS_PER_NODE: accepts a positive integer"
	[[ $NP =~ ^[1-9][0-9]*$ ]] || scn_die "NP=$NP: accepts a positive integer"
	[[ $FAILED_NODE =~ ^[0-9]+$ ]] || scn_die "FAILED_NODE=$FAILED_NODE: accepts a node index (0 = node of rank 0)"
	[ -n "$R2CC_FAULT_METHOD" ] || scn_default_method
	case $R2CC_FAULT_METHOD in
	soft) [ "$R2CC_TARGET" = soft ] || scn_die "R2CC_FAULT_METHOD=soft needs R2CC_TARGET=soft (the software fabric)" ;;
	inject) ;;
	ovs | iplink | nft | ibportstate)
		[ "$R2CC_TARGET" = cluster ] || scn_die "R2CC_FAULT_METHOD=$R2CC_FAULT_METHOD cuts a real NIC: needs R2CC_TARGET=cluster" ;;
	*) scn_die "R2CC_FAULT_METHOD=$R2CC_FAULT_METHOD: accepts soft, inject, ovs, iplink, nft or ibportstate" ;;
	esac
	if [ "$R2CC_TARGET" = cluster ]; then
		[ -n "${HOSTFILE:-}" ] || scn_die "R2CC_TARGET=cluster needs HOSTFILE (one 'host slots=N' line per node)"
		[ -r "$HOSTFILE" ] || scn_missing "HOSTFILE=$HOSTFILE: cannot read it"
	fi
	[ -e "$R2CC_LIB" ] || scn_missing "R2CC_LIB=$R2CC_LIB does not exist (run make)"
	if [ -n "${NCCL_TESTS_DIR:-}" ] && [ ! -d "$NCCL_TESTS_DIR" ]; then
		scn_missing "NCCL_TESTS_DIR=$NCCL_TESTS_DIR is not a directory"
	fi
	true
}

# The method when R2CC_FAULT_METHOD is unset (SCN_METHOD_WHY says why, for the header).
# Soft target: the fabric's own faults. Cluster: a switch method whose settings are
# present (OVS_BRIDGE/OVS_PORT: ovs; IBPORTSTATE_LID/IBPORTSTATE_PORT: ibportstate), else
# inject, which needs no rights at all. iplink and nft are never guessed: they need root
# on the nodes, and FAULT_DEV alone does not say which of the two is meant.
scn_default_method() {
	local ovs=${OVS_BRIDGE:-}${OVS_PORT:-} ibp=${IBPORTSTATE_LID:-}${IBPORTSTATE_PORT:-}
	if [ "$R2CC_TARGET" = soft ]; then
		R2CC_FAULT_METHOD=soft SCN_METHOD_WHY="default on the soft target"
	elif [ -n "$ovs" ] && [ -n "$ibp" ]; then
		scn_die "both OVS_* and IBPORTSTATE_* are set: say which method cuts the NIC (R2CC_FAULT_METHOD=ovs or ibportstate)"
	elif [ -n "$ovs" ]; then
		R2CC_FAULT_METHOD=ovs SCN_METHOD_WHY="default on the cluster: OVS_BRIDGE/OVS_PORT are set"
	elif [ -n "$ibp" ]; then
		R2CC_FAULT_METHOD=ibportstate SCN_METHOD_WHY="default on the cluster: IBPORTSTATE_LID/IBPORTSTATE_PORT are set"
	elif [ -n "${FAULT_DEV:-}" ]; then
		scn_die "FAULT_DEV is set but R2CC_FAULT_METHOD is not: say iplink or nft (or unset FAULT_DEV: the default is then inject)"
	else
		R2CC_FAULT_METHOD=inject SCN_METHOD_WHY="default on the cluster: no switch or host method is configured"
	fi
}

# A missing build product or file: fatal for a real run, a note in a dry run.
scn_missing() {
	if scn_dry; then echo "# note (dry run): $*"; else scn_die "$*"; fi
}

# The hosts of HOSTFILE in order, one per line (first word of each non-comment line).
scn_hosts() {
	[ -n "${HOSTFILE:-}" ] && [ -r "$HOSTFILE" ] || return 0
	awk '!/^[ \t]*(#|$)/ { sub(/^[ \t]+/, ""); split($1, a, ":"); print a[1] }' "$HOSTFILE"
}

# scn_node_host K: the host of node K (FAULT_HOSTS, comma list, else HOSTFILE's K-th)
scn_node_host() {
	local k=$1 h
	if [ -n "${FAULT_HOSTS:-}" ]; then
		IFS=',' read -r -a h <<<"$FAULT_HOSTS"
	else
		mapfile -t h < <(scn_hosts)
	fi
	[ "$k" -lt "${#h[@]}" ] || { echo "node$k-host-unknown"; return 1; }
	echo "${h[$k]}"
}

# ----------------------------------------------------------------- binaries ---

# scn_bin NAME: the nccl-tests program NAME (all_reduce_perf, ...): NVIDIA's from
# NCCL_TESTS_DIR when set, else build/bin's r2cc-perf link.
scn_bin() {
	local name=$1
	if [ -n "${NCCL_TESTS_DIR:-}" ]; then
		echo "$NCCL_TESTS_DIR/$name"
	else
		echo "$SCN_BIN/$name"
	fi
}

# Is this program r2cc-perf (it takes --nodes, --nic-table, --iters-table, -T)?
scn_is_r2cc_perf() {
	local p=$1
	case $(basename "$p") in
	r2cc-perf | r2cc-perf-emu) return 0 ;;
	esac
	[ "$(cd "$(dirname "$p")" 2>/dev/null && pwd)" = "$SCN_BIN" ] && return 0
	[ -L "$p" ] && case $(readlink "$p") in *r2cc-perf*) return 0 ;; esac
	return 1
}

# ------------------------------------------------------------------ environment ---

# scn_env_setup NAME: the fabric (soft target) and the NCCL settings for one run.
# Sets SCN_FABRIC (soft) and prints nothing.
scn_env_setup() {
	local name=$1
	if [ "$R2CC_TARGET" = soft ]; then
		local spec='' nic
		IFS=',' read -r -a _nics <<<"$SOFT_NICS"
		for nic in "${_nics[@]}"; do spec+=${spec:+,}$nic:$SOFT_GBPS; done
		# shellcheck source=../softfabric.sh
		. "$SCN_ROOT/scripts/softfabric.sh"
		# softfabric_env prepends the device: start from the caller's path every time
		if [ -n "$SCN_LDPATH0" ]; then export LD_LIBRARY_PATH=$SCN_LDPATH0; else unset LD_LIBRARY_PATH; fi
		R2CC_ROOT=$SCN_ROOT BUILD=$SCN_BUILD softfabric_env "$spec" "${SCN_FABRIC_PREFIX:-r2cc-scn}-$name"
		export SOFTVERBS_SHAPING=${SOFTVERBS_SHAPING:-1}
		SCN_FABRIC=$SOFTVERBS_FABRIC
	fi
	export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
}

# Removes this run's soft fabric (its counters were read by the run itself).
scn_fabric_reset() {
	[ -n "${SCN_FABRIC:-}" ] && "$SOFTVERBS_CTL" --fabric "$SCN_FABRIC" reset >/dev/null 2>&1
	true
}

# The variables a run hands to its ranks, NAME=VALUE per line: NCCL_* and
# SOFTVERBS_* set now, LD_LIBRARY_PATH (soft target: the device comes first).
scn_env_lines() {
	local v
	for v in $(compgen -e | sort); do
		case $v in
		NCCL_TESTS_DIR) ;;
		NCCL_* | SOFTVERBS_*) echo "$v=${!v}" ;;
		LD_LIBRARY_PATH) [ "$R2CC_TARGET" = soft ] && echo "$v=${!v}" ;;
		esac
	done
	true
}

# ---------------------------------------------------------------- launching ---

# Open MPI refuses to start as root without --allow-run-as-root (containers, the GPU machine)
scn_mpi_root_flag() {
	[ "$(id -u)" = 0 ] || return 0
	if [ -n "${MPI_AS_ROOT:-}" ]; then
		[ "$MPI_AS_ROOT" = 1 ] && echo --allow-run-as-root
		return 0
	fi
	"$MPIRUN" --version 2>/dev/null | grep -q "Open MPI" && echo --allow-run-as-root
	true
}

# scn_build_cmd R2CC_ENV -- PROGRAM ARGS...: sets the array SCN_CMD to the exact launch
# line for the target. R2CC_ENV is a space-separated list of NAME=VALUE for R2CC
# (LD_PRELOAD included by the caller when wanted; may be empty).
scn_build_cmd() {
	local renv=$1
	shift
	[ "$1" = -- ] && shift
	local prog=$1
	shift
	local -a kv
	read -r -a kv <<<"$renv"
	SCN_CMD=()
	if [ "$R2CC_TARGET" = soft ]; then
		if scn_is_r2cc_perf "$prog"; then
			SCN_CMD=(env "${kv[@]}" "$prog" --nodes "$NODES" --gpus-per-node "$GPUS_PER_NODE" "$@")
		else
			# NVIDIA nccl-tests on one host: mpirun on localhost, one NCCL_HOSTID per
			# emulated node. nccl-tests picks the GPU by local rank, so NODES x
			# GPUS_PER_NODE must not exceed the GPUs of this host.
			local x=() e
			for e in "${kv[@]}"; do x+=(-x "$e"); done
			# shellcheck disable=SC2207 # one word or none
			SCN_CMD=("$MPIRUN" $(scn_mpi_root_flag) -np "$((NODES * GPUS_PER_NODE))" --oversubscribe
				--bind-to none "${x[@]}" -x PATH -x LD_LIBRARY_PATH)
			for e in $(compgen -e | grep -E '^(NCCL_|SOFTVERBS_)' | grep -v '^NCCL_TESTS_DIR$' | sort); do
				SCN_CMD+=(-x "$e")
			done
			SCN_CMD+=(bash -c "export NCCL_HOSTID=node\$((OMPI_COMM_WORLD_RANK / $GPUS_PER_NODE)); exec \"\$0\" \"\$@\""
				"$prog" "$@")
		fi
	else
		local x=() e first
		for e in "${kv[@]}"; do x+=(-x "$e"); done
		x+=(-x "NCCL_IB_HCA==$R2CC_NICS")
		for e in $(compgen -e | grep -E '^NCCL_' | grep -vE '^(NCCL_TESTS_DIR|NCCL_IB_HCA)$' | sort); do
			x+=(-x "$e")
		done
		first=$(scn_hosts | head -n1)
		# r2cc-perf's ranks meet at process 0's address (bench/README.md)
		if scn_is_r2cc_perf "$prog"; then x+=(-x "R2CC_PERF_ROOT=${R2CC_PERF_ROOT:-${first:-HOST0}:29517}"); fi
		local -a extra=()
		[ -n "${MPI_ARGS:-}" ] && read -r -a extra <<<"$MPI_ARGS"
		# shellcheck disable=SC2207 # one word or none
		SCN_CMD=("$MPIRUN" $(scn_mpi_root_flag) -np "$NP" --hostfile "$HOSTFILE" --bind-to none "${extra[@]}"
			"${x[@]}" -x PATH -x LD_LIBRARY_PATH "$prog" "$@")
	fi
}

# scn_print_launch: the environment and the command of SCN_CMD, as they will run
scn_print_launch() {
	echo "environment:"
	scn_env_lines | sed 's/^/  export /'
	echo "command:"
	echo "  $(scn_show "${SCN_CMD[@]}")"
}

# scn_exec OUTFILE: runs SCN_CMD, output to the terminal (and the saved log) and OUTFILE;
# returns its exit status. In a dry run: nothing, status 0.
scn_exec() {
	local out=$1
	if scn_dry; then
		: >"$out"
		return 0
	fi
	"${SCN_CMD[@]}" 2>&1 | tee "$out"
	return "${PIPESTATUS[0]}"
}

# ----------------------------------------------------------------- faults ---

# scn_fault_cmd NODE NIC ACTION [ARG]: prints the shell command that applies ACTION
# (down, blackhole, blackhole-tx, blackhole-rx, ackloss, up, flap MS, slow GBPS) to NIC
# of node NODE (index) with R2CC_FAULT_METHOD. Status 1 with a message on stderr when the
# method cannot do it. inject has no command: it prints the step as R2CC_DRILL carries it
# (for the plan's display; nothing must run it).
scn_fault_cmd() {
	local node=$1 nic=$2 act=$3 arg=${4:-} host
	case $R2CC_FAULT_METHOD in
	soft)
		local a=$act
		[ -n "$arg" ] && a="$act $arg"
		echo "$SOFTVERBS_CTL --fabric ${SCN_FABRIC:-${SOFTVERBS_FABRIC:-FABRIC}} fault node$node $nic $a"
		return 0
		;;
	inject)
		if [ "$act" = slow ]; then
			echo "R2CC_FAULT_METHOD=inject: 'slow' is not a kind of R2CC_DRILL (down, blackhole, blackhole-tx, blackhole-rx, ackloss, flap:MS, up); it exists with the soft method only" >&2
			return 1
		fi
		echo "R2CC_DRILL step node$node/$nic=$act${arg:+:$arg}: applied by libr2cc.so in every rank, no command"
		return 0
		;;
	esac
	case $act in
	slow)
		echo "R2CC_FAULT_METHOD=$R2CC_FAULT_METHOD: 'slow' exists with the soft method only (the software fabric)" >&2
		return 1
		;;
	flap | blackhole-tx | blackhole-rx | ackloss)
		local alt=
		[ "$act" = flap ] && alt="; or write the flap as down/up steps"
		echo "R2CC_FAULT_METHOD=$R2CC_FAULT_METHOD: '$act' exists with the soft and inject methods only (R2CC_FAULT_METHOD=inject: the library cuts the NIC inside the job)$alt" >&2
		return 1
		;;
	esac
	host=$(scn_node_host "$node") || {
		echo "node $node has no host: set FAULT_HOSTS or add it to HOSTFILE" >&2
		return 1
	}
	case $R2CC_FAULT_METHOD in
	ovs)
		local oh=${OVS_HOST:-$host} br=${OVS_BRIDGE:-} port=${OVS_PORT:-} prio=${OVS_PRIORITY:-65000}
		if [ -z "$br" ] || [ -z "$port" ]; then
			echo "R2CC_FAULT_METHOD=ovs needs OVS_BRIDGE and OVS_PORT (the BlueField bridge and the port of $nic whose traffic is dropped; OVS_HOST: where ovs-ofctl runs, default the node)" >&2
			return 1
		fi
		case $act in
		blackhole) echo "$SSH $oh ovs-ofctl add-flow $br 'priority=$prio,in_port=$port,actions=drop'" ;;
		down) echo "$SSH $oh ovs-ofctl mod-port $br $port down" ;;
		up) echo "$SSH $oh \"ovs-ofctl --strict del-flows $br 'priority=$prio,in_port=$port'; ovs-ofctl mod-port $br $port up\"" ;;
		esac
		;;
	iplink)
		local dev=${FAULT_DEV:-}
		[ -n "$dev" ] || dev="\$(ls /sys/class/infiniband/$nic/device/net | head -n1)"
		case $act in
		blackhole)
			echo "R2CC_FAULT_METHOD=iplink can only take the link down: use FAULT=down, or inject/ovs for a black hole" >&2
			return 1
			;;
		down | up) echo "$SSH $host \"ip link set dev $dev $act\"" ;;
		esac
		;;
	nft)
		# soft RoCE only (scn_fault_preflight): the netdev is the one rxe names as its parent
		local dev=${FAULT_DEV:-} port=${ROCE_UDP_PORT:-4791}
		[ -n "$dev" ] || dev="\$(cat ${FAULT_SYSFS:-/sys}/class/infiniband/$nic/parent)"
		case $act in
		down)
			echo "R2CC_FAULT_METHOD=nft can only drop packets (a black hole): use FAULT=blackhole, or inject/iplink/ovs to take a link down" >&2
			return 1
			;;
		blackhole) echo "$SSH $host \"nft add table netdev r2cc_drill && nft add chain netdev r2cc_drill in '{ type filter hook ingress device $dev priority 0; }' && nft add rule netdev r2cc_drill in udp dport $port drop\"" ;;
		up) echo "$SSH $host \"nft delete table netdev r2cc_drill 2>/dev/null || true\"" ;;
		esac
		;;
	ibportstate)
		local lid=${IBPORTSTATE_LID:-} pn=${IBPORTSTATE_PORT:-} ca=${IBPORTSTATE_CA:-} ih=${IBPORTSTATE_HOST:-$host}
		if [ -z "$lid" ] || [ -z "$pn" ]; then
			echo "R2CC_FAULT_METHOD=ibportstate needs IBPORTSTATE_LID and IBPORTSTATE_PORT (best: the switch port facing $nic; IBPORTSTATE_CA: the local HCA that sends the SMPs, not $nic itself)" >&2
			return 1
		fi
		local c=
		[ -n "$ca" ] && c="-C $ca "
		case $act in
		blackhole)
			echo "R2CC_FAULT_METHOD=ibportstate can only disable a port (down): use FAULT=down, or inject for a black hole" >&2
			return 1
			;;
		down) echo "$SSH $ih ibportstate ${c}$lid $pn disable" ;;
		up) echo "$SSH $ih ibportstate ${c}$lid $pn enable" ;;
		esac
		;;
	esac
}

# scn_fault_preflight NODE NIC: what must hold on the node before the method may touch
# NIC; status 1 with the reason on stderr. Only nft has a condition: a ConnectX NIC
# steers RoCE v2 to its RDMA engine in hardware, those packets never reach netfilter,
# and an nft rule would cut nothing while the drill reported the step injected. So nft
# is for soft RoCE (the kernel's rdma_rxe) only. An rxe device is recognised on the node
# by the attribute only rxe gives it, FAULT_SYSFS/class/infiniband/NIC/parent (its
# netdev), with node_type 1 (a CA: siw, the soft iWARP device, is an RNIC) and an
# Ethernet link layer. FAULT_SYSFS (default /sys) lets the tests point at a fake tree.
scn_fault_preflight() {
	local node=$1 nic=$2 host out
	[ "$R2CC_FAULT_METHOD" = nft ] || return 0
	host=$(scn_node_host "$node") || {
		echo "node $node has no host: set FAULT_HOSTS or add it to HOSTFILE" >&2
		return 1
	}
	local d="${FAULT_SYSFS:-/sys}/class/infiniband/$nic"
	local probe="d=$d; if [ ! -d \$d ]; then echo missing; elif [ -r \$d/parent ]; then echo rxe \$(cut -c1 \$d/node_type 2>/dev/null) \$(cat \$d/ports/1/link_layer 2>/dev/null) \$(cat \$d/parent); else echo other \$(basename \$(readlink -f \$d/device/driver 2>/dev/null) 2>/dev/null); fi"
	local st=0
	# shellcheck disable=SC2086 # SSH is a command with its options
	out=$($SSH "$host" "$probe" 2>&1) || st=$?
	out=$(printf '%s' "$out" | tr '\n' ' ')
	if [ $st != 0 ]; then
		if scn_dry; then
			echo "# note (dry run): could not check that $nic of $host is a soft RoCE device ('$SSH' status $st${out:+: $out})"
			return 0
		fi
		echo "R2CC_FAULT_METHOD=nft: cannot check that $nic of $host is a soft RoCE (rdma_rxe) device ('$SSH' status $st${out:+: $out}); nft cuts nothing on any other NIC, so it does not start" >&2
		return 1
	fi
	local inject="Use R2CC_FAULT_METHOD=inject (libr2cc.so cuts the NIC inside the job, no root needed)"
	# shellcheck disable=SC2086 # the probe's words
	set -- $out
	case ${1:-} in
	rxe)
		[ "${2:-}" = 1 ] && [ "${3:-}" = Ethernet ] && return 0
		echo "R2CC_FAULT_METHOD=nft cannot cut node$node/$nic: it has rdma_rxe's 'parent' attribute but node type ${2:-?} and link layer ${3:-?}, not a RoCE CA. $inject" >&2
		;;
	missing)
		echo "R2CC_FAULT_METHOD=nft cannot cut node$node/$nic: $host has no RDMA device $nic under ${FAULT_SYSFS:-/sys}/class/infiniband. $inject" >&2
		;;
	*)
		echo "R2CC_FAULT_METHOD=nft cannot cut node$node/$nic: it is not a soft RoCE (rdma_rxe) device on $host (driver ${2:-unknown}), and hardware RoCE bypasses netfilter: a ConnectX NIC steers RoCE v2 packets to its RDMA engine, they never reach the host's nft rules, and the rule would cut nothing. $inject" >&2
		;;
	esac
	return 1
}

# scn_drill_value ORIGIN < PLAN: the value of R2CC_DRILL for a normalised plan (results.py
# plan's "MS NODE NIC KIND ARG" lines, in time order, so the library's step K is the
# plan's step K). ORIGIN work: times from each process's first NCCL collective (the
# library's default); launch: ":init", from the end of its first communicator's init.
scn_drill_value() {
	local origin=$1 ms node nic kind arg v='' sfx=''
	[ "$origin" = launch ] && sfx=:init
	while read -r ms node nic kind arg; do
		[ -n "$ms" ] || continue
		[ "$arg" = - ] && arg=
		v+="${v:+;}node$node/$nic=$kind${arg:+:$arg}@${ms}ms$sfx"
	done
	printf '%s\n' "$v"
}

# scn_fault NODE NIC ACTION [ARG]: applies it now (prints the command; nothing in a dry run)
scn_fault() {
	local cmd
	cmd=$(scn_fault_cmd "$@") || return 2
	echo "fault: $cmd"
	scn_dry && return 0
	bash -c "$cmd"
}

# restore_nic: brings FAILED_NIC of FAILED_NODE back (first thing every scenario does,
# so that a killed run never leaves the next one degraded). Never fails the script.
restore_nic() {
	local cmd f
	case $R2CC_FAULT_METHOD in
	inject)
		echo "restore: nothing to restore: with R2CC_FAULT_METHOD=inject the fault lives in the job's processes (R2CC_DRILL), and each job starts with every NIC up"
		;;
	soft)
		# Every run starts its own fabric (r2cc-scn-*); one left behind by a killed run
		# gets the NIC back and is removed (check_idle ran first: nothing uses it).
		local found=0
		for f in /dev/shm/"${SCN_FABRIC_PREFIX:-r2cc-scn}"-*; do
			[ -e "$f" ] || continue
			found=1
			SCN_FABRIC=${f#/dev/shm/}
			cmd=$(scn_fault_cmd "$FAILED_NODE" "$FAILED_NIC" up)
			echo "restore: $cmd; softverbs-ctl --fabric $SCN_FABRIC reset"
			scn_dry && continue
			bash -c "$cmd" >/dev/null 2>&1
			"$SOFTVERBS_CTL" --fabric "$SCN_FABRIC" reset >/dev/null 2>&1
		done
		SCN_FABRIC=
		[ $found = 1 ] || echo "restore: no soft fabric left from an earlier run (each run starts a fresh one, all NICs up)"
		;;
	*)
		if ! cmd=$(scn_fault_preflight "$FAILED_NODE" "$FAILED_NIC" 2>&1); then
			echo "restore: skipped: $cmd"
			return 0
		fi
		[ -n "$cmd" ] && echo "$cmd"
		if ! cmd=$(scn_fault_cmd "$FAILED_NODE" "$FAILED_NIC" up 2>&1); then
			echo "restore: cannot build the command: $cmd"
			return 0
		fi
		echo "restore: $cmd"
		scn_dry || bash -c "$cmd" || echo "restore: the command failed (status $?); check node$FAILED_NODE/$FAILED_NIC by hand"
		;;
	esac
	return 0
}

# --------------------------------------------------------------- check_idle ---

# check_idle: refuse to start while another scenario or drill runs: a lock file
# (R2CC_SCENARIO_LOCK; held with flock for the life of this shell, so a killed run
# releases it) and any running benchmark process (IDLE_PROCS) on this host and, for
# the cluster target, on every host of HOSTFILE.
check_idle() {
	local lock=${R2CC_SCENARIO_LOCK:-${TMPDIR:-/tmp}/r2cc-scenarios.lock} holder busy
	exec {SCN_LOCK_FD}>>"$lock" || scn_die "cannot open the lock file $lock"
	export SCN_LOCK_FD
	if ! flock -n "$SCN_LOCK_FD"; then
		holder=$(cat "$lock" 2>/dev/null)
		echo "check_idle: another scenario or drill is running (lock $lock held by: ${holder:-unknown}); refusing to start" >&2
		return 1
	fi
	: >"$lock"
	echo "pid $$ ${SCN_NAME:-$0} since $(date '+%F %T')" >>"$lock"
	busy=$(ps -eo pid=,comm= | awk -v names="$IDLE_PROCS" -v me=$$ '
		BEGIN { n = split(names, a, " "); for (i = 1; i <= n; i++) want[a[i]] = 1 }
		($2 in want) && $1 != me { printf "%s%s (pid %s)", sep, $2, $1; sep = ", " }')
	if [ -n "$busy" ]; then
		echo "check_idle: benchmark processes are running on this host: $busy; refusing to start" >&2
		return 1
	fi
	if [ "$R2CC_TARGET" = cluster ] && [ "${CHECK_REMOTE:-1}" = 1 ]; then
		local h
		for h in $(scn_hosts); do
			if scn_dry; then
				echo "check_idle: $SSH $h ps -eo pid=,comm= (looking for: $IDLE_PROCS)"
				continue
			fi
			local procs
			# shellcheck disable=SC2086 # SSH is a command with its options
			if ! procs=$($SSH "$h" ps -eo pid=,comm= 2>/dev/null); then
				echo "check_idle: cannot list the processes of $h with '$SSH' (CHECK_REMOTE=0 skips this); refusing to start" >&2
				return 1
			fi
			busy=$(awk -v names="$IDLE_PROCS" '
				BEGIN { n = split(names, a, " "); for (i = 1; i <= n; i++) want[a[i]] = 1 }
				($2 in want) { printf "%s%s (pid %s)", sep, $2, $1; sep = ", " }' <<<"$procs")
			if [ -n "$busy" ]; then
				echo "check_idle: benchmark processes are running on $h: $busy; refusing to start" >&2
				return 1
			fi
		done
	fi
	return 0
}

# ------------------------------------------------------------------ logging ---

# scn_save_log NN.name: with SAVE_LOG=1, everything printed from here on also goes to
# LOG_DIR/NN.name.log (default logs/local, git-ignored). Refuses a LOG_DIR inside logs/
# other than logs/local: logs/ holds the reference runs.
scn_save_log() {
	[ "${SAVE_LOG:-0}" = 1 ] || return 0
	local dir=${LOG_DIR:-$SCN_ROOT/logs/local} abs refs
	abs=$(realpath -m "$dir")
	refs=$(realpath -m "$SCN_ROOT/logs")
	case $abs/ in
	"$refs"/local/*) ;;
	"$refs"/*) scn_die "LOG_DIR=$dir is inside logs/, which holds the reference runs: use logs/local (default) or a directory outside logs/" ;;
	esac
	mkdir -p "$abs" || scn_die "cannot create LOG_DIR=$dir"
	SCN_LOG=$abs/$1.log
	if git -C "$SCN_ROOT" ls-files --error-unmatch "$SCN_LOG" >/dev/null 2>&1; then
		scn_die "$SCN_LOG is a committed file; refusing to overwrite it"
	fi
	exec {SCN_OUT_FD}>&1 {SCN_ERR_FD}>&2
	exec > >(tee "$SCN_LOG") 2>&1
	SCN_TEE_PID=$!
}

# Called at exit: restores the terminal and waits until the saved log is complete.
scn_close_log() {
	[ -n "${SCN_TEE_PID:-}" ] || return 0
	echo "saved: $SCN_LOG"
	exec 1>&"$SCN_OUT_FD" 2>&"$SCN_ERR_FD"
	wait "$SCN_TEE_PID" 2>/dev/null
	SCN_TEE_PID=
}

# ------------------------------------------------------------- script frame ---

# scn_begin NN NAME: settings checked, log saving, temp dir, exit trap, check_idle,
# restore_nic. After it: SCN_TMP (removed at exit unless KEEP=1).
scn_begin() {
	SCN_NUM=$1 SCN_NAME=$2
	scn_check_settings
	scn_save_log "$SCN_NUM.$SCN_NAME"
	SCN_TMP=$(mktemp -d "${TMPDIR:-/tmp}/r2cc-$SCN_NAME.XXXXXX")
	trap 'scn_at_exit' EXIT
	trap 'exit 130' INT TERM
	# check_idle before restore_nic: restoring a NIC while another run uses it would
	# undo that run's fault
	check_idle || exit 3
	restore_nic
}

scn_at_exit() {
	local rc=$?
	[ "${KEEP:-0}" = 1 ] && echo "kept: $SCN_TMP" || rm -rf "$SCN_TMP"
	scn_close_log
	exit "$rc"
}

scn_rule() { printf '%s\n' "=========================================================================="; }

# scn_header TITLE WHAT...: what the scenario shows and the settings it runs with
scn_header() {
	local title=$1
	shift
	scn_rule
	echo " $SCN_NUM.$SCN_NAME - $title"
	scn_rule
	local l
	for l in "$@"; do echo " $l"; done
	echo
	echo " date:   $(date '+%F %T %Z') on $(hostname)"
	if [ "$R2CC_TARGET" = soft ]; then
		echo " target: soft - one host, $NODES emulated nodes x $GPUS_PER_NODE GPUs (NCCL_HOSTID node0..), software RDMA"
		echo "         fabric, NICs $SOFT_NICS per node at $SOFT_GBPS Gb/s each (SOFTVERBS_SHAPING=${SOFTVERBS_SHAPING:-1})"
	else
		echo " target: cluster - $MPIRUN -np $NP over HOSTFILE=$HOSTFILE ($(scn_hosts | paste -sd' ')), NICs $R2CC_NICS"
	fi
	echo " fault:  R2CC_FAULT_METHOD=$R2CC_FAULT_METHOD${SCN_METHOD_WHY:+ ($SCN_METHOD_WHY)}, failed NIC node$FAILED_NODE/$FAILED_NIC"
	if [ -n "${NCCL_TESTS_DIR:-}" ]; then
		echo " bins:   NVIDIA nccl-tests in $NCCL_TESTS_DIR"
	else
		echo " bins:   $SCN_BIN (r2cc-perf, verifying)"
	fi
	echo " R2CC:   $R2CC_LIB$( [ -e "$R2CC_LIB" ] || echo ' (MISSING: run make)')"
	scn_dry && echo " DRY_RUN=1: commands are printed, nothing runs"
	echo
}

# scn_verdict_line PASS|FAIL TEXT...: the last lines of a scenario
scn_verdict() {
	local v=$1
	shift
	echo
	scn_rule
	echo " verdict: $SCN_NUM.$SCN_NAME"
	local l
	for l in "$@"; do echo "   $l"; done
	echo " $v"
	scn_rule
}

# --------------------------------------------------------------- nccl-tests ---

# scn_r2cc_env MODE DECLARED: the R2CC variables of a run (LD_PRELOAD included):
# MODE is R2CC_MODE, DECLARED 1 declares FAILED_NIC of FAILED_NODE failed.
scn_r2cc_env() {
	local mode=$1 declared=$2 v
	local e="LD_PRELOAD=$R2CC_LIB R2CC_MODE=$mode"
	[ "$declared" = 1 ] && e+=" R2CC_FAILED_NODE=$FAILED_NODE R2CC_FAILED_HCA=$FAILED_NIC"
	for v in R2CC_AR_STAGE2_CHUNKS R2CC_AR_SCHEDULE R2CC_AR_MIN_BYTES R2CC_AR_AFTER_REPAIR R2CC_DEBUG R2CC_STALL_MS R2CC_REPORT; do
		[ -n "${!v:-}" ] && e+=" $v=${!v}"
	done
	echo "$e"
}

# scn_nccl_test LABEL MODE DECLARED ARGS...: one nccl-tests run (NCCL_TEST_BIN, default
# all_reduce_perf) for the scenario LABEL; its output is kept in SCN_TMP/LABEL.out.
# With r2cc-perf, --nic-table is added so the verdict can say whether the declared NIC
# still carried traffic. Returns the program's exit status.
scn_nccl_test() {
	local label=$1 mode=$2 declared=$3
	shift 3
	local prog
	prog=$(scn_bin "${NCCL_TEST_BIN:-all_reduce_perf}")
	[ -x "$prog" ] || scn_missing "$prog does not exist (make, or NCCL_TESTS_DIR)"
	local extra=()
	scn_is_r2cc_perf "$prog" && [ "${NIC_TABLE:-1}" = 1 ] && extra=(--nic-table="$FAILED_NODE")
	scn_env_setup "$SCN_NUM-$label"
	scn_build_cmd "$(scn_r2cc_env "$mode" "$declared")" -- "$prog" "$@" "${extra[@]}"
	echo "----- $label: R2CC_MODE=$mode$([ "$declared" = 1 ] && echo ", node$FAILED_NODE/$FAILED_NIC declared failed")"
	scn_print_launch
	echo
	local rc=0
	scn_exec "$SCN_TMP/$label.out" || rc=$?
	[ "$R2CC_TARGET" = soft ] && ! scn_dry && scn_fabric_reset
	return "$rc"
}

# scn_check LABEL RC: the verdict lines of one nccl-tests run (results.py check);
# status 0 when every #wrong is 0 and the run completed
scn_check() {
	local label=$1 rc=$2
	if scn_dry; then
		echo "$label: (dry run: nothing ran)"
		return 0
	fi
	local req=()
	[ "${REQUIRE_PLACEMENT:-0}" = 1 ] && req=(--require-placement)
	"$SCN_PY" -I -S "$SCN_RESULTS" check --label "$label" --status "$rc" "${req[@]}" --declared-nic \
		"$([ "${3:-0}" = 1 ] && echo "$FAILED_NIC")" "$SCN_TMP/$label.out"
}

# scn_sweep_main NN NAME TITLE WHAT LABEL MODE DECLARED ARGS...: the body of 04-06
scn_sweep_main() {
	local num=$1 name=$2 title=$3 what=$4 label=$5 mode=$6 declared=$7
	shift 7
	scn_begin "$num" "$name"
	local -a args=(-b 8 -e "${MAX_BYTES:-4G}" -f 2 -g 1 -c 1 -n 5 -w 2 -d float -o sum "$@")
	scn_header "$title" "$what" "nccl-tests args: ${args[*]}"
	local rc=0 out
	scn_nccl_test "$label" "$mode" "$declared" "${args[@]}" || rc=$?
	out=$(scn_check "$label" "$rc" "$declared")
	local st=$?
	local -a lines
	mapfile -t lines <<<"$out"
	if scn_dry; then
		scn_verdict "DRY RUN (nothing ran)" "${lines[@]}"
	elif [ $st -eq 0 ]; then
		scn_verdict PASS "${lines[@]}"
	else
		scn_verdict FAIL "${lines[@]}"
	fi
	return $st
}

# scn_help SCRIPT ARGS...: with -h or --help among ARGS, prints the script's opening
# comment (the lines after the shebang that start with '#') and exits 0
scn_help() {
	local script=$1 a
	shift
	for a in "$@"; do
		case $a in
		-h | --help)
			awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$script"
			exit 0
			;;
		esac
	done
}

# scn_hot_repair_main NN NAME AFTER TITLE [DRILL OPTIONS...]: the body of 01 and 02 -
# scripts/drill with the seed's fault (FAULT at FAULT_AT on node FAILED_NODE's FAILED_NIC)
scn_hot_repair_main() {
	local num=$1 name=$2 after=$3 title=$4
	shift 4
	scn_begin "$num" "$name"
	local fault=${FAULT:-blackhole} at=${FAULT_AT:-4s} size=${SIZE:-4G} iters=${ITERS:-10}
	local mode=${R2CC_MODE:-2} strategy=R2CC-Balance
	[ "$after" = 3 ] && strategy=R2CC-AllReduce
	scn_header "$title" \
		"what it shows: $iters AllReduces of $size (float/sum), each verified and timed; $fault of" \
		"  node$FAILED_NODE/$FAILED_NIC at $at into the run; R2CC must detect it, move the in-flight" \
		"  transfers to healthy NICs, finish that AllReduce correctly and run $strategy after" \
		"  (R2CC_AR_AFTER_REPAIR=$after). The NIC table shows the bytes each of node$FAILED_NODE's NICs" \
		"  moved per iteration: $FAILED_NIC should drop to 0 after the failure." \
		"settings: R2CC_MODE=$mode R2CC_AR_AFTER_REPAIR=$after FAULT=$fault FAULT_AT=$at SIZE=$size ITERS=$iters${RESTORE_AT:+ RESTORE_AT=$RESTORE_AT R2CC_FAILBACK_MS=${R2CC_FAILBACK_MS:-10000}}" \
		"without hot repair (README 'Where it stands' says whether this build has it) the job" \
		"  dies at the fault, as with plain NCCL, and this script says FAIL."
	[ -n "${NCCL_TESTS_DIR:-}" ] && echo " note: the per-iteration test needs r2cc-perf's --iters-table: NCCL_TESTS_DIR is not used here"
	local rc=0
	# RESTORE_AT: the NIC comes back then (R2CC_FAILBACK_MS later its QPs return)
	local -a restore=()
	[ -n "${RESTORE_AT:-}" ] && restore=(--fault "node$FAILED_NODE/$FAILED_NIC=up@$RESTORE_AT")
	SAVE_LOG=0 DRILL_NAME=$name "$SCN_ROOT/scripts/drill" --no-idle-check --summary "$SCN_TMP/summary" \
		--fault "node$FAILED_NODE/$FAILED_NIC=$fault@$at" "${restore[@]}" --size "$size" --iters "$iters" \
		--mode "$mode" --after-repair "$after" "$@" || rc=$?
	local -a why=()
	[ -s "$SCN_TMP/summary" ] && mapfile -t why <"$SCN_TMP/summary"
	if scn_dry && [ "$rc" = 0 ]; then
		scn_verdict "DRY RUN (nothing ran)"
		return 0
	fi
	case $rc in
	0) scn_verdict PASS "${why[@]}" "$fault of node$FAILED_NODE/$FAILED_NIC repaired; every AllReduce completed and verified" ;;
	2 | 3) scn_verdict FAIL "the drill could not run (status $rc: set-up error or another run in progress)" ;;
	*) scn_verdict FAIL "${why[@]}" ;;
	esac
	[ "$rc" = 0 ]
}
