#!/usr/bin/env bash
# cli_ledger.sh — the ledger commands end to end, with real processes on one ledger of this test's own:
#   gpupool budget (set, list), gpupool top --once (table and --json, checked against the worker that
#   holds memory), gpupool exporter (its /metrics checked by `promtool check metrics`, a 404 elsewhere),
#   a real Prometheus server on the loopback address scraping the exporter and answering a query with
#   the worker's figure, and gpupool replay --processes (two replicas of one model sharing one
#   GPU-wide max: refusals, and the GPU-wide peak at most the max).
# Usage: cli_ledger.sh GPUPOOL LEDGER_WORKER TRACE_A TRACE_B. Exit 0 = passed, 77 = skipped (promtool
# missing: apt-get install prometheus), else failed. The Prometheus server part is skipped, with a
# message, when the prometheus binary is missing or GPUPOOL_SKIP_PROMETHEUS_SERVER=1.
set -uo pipefail
gpupool="$1" worker="$2" trace_a="$3" trace_b="$4"
if ! command -v promtool >/dev/null 2>&1; then
    echo "SKIP: promtool not found (apt-get install prometheus; tools/deps.sh installs it)"
    exit 77
fi
tmp="$(mktemp -d)"
ledger="t-cli-$$"
pids=()
cleanup() {
    exec 3>&- 2>/dev/null
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    "$gpupool" ledger --ledger "$ledger" --remove >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
failures=0
fail() { echo "FAILED: $*" >&2; failures=$((failures + 1)); }

# A process holding 64 MiB of tenant "model" (80 MiB of 20 MiB segments) until its stdin closes.
mkfifo "$tmp/in"
"$worker" "$ledger" sim hold model 67108864 <"$tmp/in" >"$tmp/worker.out" &
wpid=$!
pids+=("$wpid")
exec 3>"$tmp/in"
for _ in $(seq 100); do grep -q held "$tmp/worker.out" && break; sleep 0.1; done
grep -q "held 67108864 rc 0" "$tmp/worker.out" || fail "worker: $(cat "$tmp/worker.out")"

# budget
"$gpupool" budget --ledger "$ledger" model max=128MiB min=16MiB >"$tmp/budget.out" 2>&1 || fail "budget: $(cat "$tmp/budget.out")"
grep -Eq "^model +128.0 MiB +- +16.0 MiB +80.0 MiB" "$tmp/budget.out" || fail "budget list: $(cat "$tmp/budget.out")"
"$gpupool" budget --ledger "$ledger" model max=8MiB min=16MiB >"$tmp/bad.out" 2>&1 && fail "min above max was accepted"
grep -q "must not be above max" "$tmp/bad.out" || fail "bad budget message: $(cat "$tmp/bad.out")"

# top
"$gpupool" top --ledger "$ledger" --once >"$tmp/top.out" || fail "top --once"
grep -Eq "^$wpid +ledger_worker" "$tmp/top.out" || fail "top does not show the worker $wpid: $(cat "$tmp/top.out")"
"$gpupool" top --ledger "$ledger" --once --json >"$tmp/top.json" || fail "top --once --json"
python3 - "$tmp/top.json" "$wpid" <<'EOF' || fail "top --json content"
import json, sys
v = json.load(open(sys.argv[1]))
procs = [p for p in v["processes"] if p["pid"] == int(sys.argv[2])]
assert len(procs) == 1, v["processes"]
model = [t for t in procs[0]["tenants"] if t["name"] == "model"][0]
assert model["held_bytes"] == 80 << 20 and model["live_bytes"] == 64 << 20, model
budget = [t for t in v["tenants"] if t["name"] == "model"][0]
assert budget["max_bytes"] == 128 << 20 and budget["min_bytes"] == 16 << 20, budget
EOF

# exporter + promtool
"$gpupool" exporter --ledger "$ledger" --listen 127.0.0.1:0 --port-file "$tmp/port" 2>"$tmp/exporter.err" 3>&- &
pids+=($!)
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port="$(cat "$tmp/port" 2>/dev/null)"
[ -n "$port" ] || fail "exporter did not start: $(cat "$tmp/exporter.err")"
curl -sf "http://127.0.0.1:$port/metrics" >"$tmp/metrics.txt" || fail "scrape failed"
if ! promtool check metrics <"$tmp/metrics.txt" >"$tmp/promtool.out" 2>&1; then
    fail "promtool check metrics: $(cat "$tmp/promtool.out")"
fi
grep -Eq "^gpupool_process_tenant_held_bytes\{device=\"$ledger\",pid=\"$wpid\",pool=\"[0-9]+\",tenant=\"model\"\} 83886080$" \
    "$tmp/metrics.txt" || fail "no held figure for the worker in /metrics"
grep -q '^# TYPE gpupool_process_tenant_refusals_total counter$' "$tmp/metrics.txt" || fail "no counter TYPE line"
code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/nothing")"
[ "$code" = 404 ] || fail "GET /nothing answered $code"
echo "exporter: $(wc -l <"$tmp/metrics.txt") lines, promtool check metrics: passed"

# A real Prometheus server scraping the exporter.
if [ "${GPUPOOL_SKIP_PROMETHEUS_SERVER:-0}" = 1 ] || ! command -v prometheus >/dev/null 2>&1; then
    echo "SKIP (stated): no Prometheus server run (prometheus missing or GPUPOOL_SKIP_PROMETHEUS_SERVER=1); promtool alone checked the format"
else
    pport="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    cat >"$tmp/prometheus.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: gpupool
    static_configs: [{targets: ["127.0.0.1:$port"]}]
EOF
    prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
        --web.listen-address="127.0.0.1:$pport" >"$tmp/prometheus.log" 2>&1 3>&- &
    pids+=($!)
    got=""
    for _ in $(seq 60); do
        got="$(curl -sf "http://127.0.0.1:$pport/api/v1/query" \
            --data-urlencode "query=gpupool_process_tenant_held_bytes{tenant=\"model\",pid=\"$wpid\"}" 2>/dev/null |
            python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null)"
        [ -n "$got" ] && break
        sleep 0.5
    done
    if [ "$got" = 83886080 ]; then
        up="$(curl -sf "http://127.0.0.1:$pport/api/v1/query" --data-urlencode 'query=up{job="gpupool"}' |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["result"][0]["value"][1])')"
        echo "prometheus: scraped the exporter (up=$up), gpupool_process_tenant_held_bytes = $got"
    else
        fail "Prometheus did not scrape the worker's figure (got '$got'): $(tail -5 "$tmp/prometheus.log")"
    fi
