#!/usr/bin/env bash
# R2CC_ON_INCIDENT (repair/hook.c) in real processes: the verbs drill under the preload,
# NICs cut by R2CC_DRILL.
#   storm    a plan of 4 downs and 4 ups within 1.8 s (R2CC_FAILBACK_MS=50): about 7
#            incidents per process; R2CC_ON_INCIDENT_MAX=3 tells exactly 3, each a
#            different incident, and one log line counts the rest
#   webhook  scripts/on-incident/webhook.sh posts each incident to a local HTTP server
#   syslog   scripts/on-incident/syslog.sh writes one line per incident to a socket
#   hang     a command that never ends is killed after R2CC_ON_INCIDENT_TIMEOUT_MS
#   fail     a command that fails costs one log line
# Every scenario's traffic must still pass (every message exactly once).
#   tests/hook/run.sh BUILD [CASE...]
set -u
cd "$(dirname "$0")/../.." || exit 2
B=${1:-build}
shift || true
cases=${*:-storm webhook syslog hang fail}
DRILL=$B/bin/r2cc-verbs-drill
T=$(mktemp -d "${TMPDIR:-/tmp}/r2cc-hook.XXXXXX")
trap 'rm -rf "$T"; [ -n "${srv:-}" ] && kill "$srv" 2>/dev/null' EXIT
fail=0
say() { echo "hook: $*"; }

# drill LABEL [drill options...]: runs one scenario, keeps its directory in $T/LABEL.dir
drill() {
	local label=$1
	shift
	timeout 90 "$DRILL" --seeds 1 --nccl-stub --time-scale 1 --timeout 60 --keep "$@" >"$T/$label.out" 2>&1
	local rc=$?
	sed -n 's/^kept: //p' "$T/$label.out" >"$T/$label.dir"
	if [ $rc != 0 ] || ! grep -q '^PASS' "$T/$label.out"; then
		say "$label: the drill failed (status $rc):"
		tail -5 "$T/$label.out"
		fail=1
		return 1
	fi
	return 0
}

logs_of() { cat "$(cat "$T/$1.dir")"/*/worker*.log 2>/dev/null; }

for c in $cases; do
	case $c in
	storm)
		mkdir -p "$T/told"
		plan="node1/mlx5_0=down@0;node1/mlx5_0=up@250ms;node1/mlx5_1=down@500ms;node1/mlx5_1=up@750ms"
		plan="$plan;node1/mlx5_2=down@1000ms;node1/mlx5_2=up@1250ms;node1/mlx5_0=down@1500ms;node1/mlx5_0=up@1750ms"
		R2CC_FAILBACK_MS=50 R2CC_ON_INCIDENT_MAX=3 \
			R2CC_ON_INCIDENT="cat > $T/told/\$R2CC_INCIDENT_PID.\$\$.json" \
			drill storm --fault down --inject --drill-plan "$plan" --messages 12288 || continue
		python3 - "$(cat "$T/storm.dir")" "$T/told" <<'PY' || fail=1
import glob, json, os, sys
d, told = sys.argv[1], sys.argv[2]
bad = 0
for rep in sorted(glob.glob(d + "/*/r2cc-report.*.json")):
    j = json.load(open(rep))
    pid = j["pid"]
    settled = [i for i in j["incidents"] if not i["declared"] and i["migrated"] + i["failed"] >= i["qps"]]
    files = glob.glob(f"{told}/{pid}.*.json")
    keys = set()
    for f in files:
        i = json.load(open(f))
        keys.add((i["nic"], i.get("detected_ns", i.get("started_ns")), i["failback"]))
    want = min(3, len(settled))
    ok = len(files) == want and len(keys) == len(files)
    log = open(os.path.join(os.path.dirname(rep), "worker%d.log" % int(rep.rsplit(".", 2)[1]))).read() \
        if os.path.exists(os.path.join(os.path.dirname(rep), "worker%d.log" % int(rep.rsplit(".", 2)[1]))) else ""
    noted = log.count("more than 3 incidents a minute")
    if len(settled) > 3 and noted != 1:
        ok = False
    print(f"hook: storm: pid {pid}: {len(j['incidents'])} incidents, {len(settled)} settled, "
          f"{len(files)} told ({len(keys)} different), bound 3, 'more than 3' lines {noted}: "
          f"{'ok' if ok else 'WRONG'}")
    bad += not ok
sys.exit(1 if bad else 0)
PY
		;;
	webhook)
		python3 - "$T/posts" >"$T/port" 2>"$T/srv.err" <<'PY' &
