# Sourced by the tests that start TCP servers on this host (rdma-core's pingpongs,
# perftest, the perf launcher): other tests, and the short-lived connections of any
# process here, may hold the port a test picks, so a server is started on a port that
# nothing listens on, and again on the next one when it still could not listen.

# Whether something listens on TCP port $1 of this host.
port_listens() {
	grep -qE "^ *[0-9]+: [0-9A-F]+:$(printf '%04X' "$1") [0-9A-F]+:0000 0A" /proc/net/tcp \
		/proc/net/tcp6 2>/dev/null
}

# Waits until the server (pid $2) listens on TCP port $1; fails if it exits first.
listening() {
	for _ in $(seq 1 400); do
		port_listens "$1" && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

# The first port from $1 on that nothing listens on.
free_port() {
	local p=$1
	while port_listens "$p"; do p=$((p + 1)); done
	echo "$p"
}