fi
exec 3>&-
wait "$wpid" || fail "worker exited $?"

# replay --processes: two replicas of "big" share one GPU-wide max of 2 MiB.
"$gpupool" replay --processes --json --device-memory 1GiB --model "big=$trace_a:max=2MiB" --model "big=$trace_b" \
    >"$tmp/replay.json" 2>"$tmp/replay.err" || fail "replay --processes: $(cat "$tmp/replay.err")"
python3 - "$tmp/replay.json" <<'EOF' || fail "replay --processes: $(cat "$tmp/replay.json")"
import json, sys
v = json.load(open(sys.argv[1]))
assert len(v["processes"]) == 2 and len({p["pid"] for p in v["processes"]}) == 2, v
# 8 MiB of live demand against 2 MiB: refusals (a process that waited for the other to finish may have
# none of its own), and the GPU-wide peak never above the max.
assert all(p["exit"] == 0 for p in v["processes"]), v
assert sum(p["report"]["tenants"][0]["refusals"] for p in v["processes"]) >= 2, v
big = [t for t in v["tenants"] if t["name"] == "big"][0]
assert big["max"] == 2 << 20 and 0 < big["peak_held_bytes"] <= 2 << 20, big
EOF

[ "$failures" -eq 0 ] && echo "cli_ledger: all checks passed"
exit $((failures > 0))