import http.server, json, sys
out = open(sys.argv[1], "a")
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        j = json.loads(body)
        out.write(json.dumps({"kind": j["kind"], "drill": j["drill"], "nic": j["incident"]["nic"]}) + "\n")
        out.flush()
        self.send_response(204)
        self.end_headers()
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_port, flush=True)
s.serve_forever()
PY
		srv=$!
		for _ in $(seq 50); do [ -s "$T/port" ] && break; sleep 0.1; done
		R2CC_WEBHOOK_URL="http://127.0.0.1:$(cat "$T/port")/r2cc" \
			R2CC_ON_INCIDENT="$PWD/scripts/on-incident/webhook.sh" \
			drill webhook --fault blackhole --inject --messages 8192 || { kill $srv; srv=; continue; }
		sleep 0.5
		kill $srv
		srv=
		n=$(grep -c '"kind": "repair", "drill": 1' "$T/posts" 2>/dev/null)
		if [ "${n:-0}" -ge 2 ]; then say "webhook: $n repairs posted, each marked drill: ok"
		else say "webhook: ${n:-0} drill repairs posted, want one per process (2): WRONG"; cat "$T/posts" "$T/srv.err" 2>/dev/null; fail=1; fi
		;;
	syslog)
		python3 - "$T/log.sock" "$T/syslog" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
out = open(sys.argv[2], "a")
while True:
    out.write(s.recv(65536).decode(errors="replace") + "\n")
    out.flush()
PY
		srv=$!
		for _ in $(seq 50); do [ -S "$T/log.sock" ] && break; sleep 0.1; done
		R2CC_SYSLOG_SOCKET=$T/log.sock R2CC_ON_INCIDENT="$PWD/scripts/on-incident/syslog.sh" \
			drill syslog --fault down --inject --messages 8192 || { kill $srv; srv=; continue; }
		sleep 0.5
		kill $srv
		srv=
		n=$(grep -c 'r2cc.*repair (drill) on .* queue pairs moved' "$T/syslog" 2>/dev/null)
		if [ "${n:-0}" -ge 2 ]; then say "syslog: $n lines: ok"; sed -n 1p "$T/syslog" | cut -c1-200
		else say "syslog: ${n:-0} lines, want 2: WRONG"; cat "$T/syslog" 2>/dev/null; fail=1; fi
		;;
	hang | fail)
		cmd='sleep 30' want='ran longer than 300 ms and was killed'
		[ $c = fail ] && cmd='cat >/dev/null; exit 3' want='exited with status 3'
		R2CC_ON_INCIDENT_TIMEOUT_MS=300 R2CC_ON_INCIDENT="$cmd" \
			drill $c --fault down --inject --messages 8192 || continue
		n=$(logs_of $c | grep -c "R2CC_ON_INCIDENT: the command $want")
		others=$(logs_of $c | grep "R2CC_ON_INCIDENT" | grep -vc "$want")
		if [ "$n" -ge 2 ] && [ "$others" = 0 ]; then say "$c: '$want' once per incident ($n), nothing else: ok"
		else say "$c: $n lines '$want', $others other R2CC_ON_INCIDENT lines: WRONG"; logs_of $c | grep R2CC_ON_INCIDENT; fail=1; fi
		;;
	*) say "unknown case $c"; exit 2 ;;
	esac
done
[ $fail = 0 ] && echo "PASS hook" || echo "FAIL hook"
exit $fail
