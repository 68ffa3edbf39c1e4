#!/usr/bin/env bash
# scripts/bench.sh deployments: fleet-sim: a connect's directive with 50 deployments vs 1
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh deployments.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" deployments "$@"

# make_deployments PORT N: N deployments besides default, each selecting agents by a
# label no simulated agent has (every agent is still weighed against every selector).
make_deployments() {
    local i
    for ((i = 1; i <= $2; i++)); do
        curl -fsS -o /dev/null -H "Authorization: Bearer bench" -H "Content-Type: application/json" \
            -d "{\"name\":\"d$i\",\"selector\":\"shard=s$i,env in (prod,staging),!canary\",\"release\":\"1.0.0+1\",\"priority\":$i}" \
            "http://127.0.0.1:$1/admin/deployments"
    done
}

bench_deployments() {
    local n=${DEPLOYMENTS_AGENTS:-1000} rounds=${DEPLOYMENTS_ROUNDS:-3} many=${DEPLOYMENTS_MANY:-50}
    echo "deployments: $n simulated agents, connect latency with $many deployments vs 1 ($rounds rounds)" >&2
    keys
    use_variant ours
    make_dist "$work/dd" 0
    local b1
    b1=$(pack 1.0.0 "$work/dd" "$work/db1")
    local sim=("$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 2s --ramp 5s
        --download head --install-time 2s --token bench --progress 10s)
    local i port count
    # The same fleet at rest against a server of default alone and one of $many more
    # deployments, alternating; each release-published so the deployments may name it.
    for ((i = 1; i <= rounds; i++)); do
        for count in 0 "$many"; do
            port=$(free_port)
            sim_server "$work/ds-$count" "$port" "$b1"
            until_true 30 "the release to be published" \
                sh -c "curl -fsS -H 'Authorization: Bearer bench' http://127.0.0.1:$port/admin/releases | grep -q 1.0.0+1"
            make_deployments "$port" "$count"
            "${sim[@]}" --server "http://127.0.0.1:$port" --warmup 15s --duration 45s \
                --json "$work/dep-$count-$i.json" >/dev/null 2>"$work/dep-$count-$i.err"
            stop_server
            note "round $i, $count extra deployments: connect p50 $(jq .endpoints.connect.p50_ms "$work/dep-$count-$i.json") ms, p99 $(jq .endpoints.connect.p99_ms "$work/dep-$count-$i.json") ms"
        done
    done
    local one50 one99 many50 many99 m1 m50 errors
    one50=$(for ((i = 1; i <= rounds; i++)); do jq .endpoints.connect.p50_ms "$work/dep-0-$i.json"; done | spread_ms)
    one99=$(for ((i = 1; i <= rounds; i++)); do jq .endpoints.connect.p99_ms "$work/dep-0-$i.json"; done | spread_ms)
    many50=$(for ((i = 1; i <= rounds; i++)); do jq .endpoints.connect.p50_ms "$work/dep-$many-$i.json"; done | spread_ms)
    many99=$(for ((i = 1; i <= rounds; i++)); do jq .endpoints.connect.p99_ms "$work/dep-$many-$i.json"; done | spread_ms)
    m1=$(for ((i = 1; i <= rounds; i++)); do jq .endpoints.connect.p50_ms "$work/dep-0-$i.json"; done | median_of)
    m50=$(for ((i = 1; i <= rounds; i++)); do jq .endpoints.connect.p50_ms "$work/dep-$many-$i.json"; done | median_of)
    errors=$(cat "$work"/dep-*.json | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')
    write_section deployments <<EOF2
## Deployments: a connect's directive with $many deployments against one

\`$(bench_command deployments)\` on $(machine). A release update-server (SQLite) and
\`fleet-sim\` with $n simulated agents on loopback heartbeating every 2 s (± 20 %), at
rest, against a server with \`default\` alone and against one with $many more
deployments (each a selector of three terms no simulated agent matches, so every connect
weighs its agent against all $many before \`default\`). $rounds rounds of each,
alternating; median (min–max) over the rounds.

| deployments | connect p50 | connect p99 |
|---|---|---|
| 1 (default) | $one50 | $one99 |
| $((many + 1)) | $many50 | $many99 |

p50 with $((many + 1)) against 1: $(awk -v a="$m50" -v b="$m1" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }'). Errors of any kind: $errors.
With more than one deployment a connect matches the agent's labels against each selector
in memory; the labels the fleet keeps for it are read once and kept (dropped when any
server changes an agent's labels): the cost grows with the deployments, not with the
agents.
EOF2
}
