#!/usr/bin/env bash
# Debian's real Prometheus scraping `r2cc exporter` through a drill: the
# exporter (unprivileged where the test runs as root) on one loopback port,
# prometheus on another with a private TSDB, scraping every second; a drill
# job (r2cc-verbs-drill under the preload, R2CC_DRILL blackholing node1's
# mlx5_1 1 s after its collective) runs for 20-50 s and ends. Then, through
# Prometheus' HTTP API, over the job's lifetime (its processes are gone by
# then; the samples stay in the TSDB):
#   * r2cc_repairs_total of the job's processes rose, per drill label, by the
#     number of repairs in their R2CC reports (incidents that are neither
#     declared nor failbacks);
#   * promtool check metrics has nothing to say about a scrape with the job;
#   * rate(r2cc_nic_tx_bytes_total[4s]) of the drilled NIC in the drilled
#     process was above 0 before the cut and 0 from the repair (plus the
#     window) to the end, while the process's other NICs carried on.
#   tests/ops/prometheus.sh BUILD [OUTDIR]   (OUTDIR: keep the API's answers)
set -u
B=${1:-build}
OUT=${2:-}
fail() { echo "FAIL: $*"; exit 1; }
command -v prometheus >/dev/null ||
	fail "no prometheus binary (apt-get install prometheus; it need not run as a service)"
