#!/usr/bin/env bash
# scripts/bench.sh rollout: fleet-sim: connect latency with and without a rollout, wave times with a plan
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh rollout.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" rollout "$@"

bench_rollout() {
    local n=${ROLLOUT_AGENTS:-1000}
    echo "rollout: $n simulated agents, connect latency with and without a rollout, wave times" >&2
    keys
    use_variant ours
    make_dist "$work/rd" 0
    local b1 b2
    b1=$(pack 1.0.0 "$work/rd" "$work/rb1")
    sleep 1
    b2=$(pack 2.0.0 "$work/rd" "$work/rb2")
    local sim=("$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 2s --ramp 5s
        --download head --install-time 2s --token bench --progress 10s)
    local i port
    # Connect latency: a fleet at rest (its rollout completed) against the same fleet with
    # a rollout under way (the first 1 % updated, the rest waiting in a second wave that
    # soaks an hour), alternating.
    for i in 1 2 3; do
        port=$(free_port)
        sim_server "$work/rs-idle" "$port" "$b1"
        "${sim[@]}" --server "http://127.0.0.1:$port" --warmup 15s --duration 45s \
            --json "$work/idle-$i.json" >/dev/null 2>"$work/idle-$i.err"
        stop_server
        port=$(free_port)
        sim_server "$work/rs-busy" "$port" "$b1" UPDATE_SERVER_ROLLOUT_WAVES=1%,100% UPDATE_SERVER_ROLLOUT_WAVE_WAIT=3600
        "${sim[@]}" --server "http://127.0.0.1:$port" --warmup 25s --duration 55s \
            --json "$work/busy-$i.json" >/dev/null 2>"$work/busy-$i.err" &
        local sim_pid=$!
        sleep 8
        serve_bundle "$work/rs-busy" "$port" "$b2"
        wait "$sim_pid"
        stop_server
        note "round $i: connect p50 $(jq .endpoints.connect.p50_ms "$work/idle-$i.json") ms at rest, $(jq .endpoints.connect.p50_ms "$work/busy-$i.json") ms during a rollout ($(jq -r '.rollout.state' "$work/busy-$i.json"))"
    done
    # Wave time: from a wave opening to its completion, with a plan (the 90 % wave of
    # 10%,100%) and without (the one wave of 100%), alternating.
    for i in 1 2 3; do
        local plan
        for plan in "10%,100%" "100%"; do
            port=$(free_port)
            sim_server "$work/rs-wave" "$port" "$b1" "UPDATE_SERVER_ROLLOUT_WAVES=$plan"
            "${sim[@]}" --server "http://127.0.0.1:$port" --until-rollout-end --duration 300s \
                --json "$work/wave-$plan-$i.json" >/dev/null 2>"$work/wave-$plan-$i.err" &
            local sim_pid=$!
            sleep 8
            serve_bundle "$work/rs-wave" "$port" "$b2"
            wait "$sim_pid"
            stop_server
            note "round $i, plan $plan: last wave $(jq '.rollout.waves[-1] | .completed_at - .opened_at' "$work/wave-$plan-$i.json") s, rollout $(jq .rollout.seconds "$work/wave-$plan-$i.json") s"
        done
    done
    local idle50 idle99 busy50 busy99 planned unplanned whole_planned whole_unplanned errors
    idle50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/idle-$i.json"; done | spread_ms)
    idle99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/idle-$i.json"; done | spread_ms)
    busy50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/busy-$i.json"; done | spread_ms)
    busy99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/busy-$i.json"; done | spread_ms)
    local m_idle50 m_busy50 m_idle99 m_busy99
    m_idle50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/idle-$i.json"; done | median_of)
    m_busy50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/busy-$i.json"; done | median_of)
    m_idle99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/idle-$i.json"; done | median_of)
    m_busy99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/busy-$i.json"; done | median_of)
    planned=$(for i in 1 2 3; do jq '.rollout.waves[-1] | .completed_at - .opened_at' "$work/wave-10%,100%-$i.json"; done | spread)
    unplanned=$(for i in 1 2 3; do jq '.rollout.waves[-1] | .completed_at - .opened_at' "$work/wave-100%-$i.json"; done | spread)
    whole_planned=$(for i in 1 2 3; do jq '.rollout.seconds' "$work/wave-10%,100%-$i.json"; done | spread)
    whole_unplanned=$(for i in 1 2 3; do jq '.rollout.seconds' "$work/wave-100%-$i.json"; done | spread)
    errors=$(cat "$work"/idle-*.json "$work"/busy-*.json "$work"/wave-*.json | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')
    write_section rollout <<EOF2
## Rollouts: the directive's cost and the time a wave takes

\`$(bench_command rollout)\` on $(machine). A release update-server (SQLite) and
\`fleet-sim\` with $n simulated agents on loopback, heartbeating every 2 s (± 20 %),
fetching \`HEAD\` and the first 64 KiB of the bundle when told, installing in 2 s.
Three rounds of each case, alternating; median (min–max) over the rounds.

Latency of \`POST /agent/connect\` as the agents see it (fleet-sim's own clock, so it
includes its client's share of the two cores), at rest (the fleet on the served version,
its rollout completed) against a rollout under way (\`waves = ["1%", "100%"]\`, the first
wave updated and the second soaking for an hour: every call is answered from the agent's
wave):

| | at rest | rollout under way | added (medians) | target |
|---|---|---|---|---|
| connect p50 | $idle50 | $busy50 | $(awk -v a="$m_busy50" -v b="$m_idle50" 'BEGIN { printf "%+.0f %%", (a / b - 1) * 100 }') | < 10 % |
| connect p99 | $idle99 | $busy99 | $(awk -v a="$m_busy99" -v b="$m_idle99" 'BEGIN { printf "%+.0f %%", (a / b - 1) * 100 }') | |

From a wave opening to its completion (the server's own record), for the last wave of
\`["10%", "100%"]\` (90 % of the fleet) against the single wave of \`["100%"]\` (the same
fleet with no plan); and the whole rollout, from start to completion:

| | with a plan (last wave) | no plan (the one wave) |
|---|---|---|
| wave open → complete | $planned | $unplanned |
| whole rollout | $whole_planned | $whole_unplanned |

A wave's time is the agents' heartbeat (they learn of the open wave at their next
contact), the fetch and the install; the plan adds its earlier waves in front, not time
within a wave. Errors seen by the agents over all runs: **$errors**.
EOF2
}
