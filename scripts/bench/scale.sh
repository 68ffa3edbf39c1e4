#!/usr/bin/env bash
# scripts/bench.sh scale: fleet-sim processes of up to SCALE_PER_PROC long-polling agents
#   against SCALE_SERVERS servers on one PostgreSQL, waves 1%,10%,100% (with deltas);
#   SCALE_HTTP2=N: each process's agents share N HTTP/2 connections (fleet-sim --http2)
# Sourced by scripts/bench.sh after scripts/bench/common.sh (and cloud.sh, for its
# PostgreSQL helpers); run alone, it hands itself to scripts/bench.sh scale.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" scale "$@"
# shellcheck source=scripts/bench/cloud.sh
declare -F start_pg >/dev/null || source scripts/bench/cloud.sh

# scale_metric PORT NAME: the sum of a metric's samples (every label) on one server.
# A server too busy to answer counts 0 (the caller polls again).
scale_metric() {
    { curl -fsS --max-time 20 "http://127.0.0.1:$1/metrics" 2>/dev/null || true; } |
        awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $2 } END { printf "%.0f\n", s }'
}

# scale_cpu PID...: once the fleet is held, 10 s to settle, then each process's CPU over
# 60 s and PostgreSQL's after them, in % of a core, on one line. PostgreSQL's is
# negative when backends that ended meanwhile took their CPU with them.
scale_cpu() {
    local c0=() p0 pid i=0 out=()
    sleep 10
    for pid in "$@"; do c0+=("$(cpu_secs "$pid")"); done
    p0=$(pg_cpu_secs)
    sleep 60
    for pid in "$@"; do
        out+=("$(awk -v a="${c0[$i]}" -v b="$(cpu_secs "$pid")" 'BEGIN { printf "%.1f", (b - a) / 60 * 100 }')")
        i=$((i + 1))
    done
    out+=("$(awk -v a="$p0" -v b="$(pg_cpu_secs)" 'BEGIN { printf "%.1f", (b - a) / 60 * 100 }')")
    echo "${out[*]}"
}

# scale_page PORT OUT: signs in to the server's page with the admin token and fetches the
# agents' list; prints "status seconds bytes" of GET /admin/agents and of the page's /agents.
scale_page() {
    local port=$1 jar=$work/scale-jar base="http://127.0.0.1:$1" csrf admin page
    admin=$(curl -sS -o /dev/null --max-time 120 -w '%{http_code} %{time_total}s %{size_download}B' \
        -H "Authorization: Bearer bench" "$base/admin/agents" || true)
    rm -f "$jar"
    csrf=$({ curl -fsS --max-time 60 -c "$jar" "$base/" || true; } | grep -o 'name="csrf" value="[^"]*"' | head -1 | sed 's/.*value="//; s/"$//' || true)
    curl -fsS -o /dev/null -b "$jar" -c "$jar" -H "Origin: $base" \
        --data-urlencode "csrf=$csrf" --data-urlencode "token=bench" "$base/signin" || true
    page=$(curl -sS -o /dev/null --max-time 120 -b "$jar" -w '%{http_code} %{time_total}s %{size_download}B' "$base/agents" || true)
    echo "$admin $page"
}