tmp=$(mktemp -d)
chmod 755 "$tmp"
bg=()
cleanup() {
	for p in "${bg[@]+"${bg[@]}"}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
AS_USER=()
if [ "$(id -u)" -eq 0 ] && id nobody >/dev/null 2>&1; then
	AS_USER=(setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups)
fi
cp "$B/bin/r2cc" "$tmp/r2cc"

"${AS_USER[@]+"${AS_USER[@]}"}" "$tmp/r2cc" exporter --listen 127.0.0.1:0 2>"$tmp/exporter.log" &
bg+=($!)
for _ in $(seq 50); do
	grep -q 'serving http' "$tmp/exporter.log" && break
	sleep 0.1
done
exp=$(sed -n 's|^r2cc exporter: serving http://\([^/]*\)/metrics$|\1|p' "$tmp/exporter.log")
[ -n "$exp" ] || fail "the exporter did not start: $(cat "$tmp/exporter.log")"

get() {
	python3 -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1" 2>/dev/null
}
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
cat >"$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: r2cc
    static_configs:
      - targets: ['$exp']
EOF
prom=
for _ in 1 2 3; do
	port=$(free_port)
	prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
		--web.listen-address="127.0.0.1:$port" --log.level=warn >"$tmp/prometheus.log" 2>&1 &
	pp=$!
	bg+=("$pp")
	for _ in $(seq 100); do
		get "http://127.0.0.1:$port/-/ready" >/dev/null && { prom=127.0.0.1:$port; break 2; }
		kill -0 "$pp" 2>/dev/null || break
		sleep 0.1
	done
	kill "$pp" 2>/dev/null
done
[ -n "$prom" ] || fail "prometheus did not start: $(tail -5 "$tmp/prometheus.log")"
# Until Prometheus has scraped the exporter.
for _ in $(seq 100); do
	get "http://$prom/api/v1/query?query=up%7Bjob%3D%22r2cc%22%7D" | grep -q '"value":\[[0-9.]*,"1"\]' &&
		break
	sleep 0.2
done
who=$(id -un)
[ ${#AS_USER[@]} -eq 0 ] || who=nobody
echo "exporter on $exp (as $who), prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}') on $prom"

t0=$(date +%s.%N)
sleep 2 # a few scrapes before the job
TMPDIR=$tmp "$B"/bin/r2cc-verbs-drill --fault none --drill-plan 'node1/mlx5_1=blackhole@1s' \
	--nccl-stub --time-scale 1 --messages 30000 --seeds 1 --timeout 180 --keep >"$tmp/drill.out" 2>&1 &
drill=$!
bg+=("$drill")
# Prometheus' own linter on a scrape with the job in it.
for _ in $(seq 100); do
	get "http://$exp/metrics" >"$tmp/scrape"
	pids=$(pgrep -P "$drill" | paste -sd'|')
	[ -n "$pids" ] && [ "$(grep -cE "^r2cc_nic_up\{.*pid=\"($pids)\"" "$tmp/scrape")" -ge 6 ] && break
	sleep 0.2
done
lint=$(promtool check metrics <"$tmp/scrape" 2>&1) || fail "promtool check metrics: $lint"
echo "promtool check metrics: $(grep -c '^r2cc_' "$tmp/scrape") samples, ${lint:-no complaint}"
wait "$drill"
rc=$?
cat "$tmp/drill.out"
[ $rc -eq 0 ] || fail "the drill failed (exit $rc)"
sleep 3 # the last scrapes
t1=$(date +%s.%N)

python3 - "$prom" "$t0" "$t1" "$tmp" "$OUT" <<'PY'
import glob, json, os, sys, urllib.parse, urllib.request

prom, t0, t1, tmp, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def api(path, keep=None, **params):
    url = "http://%s/api/v1/%s?%s" % (prom, path, urllib.parse.urlencode(params))
    ans = json.load(urllib.request.urlopen(url, timeout=30))
    if ans.get("status") != "success":
        fail("%s: %s" % (url, ans))
    if out and keep:
        with open(os.path.join(out, keep + ".json"), "w") as f:
            json.dump({"query": params, "answer": ans}, f, indent=1)
    return ans["data"]["result"]


reports = [json.load(open(p)) for p in sorted(glob.glob(tmp + "/r2cc-drill.*/s*/r2cc-report.*.json"))]
if len(reports) != 2:
    fail("expected 2 R2CC reports, found %d" % len(reports))
pids = "|".join(str(r["pid"]) for r in reports)
want = {"0": 0, "1": 0}
for r in reports:
    for i in r.get("incidents", []):
        if not i.get("declared") and not i.get("failback"):
            want["1" if i.get("drill") else "0"] += 1
cut = next(r for r in reports if r["node"] == "node1")
step = cut["drill"]["steps"][0]
if step["state"] != "applied" or step["nic"] != "mlx5_1":
    fail("the drill's step: %s" % step)
t_cut = step["applied_unix"]
mine = [i for i in cut["incidents"] if not i.get("declared") and not i.get("failback")]
if not mine:
    fail("no repair in the drilled process's report")
t_rep = max(i["done_unix"] for i in mine)
print("reports: pids %s, repairs drill=1: %d, drill=0: %d; cut at +%.1f s, repaired at +%.1f s"
      % (pids, want["1"], want["0"], t_cut - t0, t_rep - t0))

# Before the job: what Prometheus had of its processes (nothing) and of the node's.
before = api("query", "before", query='r2cc_repairs_total{pid=~"%s"}' % pids, time="%.3f" % (t0 + 1))
node_before = api("query", "before_node", query="sum by (drill) (r2cc_repairs_total)",
                  time="%.3f" % (t0 + 1))
if before:
    fail("series of the job before it ran: %s" % before)
# The job's counters just before the cut and once repaired, while it ran.
sel = 'r2cc_repairs_total{pid=~"%s"}' % pids
show = lambda res: " ".join("%s/drill=%s:%s" % (s["metric"]["node"], s["metric"]["drill"], s["value"][1])
                            for s in res)
pre_cut = api("query", "job_before_cut", query=sel, time="%.3f" % (t_cut - 1))
post_rep = api("query", "job_after_repair", query=sel, time="%.3f" % (t_rep + 3))
print("prometheus: %s 1 s before the cut: %s; 3 s after the repair: %s" % (sel, show(pre_cut), show(post_rep)))
if sum(float(s["value"][1]) for s in pre_cut) != 0 or len(pre_cut) != 4:
    fail("before the cut: %s" % pre_cut)
win = "%ds" % int(t1 - t0 + 5)
after = api("query", "after", query="max_over_time(%s[%s])" % (sel, win), time="%.3f" % t1)
rose = api("query", "rose",
           query="sum by (drill) (max_over_time(%s[%s]) - min_over_time(%s[%s]))" % (sel, win, sel, win),
           time="%.3f" % t1)
got = {s["metric"]["drill"]: int(float(s["value"][1])) for s in rose}
print("prometheus: r2cc_repairs_total of the job rose by", got, "reports:", want)
if got != want:
    fail("the repair counter rose by %s, the reports count %s" % (got, want))

# The alert rule of docs/operations.md leaves the drill out.
rule = 'increase(r2cc_repairs_total{drill="0",pid=~"%s"}[1m]) > 0' % pids
fired = api("query", "alert_rule", query=rule, time="%.3f" % (t_rep + 3))
drill_rule = api("query", "alert_rule_drill", query=rule.replace('drill="0"', 'drill="1"'),
                 time="%.3f" % (t_rep + 3))
print("prometheus: the alert rule %s: %d series; with drill=\"1\": %d" % (rule, len(fired), len(drill_rule)))
if want["0"] == 0 and fired:
    fail("the alert rule fired on a drill: %s" % fired)
if not drill_rule:
    fail("increase() of the drill's repairs is not above 0")

q = 'rate(r2cc_nic_tx_bytes_total{pid="%d"}[4s])' % cut["pid"]
series = api("query_range", "rate", query=q, start="%.3f" % t0, end="%.3f" % t1, step="1")
by_nic = {s["metric"]["nic"]: [(float(t), float(v)) for t, v in s["values"]] for s in series}
if "mlx5_1" not in by_nic:
    fail("no rate of the drilled NIC: %s" % list(by_nic))
pre = [v for t, v in by_nic["mlx5_1"] if t < t_cut]
post = [(t, v) for t, v in by_nic["mlx5_1"] if t >= t_rep + 5]
others = [v for n, vals in by_nic.items() if n != "mlx5_1" for t, v in vals if t >= t_rep + 5]
for n, vals in sorted(by_nic.items()):
    print("  rate %s: %s" % (n, " ".join("%+.0f:%.0f" % (t - t0, v / 1e6) for t, v in vals)) + " (s:MB/s)")
if not pre or max(pre) <= 0:
    fail("the drilled NIC carried nothing before the cut: %s" % pre)
if len(post) < 3 or any(v != 0 for t, v in post):
    fail("the drilled NIC's rate after the repair: %s" % post)
if not others or max(others) <= 0:
    fail("the other NICs carried nothing after the repair")
print("prometheus: mlx5_1 of pid %d: %.0f MB/s before the cut, 0 at all %d points from repair + 5 s; "
      "the other NICs up to %.0f MB/s" % (cut["pid"], max(pre) / 1e6, len(post), max(others) / 1e6))
if out:
    json.dump({"t0": t0, "t1": t1, "t_cut": t_cut, "t_repaired": t_rep, "pids": pids,
               "repairs_in_reports": want, "node_before": node_before},
              open(os.path.join(out, "summary.json"), "w"), indent=1)
PY
[ $? -eq 0 ] || exit 1
echo "PASS: prometheus scraped the drill: the repair counter rose by the reports' repairs, the drilled NIC's rate went to 0"
