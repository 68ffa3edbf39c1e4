#!/usr/bin/env bash
# scripts/bench.sh workload: the node exporter as a workload: its downtime in an update vs a plain restart
#   of the same program; the agent's CPU and RSS while it supervises
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh workload.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" workload "$@"

# gap_poller PORT DIR: polls http://127.0.0.1:PORT/ every 2 ms in the background until
# DIR/stop exists, then writes the longest gap between two answers (ms) to DIR/gap;
# DIR/ready appears once it has seen a first answer.
gap_poller() {
    python3 - "$1" "$2" <<'PY' &
import http.client, os, sys, time
port, out = int(sys.argv[1]), sys.argv[2]
last, gap = None, 0.0
while not os.path.exists(out + "/stop"):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        c.request("GET", "/")
        ok = c.getresponse().status == 200
        c.close()
    except OSError:
        ok = False
    if ok:
        now = time.monotonic()
        if last is None:
            open(out + "/ready", "w").close()
        else:
            gap = max(gap, now - last)
        last = now
    time.sleep(0.002)
open(out + "/gap", "w").write("%.1f\n" % (gap * 1000))
PY
    pids+=($!)
}

# gap_of DIR: stops the poller writing to DIR and prints its longest gap (ms).
gap_of() {
    touch "$1/stop"
    until [[ -s $1/gap ]]; do sleep 0.01; done
    cat "$1/gap"
}

# exporter_dist DIR PORT: a distribution carrying the node exporter as its workload.
exporter_dist() {
    make_dist "$1" 0
    cp "$(command -v prometheus-node-exporter)" "$1/bin/node_exporter"
}

exporter_args() {
    printf '"--web.listen-address=127.0.0.1:%s", "--collector.disable-defaults", "--collector.loadavg"' "$1"
}

# One update of an agent running the exporter on a free port: its workload's longest
# silence through the update (appended to $1), then through `agent-wrapper.sh restart`
# (appended to $1.agent). Leaves the agent running, its home in $work/wl-last.
workload_update_round() {
    local out=$1 port eport home p
    port=$(free_port)
    eport=$(free_port)
    home=$work/wl-server-$RANDOM
    p=$work/wl-agent-$RANDOM
    mkdir -p "$home/downloads/agent"
    start_server "$home" "$port" RUST_LOG=warn
    serve_bundle "$home" "$port" "$work/wl1/agent-bundle-1.0.0"
    "$work/wl1/agent-bundle-1.0.0" --install="$p" >/dev/null
    cat >"$p/agent/conf/agent.toml" <<EOF
[server]
urls = ["http://127.0.0.1:$port"]
[workload]
command = ["bin/node_exporter", $(exporter_args "$eport")]
health-url = "http://127.0.0.1:$eport/metrics"
EOF
    printf 'export AGENT_UPDATE_STABILITY_WINDOW=1s\n' >"$p/agent/conf/agent-env.sh"
    "$p/agent/current/bin/agent-wrapper.sh" start >/dev/null
    until [[ -f $p/agent/run/health.json ]] && jq -e '.workload.healthy' "$p/agent/run/health.json" >/dev/null 2>&1; do
        sleep 0.05
    done
    local d=$work/gap-$RANDOM
    mkdir -p "$d"
    gap_poller "$eport" "$d"
    until [[ -f $d/ready ]]; do sleep 0.01; done
    serve_bundle "$home" "$port" "$work/wl2/agent-bundle-2.0.0"
    wait_file 120 "$p/agent/logs/update.log" "committed"
    local gap found started
    gap=$(gap_of "$d")
    echo "$gap" >>"$out"
    found=$(log_secs "$(grep -m1 'found the workload' "$p/agent/logs/agent.log")")
    started=$(log_secs "$(grep 'started the workload' "$p/agent/logs/agent.log" | tail -n 1)")
    note "update: workload silent $gap ms; the new agent took $(awk -v a="$started" -v b="$found" 'BEGIN { printf "%.1f", (a - b) * 1000 }') ms from finding the old workload to starting its own"
    # The same agent restarted by its operator: the workload stops with it.
    d=$work/gap-$RANDOM
    mkdir -p "$d"
    gap_poller "$eport" "$d"
    until [[ -f $d/ready ]]; do sleep 0.01; done
    "$p/agent/current/bin/agent-wrapper.sh" restart >/dev/null
    until jq -e '.workload.healthy' "$p/agent/run/health.json" >/dev/null 2>&1 &&
        curl -fs -o /dev/null "http://127.0.0.1:$eport/"; do sleep 0.01; done
    sleep 0.2
    gap=$(gap_of "$d")
    echo "$gap" >>"$out.agent"
    note "agent restart: workload silent $gap ms"
    stop_server
    [[ -n ${wl_last:-} ]] && stop_home "$wl_last"
    wl_last=$p/agent
}

