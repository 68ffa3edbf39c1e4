#!/usr/bin/env bash
# scripts/bench.sh cloud: fleet-sim at 10,000 agents: one server on SQLite vs two on PostgreSQL, then
#   staged rollouts (1%, 10%, 100%) with 2 % and 10 % simulated failures
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh cloud.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" cloud "$@"

# start_pg PORT: a throw-away PostgreSQL cluster in $pgdir on PORT (trust on loopback).
# synchronous_commit=off is SQLite's synchronous=NORMAL in WAL mode: a power cut may lose
# the last commits, never the database.
start_pg() {
    local port=$1 bin
    bin=$(pg_bin)
    [[ -n $bin ]] || { echo "bench.sh: PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 1; }
    pgdir=$(mktemp -d /tmp/agent-bench-pg.XXXXXX)
    chown postgres:postgres "$pgdir"
    runuser -u postgres -- "$bin/initdb" -D "$pgdir/data" -U postgres -E UTF8 --auth=trust >/dev/null
    runuser -u postgres -- "$bin/pg_ctl" -D "$pgdir/data" -l "$pgdir/log" -w start \
        -o "-p $port -k $pgdir -c listen_addresses=127.0.0.1 -c max_connections=200 -c synchronous_commit=off" >/dev/null
}

# fresh_db PORT: an empty database "fleet".
fresh_db() {
    PGOPTIONS='-c client_min_messages=warning' psql -h 127.0.0.1 -p "$1" -U postgres -X -q \
        -c 'DROP DATABASE IF EXISTS fleet' -c 'CREATE DATABASE fleet' >/dev/null
}

# pg_cpu_secs: CPU seconds of every postgres process now running.
pg_cpu_secs() {
    # shellcheck disable=SC2046
    cpu_secs $(pgrep -u postgres -x postgres)
}

bench_cloud() {
    local n=${CLOUD_AGENTS:-10000}
    echo "cloud: $n simulated agents, one server on SQLite vs two on PostgreSQL; staged rollouts" >&2
    keys
    make_dist "$work/cd" 0
    local b1 b2
    b1=$(pack 1.0.0 "$work/cd" "$work/cb1")
    sleep 1
    b2=$(pack 2.0.0 "$work/cd" "$work/cb2")
    local pgport
    pgport=$(free_port)
    start_pg "$pgport"
    local url="postgres://postgres@127.0.0.1:$pgport/fleet"
    local sim=("$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --ramp 30s
        --download head --token bench --progress 30s)
    local setups=(sqlite postgres)

    # up SETUP PLAN FAIL...: starts the setup's servers serving b1 with the rollout plan;
    # sets $urls (the servers, for fleet-sim) and $spids.
    up() {
        local setup=$1 i port
        shift
        urls=() spids=()
        if [[ $setup == sqlite ]]; then
            port=$(free_port)
            sim_server "$work/cs-0" "$port" "$b1" "$@"
            urls+=(--server "http://127.0.0.1:$port") spids+=("$server_pid")
        else
            fresh_db "$pgport"
            for i in 0 1; do
                port=$(free_port)
                sim_server "$work/cs-$i" "$port" "$b1" "UPDATE_SERVER_DATABASE_URL=$url" \
                    "UPDATE_SERVER_SERVER_NAME=s$i" "$@"
                urls+=(--server "http://127.0.0.1:$port") spids+=("$server_pid")
            done
        fi
    }
    down() {
        local pid
        for pid in "${spids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    }

    # Heartbeats: 10,000 agents every 30 s (± 20 %), nothing to update; the last 60 s of
    # each run are measured, CPU over the same span.
    local round setup c0 p0 c1 p1
    for round in 1 2 3; do
        for setup in "${setups[@]}"; do
            up "$setup"
            "${sim[@]}" "${urls[@]}" --warmup 45s --duration 105s \
                --json "$work/steady-$setup-$round.json" >/dev/null 2>"$work/steady-$setup-$round.err" &
            local sim_pid=$!
            sleep 45
            c0=$(cpu_secs "${spids[@]}") p0=$(pg_cpu_secs)
            sleep 60
            c1=$(cpu_secs "${spids[@]}") p1=$(pg_cpu_secs)
            wait "$sim_pid"
            local hwm=0 pid
            for pid in "${spids[@]}"; do hwm=$(( $(hwm_mib "$pid") > hwm ? $(hwm_mib "$pid") : hwm )); done
            awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.1f\n", (b - a) / 60 * 100 }' >>"$work/cpu-$setup"
            if [[ $setup == postgres ]]; then
                awk -v a="$p0" -v b="$p1" 'BEGIN { printf "%.1f\n", (b - a) / 60 * 100 }' >>"$work/pgcpu"
            fi
            echo "$hwm" >>"$work/rss-$setup"
            down
            note "round $round, $setup: $(jq '[.endpoints[].per_second] | add | round' "$work/steady-$setup-$round.json") calls/s, connect p50 $(jq .endpoints.connect.p50_ms "$work/steady-$setup-$round.json") ms p99 $(jq .endpoints.connect.p99_ms "$work/steady-$setup-$round.json") ms, server CPU $(tail -1 "$work/cpu-$setup") %, peak RSS $hwm MiB"
        done
    done

    # Staged rollouts across the same fleet: waves 1%, 10%, 100%, max-failures 5 %,
    # installs of 10 s of which 2 % (then 10 %) fail.
    local plan=("UPDATE_SERVER_ROLLOUT_WAVES=1%,10%,100%" UPDATE_SERVER_ROLLOUT_MAX_FAILURES=5%
        UPDATE_SERVER_ROLLOUT_WAVE_WAIT=0 UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=600)
    local rate
    for round in 1 2; do
        for rate in 0.02 0.10; do
            [[ $round == 2 && $rate == 0.10 ]] && continue
            for setup in "${setups[@]}"; do
                up "$setup" "${plan[@]}"
                "${sim[@]}" "${urls[@]}" --install-time 10s --fail-rate "$rate" --until-rollout-end \
                    --duration 900s --json "$work/roll-$setup-$rate-$round.json" >/dev/null \
                    2>"$work/roll-$setup-$rate-$round.err" &
                local sim_pid=$!
                sleep 45
                local i
                for i in "${!spids[@]}"; do
                    serve_bundle "$work/cs-$i" "${urls[$((2 * i + 1))]##*:}" "$b2"
                done
                wait "$sim_pid"
                down
                note "round $round, $setup, fail rate $rate: $(jq -r '.rollout | "\(.state) at wave \(.wave) after \(.seconds // "?") s"' "$work/roll-$setup-$rate-$round.json")"
            done
        done
    done

    steady_row() { # steady_row SETUP NAME
        local f=("$work"/steady-"$1"-*.json)
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$2" \
            "$(for x in "${f[@]}"; do jq '[.endpoints[].per_second] | add' "$x"; done | awk '{ printf "%.0f\n", $1 }' | spread_as %s)" \
            "$(for x in "${f[@]}"; do jq .endpoints.connect.p50_ms "$x"; done | spread_ms)" \
            "$(for x in "${f[@]}"; do jq .endpoints.connect.p99_ms "$x"; done | spread_ms)" \
            "$(cat "${f[@]}" | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')" \
            "$(spread_as %s " %%" <"$work/cpu-$1")" \
            "$(sort -n "$work/rss-$1" | awk '{ a[NR] = $1 } END { printf "%s MiB", a[NR] }')"
    }
    roll_row() { # roll_row SETUP RATE NAME
        local f=("$work"/roll-"$1"-"$2"-*.json) x
        local outcome
        outcome=$(for x in "${f[@]}"; do jq -r '.rollout | "\(.state) (wave \(.wave) of 3)"' "$x"; done | sort | uniq -c | awk '{ c = $1; $1 = ""; printf "%s%s×%s", (NR > 1 ? ", " : ""), c, $0 }')
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$3" "$(awk -v r="$2" 'BEGIN { printf "%g %%", r * 100 }')" "$outcome" \
            "$(for x in "${f[@]}"; do jq '.rollout.seconds // empty' "$x"; done | spread)" \
            "$(for x in "${f[@]}"; do jq '.endpoints.report.p50_ms // empty' "$x"; done | spread_ms)" \
            "$(for x in "${f[@]}"; do jq '.endpoints.report.p99_ms // empty' "$x"; done | spread_ms)" \
            "$(cat "${f[@]}" | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')"
    }
    write_section cloud <<EOF2
## A server cloud: 10,000 agents on SQLite and on PostgreSQL

\`scripts/bench.sh cloud\` on $(machine). \`fleet-sim\` with $n agents on loopback
(each with its own id and credentials, heartbeat 30 s ± 20 %, started over 30 s), against
one release update-server on SQLite (\`fleet.db\` under its home, WAL) and against two
on one PostgreSQL $("$(pg_bin)/postgres" --version | awk '{ print $3 }') (a local cluster with
\`synchronous_commit = off\`, SQLite's durability in WAL mode; the agents spread over
both servers). Everything shares the machine's two cores, fleet-sim included.

**Heartbeats.** Three rounds of each setup, alternating; 60 s measured after 45 s of
warm-up; median (min–max) over the rounds. Calls are fleet-sim's (register and connect),
latencies its own clock. Server CPU is the update-server processes' user and system time
over the same 60 s (100 % is one core; both servers summed); PostgreSQL's own processes
used $(spread_as %s " %%" <"$work/pgcpu") more in the
PostgreSQL runs. Peak RSS is the larger server's VmHWM.

| setup | calls/s | connect p50 | connect p99 | errors | server CPU | peak RSS |
|---|---|---|---|---|---|---|
$(steady_row sqlite "one server, SQLite")
$(steady_row postgres "two servers, PostgreSQL")

**Staged rollouts.** The same fleet; 45 s after it started, 2.0.0 is dropped in (on each
server), rolled out in waves \`["1%", "10%", "100%"]\` with \`max-failures = "5%"\`, no soak;
each simulated install takes 10 s and fails with the given probability (\`--fail-rate\`),
and fleet-sim stops when the rollout completes or halts. Time is from the rollout's start
to its end as the server recorded it: mostly heartbeats, since an agent learns that its
wave opened at its next contact (up to 36 s later), then installs. Two rounds at 2 %,
one at 10 %.

| setup | failures | outcome | time | report p50 | report p99 | errors |
|---|---|---|---|---|---|---|
$(roll_row sqlite 0.02 "one server, SQLite")
$(roll_row postgres 0.02 "two servers, PostgreSQL")
$(roll_row sqlite 0.10 "one server, SQLite")
$(roll_row postgres 0.10 "two servers, PostgreSQL")

At 10 % failures the rollout must halt in its second wave at the latest (target); at 2 %
it must complete.
EOF2
}
