#!/usr/bin/env bash
# scripts/bench.sh config: fleet-sim: a configuration set to 1,000 and 10,000 agents (APPLIED at the
#   server), heartbeats vs long polls; connect latency with a config rollout vs none
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh config.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" config "$@"

# put_set PORT NAME: stores a two-file set for group default; prints the server's answer.
put_set() {
    curl -fsS -X PUT -H "Authorization: Bearer bench" -H "Content-Type: application/json" \
        --data "{\"files\": {\"web-config.yml\": \"basic_auth_users:\\n  prometheus: $2\\n\", \"site.prom\": \"fleet_site{site=\\\"lab\\\"} 1\\n\"}}" \
        "http://127.0.0.1:$1/admin/config/default"
}

# admin_json PORT PATH: an admin GET.
admin_json() { curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$1$2"; }

bench_config() {
    local sizes rounds=${CONFIG_ROUNDS:-3} cost_rounds=${CONFIG_COST_ROUNDS:-3}
    read -r -a sizes <<<"${CONFIG_SIZES:-1000 10000}"
    echo "config: a set to ${sizes[*]} agents, heartbeats vs long polls; connect latency with a config rollout vs none" >&2
    local most=0 n
    for n in "${sizes[@]}"; do ((n > most)) && most=$n; done
    ulimit -Hn $((most * 2 + 4096)) 2>/dev/null || true
    ulimit -n "$(ulimit -Hn)"
    keys
    use_variant ours
    make_dist "$work/cd" 0
    local b1
    b1=$(pack 1.0.0 "$work/cd" "$work/cb1")

    # Reach: the fleet at the default heartbeat (30 s), all registered; then a set for
    # default (waves ["100%"]): time from its creation to the last agent's APPLIED, as the
    # server recorded them (the config rollout's completed_at minus the set's created_at).
    local round mode port
    for round in $(seq "$rounds"); do
        for n in "${sizes[@]}"; do
            for mode in heartbeat longpoll; do
                port=$(free_port)
                sim_server "$work/cs" "$port" "$b1"
                local flag=()
                [[ $mode == longpoll ]] && flag=(--long-poll)
                "$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --ramp 30s \
                    --download head --token bench --progress 30s "${flag[@]}" \
                    --server "http://127.0.0.1:$port" --duration 600s \
                    --json "$work/reach-$n-$mode-$round.json" >/dev/null 2>"$work/reach-$n-$mode-$round.err" &
                local sim_pid=$!
                local end=$((SECONDS + 300))
                until [[ $(admin_json "$port" /admin/agents 2>/dev/null | jq length) == "$n" ]]; do
                    ((SECONDS < end)) || { echo "bench.sh: $n agents never registered" >&2; return 1; }
                    sleep 2
                done
                # A heartbeat more: each agent has had its first answer and sits in its rhythm.
                sleep 30
                put_set "$port" "round-$round-$mode" >"$work/reach-$n-$mode-$round.put"
                end=$((SECONDS + 400))
                until admin_json "$port" /admin/config | jq -e '.sets[0].rollout.state == "completed"' >/dev/null 2>&1; do
                    ((SECONDS < end)) || { echo "bench.sh: the set never reached $n agents" >&2; break; }
                    sleep 0.2
                done
                admin_json "$port" /admin/config >"$work/reach-$n-$mode-$round.config"
                kill "$sim_pid" 2>/dev/null || true
                wait "$sim_pid" 2>/dev/null || true
                stop_server
                jq '.sets[0] | select(.rollout.completed_at != null) | .rollout.completed_at - .created_at' \
                    "$work/reach-$n-$mode-$round.config" >>"$work/reach-$n-$mode"
                note "round $round, $n agents, $mode: $(jq -r '.sets[0] | "\(.applied) APPLIED, \(.rollout.state) after \((.rollout.completed_at // 0) - .created_at) s"' "$work/reach-$n-$mode-$round.config")"
            done
        done
    done

    # Cost per connect: 1,000 agents heartbeating every 2 s against a server whose config
    # rollout is under way (waves ["1%", "100%"], the first wave APPLIED, the second
    # soaking for an hour: every connect is decided against the set and its waves) and
    # against the same server with no set at all, alternating. The bundle's plan is the
    # same in both (the fleet is on it already).
    local cn=${CONFIG_COST_AGENTS:-1000} i case
    local sim=("$bin/fleet-sim" --agents "$cn" --agent-version 1.0.0+1 --heartbeat 2s --ramp 5s
        --download head --token bench --progress 10s)
    for i in $(seq "$cost_rounds"); do
        for case in none rollout; do
            port=$(free_port)
            sim_server "$work/cc-$case" "$port" "$b1" "UPDATE_SERVER_ROLLOUT_WAVES=1%,100%" \
                UPDATE_SERVER_ROLLOUT_WAVE_WAIT=3600
            "${sim[@]}" --server "http://127.0.0.1:$port" --warmup 25s --duration 55s \
                --json "$work/cost-$case-$i.json" >/dev/null 2>"$work/cost-$case-$i.err" &
            local sim_pid=$!
            sleep 8
            [[ $case == rollout ]] && put_set "$port" "cost-$i" >/dev/null
            wait "$sim_pid"
            [[ $case == rollout ]] && admin_json "$port" /admin/config >"$work/cost-$i.config"
            stop_server
            note "round $i, $case: connect p50 $(jq .endpoints.connect.p50_ms "$work/cost-$case-$i.json") ms, p99 $(jq .endpoints.connect.p99_ms "$work/cost-$case-$i.json") ms$([[ $case == rollout ]] && jq -r '.sets[0] | " (set \(.rollout.state), \(.applied) APPLIED)"' "$work/cost-$i.config")"
        done
    done

    local rows="" m_hb m_lp
    for n in "${sizes[@]}"; do
        m_hb=$(median_of <"$work/reach-$n-heartbeat")
        m_lp=$(median_of <"$work/reach-$n-longpoll")
        rows+="| $n | $(spread <"$work/reach-$n-heartbeat") | $(spread <"$work/reach-$n-longpoll") | $(ratio "${m_hb:-0}" "${m_lp:-0}")× |"$'\n'
    done
    pick() { for i in $(seq "$cost_rounds"); do jq ".endpoints.connect.$2" "$work/cost-$1-$i.json"; done; }
    local n50 n99 r50 r99 m_n50 m_n99 m_r50 m_r99 errors
    n50=$(pick none p50_ms | spread_ms)
    n99=$(pick none p99_ms | spread_ms)
    r50=$(pick rollout p50_ms | spread_ms)
    r99=$(pick rollout p99_ms | spread_ms)
    m_n50=$(pick none p50_ms | median_of)
    m_n99=$(pick none p99_ms | median_of)
    m_r50=$(pick rollout p50_ms | median_of)
    m_r99=$(pick rollout p99_ms | median_of)
    # The reach runs' fleet-sim is stopped once the set is everywhere, before it writes
    # its summary: errors are counted over the connect runs.
    errors=$(cat "$work"/cost-*.json | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')
    write_section config <<EOF2
## Remote configuration: a set to the fleet, and what a config rollout costs a connect

\`scripts/bench.sh config\` on $(machine). A release update-server (SQLite) and
\`fleet-sim\` on loopback; a simulated agent applies a set the moment it is sent one and
reports \`APPLIED\` (\`POST /agent/config-status\`), so what is measured is the server and
the protocol, not a workload's restart.

**A set to the fleet.** N agents at the default heartbeat (30 s ± 20 %), started over
30 s, all registered and a heartbeat more; then a two-file set is pushed for \`default\`
(waves \`["100%"]\`). Time from the set's \`created_at\` to its config rollout's
\`completed_at\` (every agent \`APPLIED\`), both from the server's clock. Heartbeats
(fleet-sim without \`--long-poll\`: an agent hears of the set at its next heartbeat)
against long polls (\`--long-poll\`: held connects answered when the set is stored).
$rounds round(s) of each, alternating; median (min–max).

| agents | heartbeats | long polls | ratio |
|---|---|---|---|
${rows%$'\n'}

**Cost per connect.** $cn agents heartbeating every 2 s (± 20 %), latency of
\`POST /agent/connect\` as they see it (fleet-sim's clock, so it includes its client's share
of the two cores), counted after a 25 s warm-up over 30 s: no configuration set at all,
against a config rollout under way (waves \`["1%", "100%"]\`, the first wave \`APPLIED\`
and the second soaking for an hour, so every connect is decided against the set and its
waves). The bundle's plan is the same in both. $cost_rounds round(s) of each, alternating;
median (min–max).

| | no set | config rollout under way | added (medians) |
|---|---|---|---|
| connect p50 | $n50 | $r50 | $(awk -v a="$m_r50" -v b="$m_n50" 'BEGIN { printf "%+.2f ms (%+.0f %%)", a - b, (a / b - 1) * 100 }') |
| connect p99 | $n99 | $r99 | $(awk -v a="$m_r99" -v b="$m_n99" 'BEGIN { printf "%+.2f ms (%+.0f %%)", a - b, (a / b - 1) * 100 }') |

Errors seen by the agents over the connect runs: **$errors**.
EOF2
}