# A plain restart of the same program on its own (what a process manager does): TERM,
# wait for it to end, start it again. Appends its longest silence (ms) to $1.
workload_restart_round() {
    local out=$1 eport d epid gap
    eport=$(free_port)
    d=$work/gap-$RANDOM
    mkdir -p "$d"
    local args=(--web.listen-address="127.0.0.1:$eport" --collector.disable-defaults --collector.loadavg)
    prometheus-node-exporter "${args[@]}" >/dev/null 2>&1 &
    epid=$!
    gap_poller "$eport" "$d"
    until [[ -f $d/ready ]]; do sleep 0.01; done
    sleep 0.2
    kill -TERM "$epid"
    wait "$epid" 2>/dev/null || true
    prometheus-node-exporter "${args[@]}" >/dev/null 2>&1 &
    epid=$!
    until curl -fs -o /dev/null "http://127.0.0.1:$eport/"; do sleep 0.01; done
    sleep 0.2
    gap=$(gap_of "$d")
    echo "$gap" >>"$out"
    note "plain restart: workload silent $gap ms"
    kill -TERM "$epid"
    wait "$epid" 2>/dev/null || true
}

bench_workload() {
    echo "workload: the node exporter's downtime in an update vs a plain restart; agent overhead" >&2
    if ! command -v prometheus-node-exporter >/dev/null; then
        apt-get install -y -qq prometheus-node-exporter >/dev/null
    fi
    keys
    exporter_dist "$work/wld1"
    pack 1.0.0 "$work/wld1" "$work/wl1" >/dev/null
    sleep 1 # signed-at has one-second resolution
    exporter_dist "$work/wld2"
    pack 2.0.0 "$work/wld2" "$work/wl2" >/dev/null
    local rounds=${WORKLOAD_ROUNDS:-5} i
    rm -f "$work/wl-update.txt" "$work/wl-update.txt.agent" "$work/wl-restart.txt"
    for ((i = 1; i <= rounds; i++)); do
        note "round $i of $rounds: update, agent restart, plain restart"
        workload_update_round "$work/wl-update.txt"
        workload_restart_round "$work/wl-restart.txt"
    done
    # Overhead: the last round's agent (2.0.0, long-polling its server... which is gone:
    # a failed connect every heartbeat), supervising its healthy exporter, idle for 60 s.
    local apid c0 c1 secs=${WORKLOAD_IDLE_SECS:-60}
    apid=$(cat "$wl_last/run/agent.pid")
    sleep 5
    c0=$(cpu_secs "$apid")
    sleep "$secs"
    c1=$(cpu_secs "$apid")
    local cpu rss
    cpu=$(awk -v a="$c1" -v b="$c0" -v s="$secs" 'BEGIN { printf "%.2f", (a - b) * 100 / s }')
    rss=$(awk '/VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$apid/status")
    stop_home "$wl_last"
    local mu mr ma
    mu=$(median_of <"$work/wl-update.txt")
    mr=$(median_of <"$work/wl-restart.txt")
    ma=$(median_of <"$work/wl-update.txt.agent")
    note "downtime: update $mu ms, plain restart $mr ms, agent restart $ma ms; agent CPU $cpu %, RSS $rss MiB"
    write_section workload <<EOF
## Workload: its downtime in an update, and the agent's overhead

\`$(bench_command workload)\` on $(machine). Release binaries. The workload is Debian's
node exporter (\`--collector.disable-defaults --collector.loadavg\`, health at
\`/metrics\`); a poller asks its \`/\` every 2 ms and reports the longest gap between two
answers. $rounds rounds, alternating; median (min–max).

| | workload's longest silence |
|---|---|
| agent update 1.0.0 → 2.0.0 carrying it | $(spread_ms <"$work/wl-update.txt") |
| plain restart of the same program (TERM, wait, start: the peer) | $(spread_ms <"$work/wl-restart.txt") |
| \`agent-wrapper.sh restart\` of the agent supervising it | $(spread_ms <"$work/wl-update.txt.agent") |

Ratio of an update to a plain restart (medians): **$(ratio "$mu" "$mr")** (target ≤ 1.2).
The old agent hands over to the updater with its workload still serving; the new
version's agent stops it just before it starts its own, so the workload is down only
for its own stop and start, as in a plain restart. The unpack, the switch and the new
agent's start happen while the old workload answers. An operator's restart of the agent
stops the workload with the agent and starts it with the new one.

Agent overhead while it supervises (the last round's agent, 2.0.0, idle for ${secs} s
after the update, a health check of \`/metrics\` every 5 s, its server gone):

| | \`agent run\` | target |
|---|---|---|
| CPU (utime + stime from \`/proc/<pid>/stat\`, in 10 ms ticks) | $cpu % of a core | < 1 % |
| RSS (\`VmRSS\`) | $rss MiB | < 16 MiB |
EOF
}