# scale_hold: SCALE_HOLD_ROUNDS rounds, each alternating this tree's servers with
# BENCH_BASELINE's (when given): a fresh PostgreSQL, SCALE_SERVERS servers, SCALE_AGENTS
# long-polling agents in one fleet-sim process a server, and once every agent is held,
# each server's CPU over 60 s. The cost of holding a server's share of the fleet, apart
# from a rollout and from a machine the whole 100,000 saturate.
scale_hold() {
    local total=${SCALE_AGENTS:-20000} nserv=${SCALE_SERVERS:-1} h2=${SCALE_HTTP2:-128}
    local ramp=${SCALE_RAMP:-60} rounds=${SCALE_HOLD_ROUNDS:-3}
    local per=$(((total + nserv - 1) / nserv))
    echo "scale hold: $total agents held by $nserv server(s) on one PostgreSQL, $rounds round(s)" >&2
    ulimit -Hn $((per + 4096)) 2>/dev/null || true
    ulimit -n "$(ulimit -Hn)"
    keys
    make_dist "$work/hd" 0
    local b1
    b1=$(pack 1.0.0 "$work/hd" "$work/hb1")
    local variants=(ours) variant round i port pgport
    [[ -n $baseline ]] && variants+=(baseline)
    declare -A cpu=() pgcpu=()
    for round in $(seq "$rounds"); do
        for variant in "${variants[@]}"; do
            server_bin=$bin
            [[ $variant == baseline ]] && server_bin=$baseline/target/release
            pgport=$(free_port)
            start_pg "$pgport"
            fresh_db "$pgport"
            local url="postgres://postgres@127.0.0.1:$pgport/fleet" ports=() spids=() simpids=()
            for ((i = 0; i < nserv; i++)); do
                port=$(free_port)
                sim_server "$work/hs-$i" "$port" "$b1" "UPDATE_SERVER_DATABASE_URL=$url" "UPDATE_SERVER_SERVER_NAME=s$i"
                ports+=("$port") spids+=("$server_pid")
                "$bin/fleet-sim" --agents "$per" --agent-version 1.0.0+1 --heartbeat 30s --long-poll \
                    --ramp "${ramp}s" --download head --server "http://127.0.0.1:$port" \
                    --http2 "$h2" --duration "$((ramp + 400))s" >/dev/null 2>"$work/hs-sim-$i.err" &
                simpids+=($!)
            done
            local held=0 end=$((SECONDS + ramp + 240))
            while ((SECONDS < end)); do
                held=0
                for port in "${ports[@]}"; do held=$((held + $(scale_metric "$port" agentupdate_connects_held))); done
                ((held >= total * 99 / 100)) && break
                sleep 2
            done
            local each=() pid
            read -r -a each <<<"$(scale_cpu "${spids[@]}")"
            local pg=${each[-1]}
            unset 'each[-1]'
            cpu[$variant]+="${each[*]} "
            pgcpu[$variant]+="$pg "
            note "round $round, $variant: $held held; server CPU ${each[*]} %, PostgreSQL CPU $pg %"
            for pid in "${simpids[@]}"; do kill "$pid" 2>/dev/null || true; done
            for pid in "${simpids[@]}" "${spids[@]}"; do
                kill "$pid" 2>/dev/null || true
                wait "$pid" 2>/dev/null || true
            done
            runuser -u postgres -- "$(pg_bin)/pg_ctl" -D "$pgdir/data" -m fast stop >/dev/null 2>&1 || true
            rm -rf "$pgdir"
            pgdir=
        done
    done
    local ours_cpu base_cpu line
    ours_cpu=$(tr ' ' '\n' <<<"${cpu[ours]}" | grep . | spread_as %.1f " %%")
    line="| this tree | $ours_cpu | $(tr ' ' '\n' <<<"${pgcpu[ours]}" | grep . | spread_as %.1f " %%") |"
    if [[ -n $baseline ]]; then
        base_cpu=$(tr ' ' '\n' <<<"${cpu[baseline]}" | grep . | spread_as %.1f " %%")
        line+=$'\n'"| baseline $(git -C "$baseline" rev-parse --short HEAD) | $base_cpu | $(tr ' ' '\n' <<<"${pgcpu[baseline]}" | grep . | spread_as %.1f " %%") |"
        local m=() v
        for v in ours baseline; do
            m+=("$(tr ' ' '\n' <<<"${cpu[$v]}" | grep . | median_of)" "$(tr ' ' '\n' <<<"${pgcpu[$v]}" | grep . | median_of)")
        done
        line+=$'\n'"| this tree / baseline (medians) | $(ratio "${m[0]}" "${m[2]}") | $(ratio "${m[1]}" "${m[3]}") |"
    fi
    write_section scale-hold <<EOF2
## Holding a server's share of the fleet: $per agents a server

\`SCALE_ONLY=hold ${SCALE_AGENTS:+SCALE_AGENTS=$SCALE_AGENTS }${SCALE_SERVERS:+SCALE_SERVERS=$SCALE_SERVERS }${SCALE_HOLD_ROUNDS:+SCALE_HOLD_ROUNDS=$SCALE_HOLD_ROUNDS }$(bench_command scale)\` on $(machine).
$nserv release update-server(s) on one PostgreSQL, each with $per long-polling agents
(heartbeat 30 s, started over $ramp s) of one \`fleet-sim\` process on $h2 HTTP/2
connections: one server's share of the 100,000-agent run (the scale section), without
the four other servers and simulators that saturate the machine there. Once 99 % are held, 10 s,
then each server's CPU over 60 s (100 % is one core) and PostgreSQL's. $rounds round(s)$([[ -n $baseline ]] && echo ", alternating with the baseline's servers"); median (min–max) of every server of every round.

| server | server CPU while holding | PostgreSQL CPU |
|---|---|---|
$line
EOF2
}

bench_scale() {
    if [[ ${SCALE_ONLY:-} == hold ]]; then
        scale_hold
        return
    fi
    local total=${SCALE_AGENTS:-99000} nserv=${SCALE_SERVERS:-5} per=${SCALE_PER_PROC:-19800}
    local ramp=${SCALE_RAMP:-120} bound=${SCALE_SECONDS:-900} h2=${SCALE_HTTP2:-0}
    echo "scale: $total simulated agents on $nserv servers and one PostgreSQL" >&2
    ulimit -Hn $((per + 4096)) 2>/dev/null || true
    ulimit -n "$(ulimit -Hn)"
    local nproc_sim
    if ((h2 > 0)); then
        # Each process's agents share h2 HTTP/2 connections (fleet-sim --http2): a held
        # agent is a stream, not a descriptor.
        nproc_sim=$(((total + per - 1) / per))
    else
        # Each fleet-sim process and each server needs a descriptor per held agent.
        local fits=$(($(ulimit -n) - 200))
        ((per > fits)) && per=$fits
        nproc_sim=$(((total + per - 1) / per))
        ((total / nserv + 128 > $(ulimit -n))) &&
            note "warning: $((total / nserv)) agents per server do not fit its file limit of $(ulimit -n); the rest queue"
    fi
    local h2_args=()
    ((h2 > 0)) && h2_args=(--http2 "$h2")
    keys
    make_dist "$work/sd" 0
    local b1 b2
    b1=$(pack 1.0.0 "$work/sd" "$work/sb1")
    sleep 1
    cp -r "$work/sd" "$work/sd2"
    head -c 65536 /dev/urandom >>"$work/sd2/README.txt"
    b2=$(pack 2.0.0 "$work/sd2" "$work/sb2")
    local pgport
    pgport=$(free_port)
    start_pg "$pgport"
    fresh_db "$pgport"
    local url="postgres://postgres@127.0.0.1:$pgport/fleet"
    local plan=("UPDATE_SERVER_ROLLOUT_WAVES=1%,10%,100%" UPDATE_SERVER_ROLLOUT_MAX_FAILURES=5%
        UPDATE_SERVER_ROLLOUT_WAVE_WAIT=0 UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=600)
    local i port ports=() spids=() urls=()
    for ((i = 0; i < nserv; i++)); do
        port=$(free_port)
        sim_server "$work/ss-$i" "$port" "$b1" "UPDATE_SERVER_DATABASE_URL=$url" \
            "UPDATE_SERVER_SERVER_NAME=s$i" "${plan[@]}"
        ports+=("$port") spids+=("$server_pid") urls+=(--server "http://127.0.0.1:$port")
    done
    # Each process spreads its agents over every server (agent i starts on server i mod n).
    local simpids=() left=$total n t0
    t0=$(date +%s.%N)
    for ((i = 0; i < nproc_sim; i++)); do
        n=$((left < per ? left : per))
        left=$((left - n))
        "$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --long-poll \
            --ramp "${ramp}s" --download head --deltas --install-time 10s --token bench \
            --progress 30s "${urls[@]}" ${h2_args[@]+"${h2_args[@]}"} --until-rollout-end --duration "${bound}s" \
            --json "$work/scale-$i.json" >/dev/null 2>"$work/scale-$i.err" &
        simpids+=($!)
    done
    # Registered: the fleet's database knows every agent, and the servers hold them all.
    local known=0 held="" reg_secs="" end=$((SECONDS + ramp + 300))
    while ((SECONDS < end)); do
        # Counted in the database: a server with no connection free to count leaves the
        # fleet's counts out of /metrics.
        known=$(psql -h 127.0.0.1 -p "$pgport" -U postgres -X -qAt -d fleet -c "SELECT count(*) FROM agents" 2>/dev/null || echo 0)
        # A scrape counts the fleet in the database on every server: not while it fills.
        held=""
        if ((known >= total)); then
            held=0
            for port in "${ports[@]}"; do held=$((held + $(scale_metric "$port" agentupdate_connects_held))); done
        fi
        if ((known >= total && ${held:-0} >= total * 99 / 100)); then
            reg_secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
            break
        fi
        sleep 2
    done
    note "registered: ${reg_secs:-not all} s; $known known, ${held:-not counted (not all known)} held"
    local registered="not all within $((ramp + 300)) s: at the last look $known known (rows in the database), ${held:-not counted (not all known)} held"
    if [[ -n $reg_secs ]]; then registered="$reg_secs s from the first start ($known known, $held held)"; fi
    # Holding: 60 s of CPU per server and of PostgreSQL, RSS, PostgreSQL connections.
    local hold_cpu=() hold_rss=() pid
    read -r -a hold_cpu <<<"$(scale_cpu "${spids[@]}")"
    local pg_cpu=${hold_cpu[-1]} pg_conns
    unset 'hold_cpu[-1]'
    for pid in "${spids[@]}"; do hold_rss+=("$(status_mib VmRSS "$pid")"); done
    # Backends that ended meanwhile take their CPU with them: then it cannot be told.
    [[ $pg_cpu == -* ]] && pg_cpu="n/a (backends came and went)"
    pg_conns=$(psql -h 127.0.0.1 -p "$pgport" -U postgres -X -qAt -c "SELECT count(*) FROM pg_stat_activity WHERE datname = 'fleet'" || echo "?")
    note "holding: server CPU ${hold_cpu[*]} %, RSS ${hold_rss[*]} MiB; PostgreSQL CPU $pg_cpu %, $pg_conns connections"
    # The list of every agent, by the admin API and on the page, at this size.
    local listing
    listing=$(scale_page "${ports[0]}")
    note "/admin/agents and the page's /agents: $listing (status seconds bytes, each)"
    # The release, dropped in on every server (as cloud.sh does).
    for i in "${!ports[@]}"; do serve_bundle "$work/ss-$i" "${ports[$i]}" "$b2"; done
    local pub
    pub=$(date +%s.%N)
    for pid in "${simpids[@]}"; do wait "$pid" || true; done
    local rollout
    rollout=$(curl -fsS --max-time 60 -H "Authorization: Bearer bench" "http://127.0.0.1:${ports[0]}/admin/rollout" || echo '{"waves": []}')
    echo "$rollout" >"$work/scale-rollout.json"
    # Kept past the run (the scratch directory goes): the simulators' summaries and
    # progress, the rollout, the servers' warnings.
    local keep=$root/target/bench-scale
    rm -rf "$keep" && mkdir -p "$keep"
    cp "$work"/scale-*.json "$work"/scale-*.err "$keep/"
    for i in "${!ports[@]}"; do grep -v ' INFO ' "$work/ss-$i.log" | tail -n 200 >"$keep/server-$i.log"; done
    # Who a wave still waits for, as the database has it: told (and the report not in)
    # or never told.
    psql -h 127.0.0.1 -p "$pgport" -U postgres -X -d fleet -c \
        "SELECT wave, told_at IS NOT NULL AS told, count(*) FROM rollout_agents WHERE outcome IS NULL GROUP BY 1, 2 ORDER BY 1, 2" \
        >"$keep/pending.txt" 2>&1 || true
    local peak=()
    for pid in "${spids[@]}"; do peak+=("$(hwm_mib "$pid")"); done
    pg_conns_end=$(psql -h 127.0.0.1 -p "$pgport" -U postgres -X -qAt -c "SELECT count(*) FROM pg_stat_activity WHERE datname = 'fleet'" || echo "?")
    local waves errors state
    state=$(jq -r '"\(.state)\(if .reason then " (" + .reason + ")" else "" end)"' <<<"$rollout")
    waves=$(jq -r '[.waves[] | "\(.size) (\(.agents) agents) \(if .completed_at and .opened_at then ((.completed_at - .opened_at) * 10 | round / 10 | tostring) + " s" else "not completed (\(.pending) pending)" end)"] | join(", ")' <<<"$rollout")
    errors=$(cat "$work"/scale-[0-9]*.json | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')
    local kinds
    kinds=$(cat "$work"/scale-[0-9]*.json | jq -rs 'map(.errors | to_entries) | add // [] | group_by(.key) | map("\(.[0].key): \(map(.value) | add)") | join("; ")')
    note "rollout $state; $waves; errors $errors ${kinds:+($kinds)}"
    pctl() { # pctl ENDPOINT FIELD: that percentile of each process, spread over them
        for i in $(seq 0 $((nproc_sim - 1))); do jq ".endpoints[\"$1\"].$2 // empty" "$work/scale-$i.json"; done | spread_ms
    }
    local knobs=() knob
    for knob in SCALE_AGENTS SCALE_SERVERS SCALE_PER_PROC SCALE_RAMP SCALE_SECONDS SCALE_HTTP2; do
        [[ -n ${!knob:-} ]] && knobs+=("$knob=${!knob}")
    done
    local rollout_secs
    rollout_secs=$(jq -r '(.completed_at // empty) - .started_at | . * 10 | round / 10' <<<"$rollout" 2>/dev/null || true)
    write_section scale <<EOF2
## Scale: $total agents on $nserv servers and one PostgreSQL

\`${knobs[*]:+${knobs[*]} }$(bench_command scale)\` on $(machine). $nproc_sim \`fleet-sim\`
processes of up to $per agents each ($(if ((h2 > 0)); then echo "each process's agents sharing $h2 HTTP/2 connections (\`--http2 $h2\`, h2c): a held agent is a stream of its own, not a descriptor, so the file limit of $(ulimit -n) a process holds"; else echo "the file limit here is $(ulimit -n) descriptors a process, and a held agent takes one in its simulator and one in its server"; fi)), long-polling
(heartbeat 30 s), started over $ramp s, spread over $nserv release update-servers on one
PostgreSQL $("$(pg_bin)/postgres" --version | awk '{ print $3 }') (\`synchronous_commit = off\`, database pool 16
a server); \`--download head --deltas\`, installs of 10 s, no failures. Then 2.0.0 is
dropped in on every server and rolled out in waves \`["1%", "10%", "100%"]\` (no soak).
One run (bounded at $bound s); everything shares the machine's two cores.

| | |
|---|---|
| registered (all known, 99 % held) | $registered |
| rollout | $state, ${rollout_secs:-?} s from the release; $waves |
| errors seen by the agents | $errors${kinds:+ ($kinds)} |
| register p50 / p99 (per process) | $(pctl register p50_ms) / $(pctl register p99_ms) |
| report p50 / p99 (per process) | $(pctl report p50_ms) / $(pctl report p99_ms) |
| server CPU while holding (60 s, each) | ${hold_cpu[*]} % of a core (goal < 10) |
| server RSS while holding / peak (each) | ${hold_rss[*]} / ${peak[*]} MiB (goal < 512) |
| PostgreSQL CPU while holding | $pg_cpu % of a core |
| PostgreSQL connections (fleet) | $pg_conns holding, $pg_conns_end at the end |
| \`GET /admin/agents\`, the page's \`/agents\` (status, seconds, bytes) | $listing |
EOF2
}
