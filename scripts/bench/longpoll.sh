#!/usr/bin/env bash
# scripts/bench.sh longpoll: fleet-sim at 10,000 agents: a staged rollout with long polls vs heartbeats;
#   one server holding 20,000 long-polling agents (RSS, CPU, wave to told);
#   LONGPOLL_ONLY=rollout|held runs one part and prints it, BENCHMARKS.md untouched
#   (LONGPOLL_MODES="longpoll" then skips the heartbeat rounds)
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh longpoll.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" longpoll "$@"

# rss_mib PID: resident memory now.
rss_mib() { status_mib VmRSS "$1"; }

bench_longpoll() {
    local n=${LONGPOLL_AGENTS:-10000} held=${LONGPOLL_HELD:-20000}
    echo "longpoll: a rollout of $n agents with long polls vs heartbeats; $held held agents" >&2
    # fleet-sim and the server each need a descriptor per agent.
    ulimit -Hn $((held * 2 + 4096)) 2>/dev/null || true
    ulimit -n "$(ulimit -Hn)"
    # Where the file limit cannot be raised (a container), hold what fits beside each
    # process's own files: agents past the server's connection cap would only queue.
    local fits=$(($(ulimit -n) - 200)) asked=$held
    ((held > fits)) && held=$fits
    keys
    make_dist "$work/ld" 0
    local b1 b2
    b1=$(pack 1.0.0 "$work/ld" "$work/lb1")
    sleep 1
    b2=$(pack 2.0.0 "$work/ld" "$work/lb2")
    local plan=("UPDATE_SERVER_ROLLOUT_WAVES=1%,10%,100%" UPDATE_SERVER_ROLLOUT_MAX_FAILURES=5%
        UPDATE_SERVER_ROLLOUT_WAVE_WAIT=0 UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=600)
    local sim=("$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --ramp 30s
        --download head --token bench --progress 30s --install-time 10s --fail-rate 0.02)

    # The same rollout, both ways, alternating: heartbeats (how agents ran before) and long
    # polls (how they run now); time from the rollout's start to its end as recorded.
    local round mode port only=${LONGPOLL_ONLY:-}
    local rounds=${LONGPOLL_ROUNDS:-3} held_rounds=${LONGPOLL_HELD_ROUNDS:-2}
    [[ $only == held ]] && rounds=0
    [[ $only == rollout ]] && held_rounds=0
    for round in $(seq "$rounds"); do
        for mode in ${LONGPOLL_MODES:-heartbeat longpoll}; do
            port=$(free_port)
            sim_server "$work/ls" "$port" "$b1" "${plan[@]}"
            local flag=()
            [[ $mode == longpoll ]] && flag=(--long-poll)
            "${sim[@]}" "${flag[@]}" --server "http://127.0.0.1:$port" --until-rollout-end \
                --duration 900s --json "$work/lp-$mode-$round.json" >/dev/null 2>"$work/lp-$mode-$round.err" &
            local sim_pid=$!
            sleep 45
            serve_bundle "$work/ls" "$port" "$b2"
            wait "$sim_pid"
            stop_server
            jq '.rollout.seconds // empty' "$work/lp-$mode-$round.json" >>"$work/lp-$mode"
            note "round $round, $mode: $(jq -r '.rollout | "\(.state) after \(.seconds // "?") s"' "$work/lp-$mode-$round.json"), errors $(jq '[.errors[]] | add // 0' "$work/lp-$mode-$round.json")"
        done
    done

    # One server holding $held long-polling agents (heartbeat 30 s, so each re-holds every
    # 30 s): peak RSS, CPU over 60 s at rest, then a first wave of 10 % opened by a new
    # bundle: how long after the wave opened each of its agents was told (the server's
    # told_at minus the wave's opened_at). Installs take longer than the measurement.
    # With BENCH_BASELINE, the same rounds alternate with that checkout's server (the old way).
    local rest=() rss=() cpu=() lag=() brest=() brss=() bcpu=() blag=() variant variants=(ours)
    [[ -n $baseline ]] && variants+=(baseline)
    for round in $(seq "$held_rounds"); do
        for variant in "${variants[@]}"; do
            server_bin=$bin
            [[ $variant == baseline ]] && server_bin=$baseline/target/release
            port=$(free_port)
            sim_server "$work/lh" "$port" "$b1" "UPDATE_SERVER_ROLLOUT_WAVES=10%,100%" \
                UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=3600
            "$bin/fleet-sim" --agents "$held" --agent-version 1.0.0+1 --heartbeat 30s --ramp 60s \
                --download head --install-time 600s --long-poll --progress 30s \
                --server "http://127.0.0.1:$port" --duration 240s >/dev/null 2>"$work/lh-$round.err" &
            local sim_pid=$!
            sleep 100
            local c0 c1
            c0=$(cpu_secs "$server_pid")
            sleep 60
            c1=$(cpu_secs "$server_pid")
            cpu+=("$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.1f", (b - a) / 60 * 100 }')")
            rest+=("$(rss_mib "$server_pid")")
            serve_bundle "$work/lh" "$port" "$b2"
            sleep 20
            rss+=("$(hwm_mib "$server_pid")")
            curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/rollout" >"$work/lh-rollout-$round.json"
            curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/agents" >"$work/lh-agents-$round.json"
            kill "$sim_pid" 2>/dev/null || true
            wait "$sim_pid" 2>/dev/null || true
            stop_server
            lag+=("$(jq -r --slurpfile r "$work/lh-rollout-$round.json" \
                '($r[0].waves[0].opened_at) as $o | [.[] | select(.wave == 1 and .told_at != null) | (.told_at - $o)] | sort | .[(length * 0.99 | floor)] * 1000' \
                "$work/lh-agents-$round.json")")
            note "round $round, $variant: RSS ${rest[-1]} MiB holding, ${rss[-1]} MiB peak after the wave, CPU at rest ${cpu[-1]} %, wave 1 told p99 ${lag[-1]} ms after it opened"
            if [[ $variant == baseline ]]; then
                brest+=("${rest[-1]}") brss+=("${rss[-1]}") bcpu+=("${cpu[-1]}") blag+=("${lag[-1]}")
                unset 'rest[-1]' 'rss[-1]' 'cpu[-1]' 'lag[-1]'
            fi
        done
    done
    server_bin=$bin
    if [[ -n $only ]]; then
        echo "longpoll: LONGPOLL_ONLY=$only, BENCHMARKS.md left as it was" >&2
        return
    fi

    write_section longpoll <<EOF2
## Long polls: a rollout at the speed of installs, and 20,000 held agents

\`scripts/bench.sh longpoll\` on $(machine). \`fleet-sim\` on loopback against one release
update-server on SQLite, everything on the machine's two cores.

**A staged rollout both ways.** $n agents (heartbeat 30 s, started over 30 s, \`--download
head\`), 2.0.0 dropped in 45 s after the start and rolled out in waves \`["1%", "10%", "100%"]\`
(\`max-failures = "5%"\`, no soak), installs of 10 s of which 2 % fail; time from the
rollout's start to its end as the server recorded it. Rounds alternate
heartbeats (fleet-sim without \`--long-poll\`: an agent learns its wave opened at its next
heartbeat) and long polls (\`--long-poll\`: held connects answered when the wave opens).
${LONGPOLL_ROUNDS:-3} rounds of each; median (min–max).

| agents | heartbeats | long polls | ratio |
|---|---|---|---|
| $n | $(spread <"$work/lp-heartbeat") | $(spread <"$work/lp-longpoll") | $(ratio "$(median_of <"$work/lp-heartbeat")" "$(median_of <"$work/lp-longpoll")")× faster |

Target: under 40 s with long polls (from about 134 s).

**One server holding $held agents.** $( ((held < asked)) && printf '%s' "(Not $asked: this machine's file limit, $(ulimit -n), cannot be raised here, and one process holds one descriptor per connection.) ")Long-polling agents, heartbeat 30 s (each re-holds its
connect every 30 s; its contact is written with the next batch, once a second), started over 60 s; CPU of the server process
over 60 s once all are held (100 % is one core) and its RSS then (holding); then a
bundle whose first wave is 10 % of the fleet, and the peak RSS (VmHWM) 20 s after it
opened (the wave's agents keep their connections, now also used for a download, which
hyper then serves with its own buffers); for each agent of that wave, the time from
the wave's opening to the server telling it (\`told_at\` in \`/admin/agents\` minus the
wave's \`opened_at\`), p99 over the wave. ${LONGPOLL_HELD_ROUNDS:-2} round(s)$( [[ -n $baseline ]] && printf '%s' ", alternating with the baseline's server"); each figure median (min–max).

| server | held agents | RSS holding | peak RSS after the wave | CPU at rest | wave opened → agent told, p99 |
|---|---|---|---|---|---|
| this tree | $held | $(printf '%s\n' "${rest[@]}" | spread_as %s " MiB") | $(printf '%s\n' "${rss[@]}" | spread_as %s " MiB") | $(printf '%s\n' "${cpu[@]}" | spread_as %s " %%") | $(printf '%s\n' "${lag[@]}" | spread_as %.0f " ms") |
$( ((${#brss[@]})) && printf '| baseline %s | %s | %s | %s | %s | %s |\n' "$(git -C "$baseline" rev-parse --short HEAD)" "$held" "$(printf '%s\n' "${brest[@]}" | spread_as %s " MiB")" "$(printf '%s\n' "${brss[@]}" | spread_as %s " MiB")" "$(printf '%s\n' "${bcpu[@]}" | spread_as %s " %%")" "$(printf '%s\n' "${blag[@]}" | spread_as %.0f " ms")")

Targets: under 256 MiB, under 5 % of a core, under 1 s.
EOF2
}
