#!/usr/bin/env bash
# scripts/bench.sh opamp: fleet-sim --protocol opamp at 10,000 agents over HTTP and WebSocket vs the
#   native protocol; a configuration push to APPLIED on 10,000 WebSocket agents
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh opamp.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" opamp "$@"

bench_opamp() {
    local n=${OPAMP_AGENTS:-10000} rounds=${OPAMP_ROUNDS:-3}
    echo "opamp: $n agents over OpAMP (HTTP, WebSocket) vs native; a config push to $n WebSocket agents" >&2
    # fleet-sim and the server each need a descriptor per WebSocket agent.
    ulimit -Hn $((n * 2 + 4096)) 2>/dev/null || true
    ulimit -n "$(ulimit -Hn)"
    keys
    make_dist "$work/od" 0
    local b1
    b1=$(pack 1.0.0 "$work/od" "$work/ob1")
    local sim=("$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --ramp 30s
        --download head --progress 30s)
    # endpoint_of MODE: the fleet-sim endpoint whose latency is the mode's heartbeat.
    endpoint_of() {
        case $1 in native) echo connect ;; http) echo "opamp (http)" ;; ws) echo "opamp (ws)" ;; esac
    }

    # Heartbeats of the whole fleet every 30 s (± 20 %), the served bundle the one they
    # run; the last 60 s of each run measured, server CPU over the same span. Modes
    # alternate within each round.
    local round mode port c0 c1
    for round in $(seq "$rounds"); do
        for mode in native http ws; do
            port=$(free_port)
            sim_server "$work/os" "$port" "$b1"
            local flag=()
            [[ $mode != native ]] && flag=(--protocol opamp --transport "$mode")
            "${sim[@]}" "${flag[@]}" --server "http://127.0.0.1:$port" --warmup 45s --duration 105s \
                --json "$work/op-$mode-$round.json" >/dev/null 2>"$work/op-$mode-$round.err" &
            local sim_pid=$!
            sleep 45
            c0=$(cpu_secs "$server_pid")
            sleep 60
            c1=$(cpu_secs "$server_pid")
            wait "$sim_pid" || true
            { hwm_mib "$server_pid"; echo; } >>"$work/op-rss-$mode"
            stop_server
            awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.1f\n", (b - a) / 60 * 100 }' >>"$work/op-cpu-$mode"
            local json=$work/op-$mode-$round.json ep
            ep=$(endpoint_of "$mode")
            note "round $round, $mode: $(jq '[.endpoints[].per_second] | add | round' "$json") calls/s, p50 $(jq --arg e "$ep" '.endpoints[$e].p50_ms' "$json") ms p99 $(jq --arg e "$ep" '.endpoints[$e].p99_ms' "$json") ms, errors $(jq '[.errors[]] | add // 0' "$json"), server CPU $(tail -1 "$work/op-cpu-$mode") %, peak RSS $(tail -1 "$work/op-rss-$mode") MiB"
        done
    done

    # A configuration set pushed to the group of $n WebSocket agents (waves ["100%"]):
    # from the PUT to every agent APPLIED, as the config rollout recorded it (its start
    # to its completion) and as seen by polling /admin/config every 0.2 s.
    local push=() seen=()
    for round in $(seq "$rounds"); do
        port=$(free_port)
        sim_server "$work/oc" "$port" "$b1"
        "${sim[@]}" --protocol opamp --transport ws --group edge=1 --server "http://127.0.0.1:$port" \
            --duration 200s >/dev/null 2>"$work/oc-$round.err" &
        local sim_pid=$!
        # Every agent connected and reporting before the push.
        local deadline=$((SECONDS + 120))
        until [[ $(curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/agents" | jq '[.[] | select(.protocol == "opamp" and .online)] | length') -ge $n ]]; do
            ((SECONDS < deadline)) || { note "config push: not all $n agents connected"; break; }
            sleep 2
        done
        sleep 5
        local t0 t1 applied
        t0=$(date +%s.%N)
        curl -fsS -X PUT -H "Authorization: Bearer bench" -H "Content-Type: application/json" \
            --data '{"files": {"collector.yaml": "receivers:\n  otlp: {}\n"}}' \
            "http://127.0.0.1:$port/admin/config/edge" >/dev/null
        deadline=$((SECONDS + 120))
        while :; do
            applied=$(curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/config" | jq '[.sets[] | select(.group == "edge") | .applied] | add // 0')
            [[ $applied -ge $n ]] && break
            ((SECONDS < deadline)) || { note "config push: $applied of $n APPLIED after 120 s"; break; }
            sleep 0.2
        done
        t1=$(date +%s.%N)
        seen+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')")
        push+=("$(curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/config" |
            jq '[.sets[] | select(.group == "edge") | .rollout | (.completed_at // empty) - .started_at] | first // empty')")
        kill "$sim_pid" 2>/dev/null || true
        wait "$sim_pid" 2>/dev/null || true
        stop_server
        note "config push round $round: $applied APPLIED; rollout start → complete ${push[-1]:-?} s, PUT → all APPLIED seen ${seen[-1]} s"
    done

    row() { # row MODE NAME
        local f=("$work"/op-"$1"-*.json) ep x
        ep=$(endpoint_of "$1")
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$2" \
            "$(for x in "${f[@]}"; do jq '[.endpoints[].per_second] | add' "$x"; done | awk '{ printf "%.0f\n", $1 }' | spread_as %s)" \
            "$(for x in "${f[@]}"; do jq --arg e "$ep" '.endpoints[$e].p50_ms // empty' "$x"; done | spread_ms)" \
            "$(for x in "${f[@]}"; do jq --arg e "$ep" '.endpoints[$e].p99_ms // empty' "$x"; done | spread_ms)" \
            "$(cat "${f[@]}" | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')" \
            "$(spread_as %s " %%" <"$work/op-cpu-$1")" \
            "$(spread_as %s " MiB" <"$work/op-rss-$1")"
    }
    write_section opamp <<EOF2
## OpAMP: 10,000 agents over HTTP and WebSocket beside the native protocol

\`scripts/bench.sh opamp\` on $(machine). \`fleet-sim\` with $n agents on loopback
against one release update-server on SQLite, everything on the machine's two cores
(fleet-sim's $n agents included). Each agent heartbeats every 30 s (± 20 %), started over
30 s; the served bundle is the version they run (so each was offered it once, as
installed already). Native: \`POST /agent/connect\` per heartbeat. OpAMP over HTTP
(\`--protocol opamp --transport http\`): a \`POST /v1/opamp\` per heartbeat, as
opamp-go's HTTP client polls. OpAMP over WebSocket (\`--transport ws\`): one socket per
agent held open, a heartbeat \`AgentToServer\` per 30 s answered on it. $rounds rounds,
the three modes alternating in each; 60 s measured after 45 s of warm-up; median
(min–max). Latency is fleet-sim's clock from sending a heartbeat to its answer; server
CPU is the update-server process's user and system time over the same 60 s (100 % is one
core); RSS its peak (VmHWM).

| protocol | calls/s | p50 | p99 | errors | server CPU | peak RSS |
|---|---|---|---|---|---|---|
$(row native "native (connect)")
$(row http "OpAMP over HTTP")
$(row ws "OpAMP over WebSocket")

**A configuration push to $n WebSocket agents.** The same fleet, all in group \`edge\`
(waves \`["100%"]\`), connected and quiet; a set is \`PUT\` to \`/admin/config/edge\`,
the server pushes it on every socket at once, each agent applies it and answers
\`RemoteConfigStatus\` \`APPLIED\`. The config rollout's own record (start to
completion) and the time from the \`PUT\` until \`/admin/config\` counted all $n applied
(polled every 0.2 s); $rounds rounds, median (min–max).

| agents | rollout start → complete | PUT → all APPLIED seen |
|---|---|---|
| $n | $(printf '%s\n' "${push[@]}" | grep . | spread) | $(printf '%s\n' "${seen[@]}" | spread) |
EOF2
}
