#!/usr/bin/env bash
# scripts/bench.sh scale: fleet-sim processes of up to SCALE_PER_PROC long-polling agents
#   against SCALE_SERVERS servers on one PostgreSQL, waves 1%,10%,100% (with deltas);
#   SCALE_HTTP2=N: each process's agents share N HTTP/2 connections (fleet-sim --http2);
#   SCALE_DEPLOYMENTS=N: the agents in N groups d1..dN, and once they are held N
#   deployments (selector group=dK, release 2.K.0) converge each to its own release
#   (scale_deployments; SCALE_PRINT_ONLY=1 prints it, BENCHMARKS.md untouched)
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

# scale_keep_releases PORT BUNDLE...: the deployments' releases, published and kept in
# the fleet before any agent starts. Each is named for a deployment no agent follows
# (bench-keep, selector `bench-keep`: agents with that label, which none has), so that
# default stays on 1.0.0 and no rollout runs while the fleet registers.
scale_keep_releases() {
    local base="http://127.0.0.1:$1" b
    shift
    until_true 60 "1.0.0+1 in the fleet's releases" \
        sh -c "curl -fsS -H 'Authorization: Bearer bench' $base/admin/releases | grep -q 1.0.0+1"
    curl -fsS --retry 20 --retry-delay 3 -o /dev/null -H "Authorization: Bearer bench" -H "Content-Type: application/json" \
        -d '{"name":"bench-keep","selector":"bench-keep","release":"1.0.0+1"}' "$base/admin/deployments"
    for b in "$@"; do
        curl -fsS --retry 20 --retry-delay 3 -o /dev/null -H "Authorization: Bearer bench" -F "bundle=@$b" -F "sig=@$b.minisig" \
            "$base/admin/releases?deployment=bench-keep"
    done
    note "kept for the deployments: $(curl -fsS -H "Authorization: Bearer bench" "$base/admin/releases" |
        jq -r '[.releases[]?.id // empty] | join(" ")')"
}

# scale_deployments: bench_scale's with SCALE_DEPLOYMENTS=N (its locals are read here).
# The fleet is registered and held; N deployments are created, dK with selector group=dK
# and release 2.K.0+1, each rolling out in [rollout]'s waves; then the fleet's database is
# polled every 5 s until every agent of each group runs its deployment's release and has
# reported it INSTALLED, or SCALE_SECONDS pass. Per deployment: its agents, creation to
# the last INSTALLED a server took (the simulators' record), its rollout as the server
# has it, the simulators' errors of every kind; agents on another deployment's release;
# whether every server is still alive.
scale_deployments() {
    local base="http://127.0.0.1:${ports[0]}" k i
    local pq=(psql -h 127.0.0.1 -p "$pgport" -U postgres -X -qAt -d fleet)
    declare -A want=() created=() seen=()
    for i in "${!sim_n[@]}"; do want[${sim_group[$i]}]=$((${want[${sim_group[$i]}]:-0} + sim_n[i])); done
    for ((k = 1; k <= ndep; k++)); do
        curl -fsS --retry 20 --retry-delay 3 -o /dev/null -H "Authorization: Bearer bench" -H "Content-Type: application/json" \
            -d "{\"name\":\"d$k\",\"selector\":\"group=d$k\",\"release\":\"2.$k.0+1\"}" "$base/admin/deployments"
    done
    local name ms
    while IFS='|' read -r name ms; do
        created[$name]=$(awk -v m="$ms" 'BEGIN { printf "%.3f", m / 1000 }')
    done < <("${pq[@]}" -c "SELECT name, created_at FROM deployments WHERE name ~ '^d[0-9]+$'")
    note "$ndep deployments created (d1..d$ndep, selector group=dK, release 2.K.0+1)"
    local rows="" end=$((SECONDS + bound)) all now next=$((SECONDS + 30)) line
    while :; do
        rows=$("${pq[@]}" -F '|' -c "SELECT agent_group, version, coalesce(update_status, ''), count(*) FROM agents GROUP BY 1, 2, 3" 2>/dev/null || echo "$rows")
        now=$(date +%s.%N)
        all=1 line=""
        for ((k = 1; k <= ndep; k++)); do
            line+=" d$k $(awk -F'|' -v g="d$k" -v r="2.$k.0+1" '$1 == g { n += $4; if ($2 == r && $3 == "INSTALLED") ok += $4 } END { printf "%d/%d", ok, n }' <<<"$rows")"
            [[ -n ${seen[d$k]:-} ]] && continue
            if awk -F'|' -v g="d$k" -v r="2.$k.0+1" -v w="${want[d$k]}" '$1 == g { n += $4; if ($2 == r && $3 == "INSTALLED") ok += $4 } END { exit !(n >= w && ok == n) }' <<<"$rows"; then
                seen[d$k]=$now
            else
                all=0
            fi
        done
        ((all)) && break
        ((SECONDS >= end)) && break
        if ((SECONDS >= next)); then
            note "INSTALLED at their release:$line"
            next=$((SECONDS + 30))
        fi
        sleep 5
    done
    note "INSTALLED at their release:$line$( ((all)) || echo " (not all within $bound s)")"
    # The simulators end (SIGINT: each writes its summary), within 120 s.
    local pid quit=$((SECONDS + 120))
    for pid in "${simpids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
    for pid in "${simpids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < quit)); do sleep 1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    local deps
    deps=$(curl -fsS --max-time 60 -H "Authorization: Bearer bench" "$base/admin/deployments" || echo '{"deployments": []}')
    local keep=$root/target/bench-scale-deployments
    rm -rf "$keep" && mkdir -p "$keep"
    cp "$work"/scale-*.err "$keep/"
    cp "$work"/scale-*.json "$keep/" 2>/dev/null || true
    echo "$deps" >"$keep/deployments.json"
    echo "$rows" >"$keep/agents-by-group.txt"
    for i in "${!ports[@]}"; do grep -v ' INFO ' "$work/ss-$i.log" | tail -n 200 >"$keep/server-$i.log"; done
    # Per deployment.
    local table="" polled rel files agents at last conv errors kinds other busy refused unavail dep rstate rsecs wrong
    local tot_errors=0 worst=""
    for ((k = 1; k <= ndep; k++)); do
        rel="2.$k.0+1" files=()
        for i in "${!sim_group[@]}"; do
            [[ ${sim_group[$i]} == "d$k" && -s $work/scale-$i.json ]] && files+=("$work/scale-$i.json")
        done
        if ((${#files[@]} == 0)); then
            table+="| d$k | no simulator summary (see $keep/scale-*.err) |||||||"$'\n'
            continue
        fi
        agents=$(cat "${files[@]}" | jq -s 'map(.agents) | add')
        at=$(cat "${files[@]}" | jq -s --arg r "$rel" 'map(.versions[$r] // 0) | add')
        last=$(cat "${files[@]}" | jq -s --arg r "$rel" 'map(.last_installed[$r] // empty) | max // empty')
        conv=$(awk -v a="${created[d$k]:-}" -v b="$last" 'BEGIN { if (a == "" || b == "") print "n/a"; else printf "%.1f s", b - a }')
        errors=$(cat "${files[@]}" | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')
        kinds=$(cat "${files[@]}" | jq -rs 'map(.errors | to_entries) | add // [] | group_by(.key) | map("\(.[0].key): \(map(.value) | add)") | join("; ")')
        busy=$(cat "${files[@]}" | jq -s 'map(.busy_503) | add')
        refused=$(cat "${files[@]}" | jq -s 'map(.refused) | add')
        unavail=$(cat "${files[@]}" | jq -s 'map(.unavailable) | add')
        # Agents of this group on another deployment's release: in the simulators, and in
        # the fleet's database at the last look.
        other=$(cat "${files[@]}" | jq -s --arg r "$rel" '[.[].versions | to_entries[] | select(.key != $r and .key != "1.0.0+1") | .value] | add // 0')
        wrong=$(awk -F'|' -v g="d$k" -v r="$rel" '$1 == g && $2 != r && $2 != "1.0.0+1" { n += $4 } END { print n + 0 }' <<<"$rows")
        dep=$(jq -c --arg n "d$k" '.deployments[] | select(.name == $n)' <<<"$deps")
        [[ -n $dep ]] || dep='{}'
        polled="not all"
        [[ -z ${seen[d$k]:-} ]] || polled=$(awk -v a="${created[d$k]:-0}" -v b="${seen[d$k]}" 'BEGIN { printf "%.0f s", b - a }')
        rstate=$(jq -r '.rollout | if . == null then "no rollout" else "\(.state)\(if .reason then " (" + .reason + ")" else "" end)" end' <<<"$dep")
        rsecs=$(jq -r --arg c "${created[d$k]:-0}" '.rollout.completed_at // empty | . - ($c | tonumber) | . * 10 | round / 10' <<<"$dep" 2>/dev/null || true)
        tot_errors=$((tot_errors + errors))
        table+="| d$k | $agents ($(jq -r '.agents // "?"' <<<"$dep") following it at the end) | $rel: $at | $conv | $rstate${rsecs:+, completed $rsecs s after its creation} | $polled | $errors${kinds:+ ($kinds)} | $busy / $refused / $unavail | $other / $wrong |"$'\n'
        note "d$k: $agents agents, $at at $rel; creation to the last INSTALLED $conv; rollout $rstate${rsecs:+ ($rsecs s)}; errors $errors${kinds:+ ($kinds)}; 503 busy $busy, 409 $refused, 503 unavailable $unavail; on another deployment's release $other (simulators) / $wrong (database)"
        [[ $conv == n/a ]] || worst=$(awk -v a="${worst:-0}" -v b="${conv% s}" 'BEGIN { print (b > a ? b : a) }')
    done
    # The servers: each still running? If not, its log's tail.
    local servers="" alive=0 log_errors
    for i in "${!spids[@]}"; do
        log_errors=$(grep -c -E ' ERROR |panicked' "$work/ss-$i.log" || true)
        if kill -0 "${spids[$i]}" 2>/dev/null; then
            alive=$((alive + 1))
            servers+="s$i alive ($log_errors ERROR lines in its log, RSS $(status_mib VmRSS "${spids[$i]}") MiB, peak $(hwm_mib "${spids[$i]}") MiB); "
        else
            servers+="s$i DEAD; "
            note "server s$i is not running; the tail of its log:"
            tail -n 30 "$work/ss-$i.log" >&2
        fi
    done
    note "servers: $alive of $nserv alive at the end: ${servers%; }"
    [[ ${SCALE_PRINT_ONLY:-} == 1 ]] && return
    local knobs=() knob
    for knob in SCALE_AGENTS SCALE_SERVERS SCALE_DEPLOYMENTS SCALE_PER_PROC SCALE_RAMP SCALE_SECONDS SCALE_HTTP2; do
        [[ -n ${!knob:-} ]] && knobs+=("$knob=${!knob}")
    done
    write_section scale-deployments <<EOF2
## Scale with deployments: $total agents in $ndep deployments on $nserv servers

\`${knobs[*]:+${knobs[*]} }$(bench_command scale)\` on $(machine). The scale section's
fleet (release update-servers on one PostgreSQL, long-polling \`fleet-sim\` agents,
heartbeat 30 s, started over $ramp s, \`--download head --deltas\`, installs of 10 s, no
failures), its agents in $ndep groups d1..d$ndep: $nproc_sim \`fleet-sim\` processes, each
of one group. Releases 2.1.0 … 2.$ndep.0 (each its own bytes) are published before the
agents start, named for a deployment no agent follows. Once the fleet is held, $ndep
deployments are created: dK selects \`group=dK\` and names 2.K.0+1, each rolled out in
\`[rollout]\`'s waves \`["1%", "10%", "100%"]\` (no soak; a deployment's release is not the
servers' current one, so it goes whole, not as a delta). Converged: every agent of dK
reported 2.K.0+1 INSTALLED (the database, polled every 5 s). One run, bounded at
$bound s; everything shares the machine's two cores.

Registered: $registered. Server CPU while holding (60 s, each): ${hold_cpu[*]} % of a
core; RSS ${hold_rss[*]} MiB; PostgreSQL CPU $pg_cpu %, $pg_conns connections.

| deployment | agents (simulated) | at its release (simulators) | creation to the last INSTALLED | its rollout (server) | poll saw all | errors seen by its agents | 503 busy / 409 / 503 unavailable | on another release: simulators / database |
|---|---|---|---|---|---|---|---|---|
${table%$'\n'}

Errors of any kind, all deployments: $tot_errors. Slowest deployment: ${worst:-n/a} s. Servers
at the end: $alive of $nserv running (${servers%; }).
EOF2
}

bench_scale() {
    if [[ ${SCALE_ONLY:-} == hold ]]; then
        scale_hold
        return
    fi
    local total=${SCALE_AGENTS:-99000} nserv=${SCALE_SERVERS:-5} per=${SCALE_PER_PROC:-19800}
    local ramp=${SCALE_RAMP:-120} bound=${SCALE_SECONDS:-900} h2=${SCALE_HTTP2:-0}
    local ndep=${SCALE_DEPLOYMENTS:-0}
    echo "scale: $total simulated agents on $nserv servers and one PostgreSQL${SCALE_DEPLOYMENTS:+, $ndep deployments}" >&2
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
    # SCALE_DEPLOYMENTS: a release a deployment, 2.K.0, each a slightly different
    # distribution (its own random bytes).
    local k dep_bundles=()
    for ((k = 1; k <= ndep; k++)); do
        cp -r "$work/sd" "$work/sd-d$k"
        head -c $((65536 + k * 4096)) /dev/urandom >>"$work/sd-d$k/README.txt"
        dep_bundles+=("$(pack "2.$k.0" "$work/sd-d$k" "$work/sb-d$k")")
    done
    local pgport
    pgport=$(free_port)
    start_pg "$pgport"
    fresh_db "$pgport"
    local url="postgres://postgres@127.0.0.1:$pgport/fleet"
    local plan=("UPDATE_SERVER_ROLLOUT_WAVES=1%,10%,100%" UPDATE_SERVER_ROLLOUT_MAX_FAILURES=5%
        UPDATE_SERVER_ROLLOUT_WAVE_WAIT=0 UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=600)
    # Releases are published for the deployments: the servers trust the key that signs them.
    ((ndep > 0)) && plan+=("UPDATE_SERVER_BUNDLE_PUBLIC_KEY=$work/keys/update.pub")
    local i port ports=() spids=() urls=()
    for ((i = 0; i < nserv; i++)); do
        port=$(free_port)
        sim_server "$work/ss-$i" "$port" "$b1" "UPDATE_SERVER_DATABASE_URL=$url" \
            "UPDATE_SERVER_SERVER_NAME=s$i" "${plan[@]}"
        ports+=("$port") spids+=("$server_pid") urls+=(--server "http://127.0.0.1:$port")
    done
    # The processes' sizes and groups: up to $per agents each; with deployments, each
    # process's agents all of one group dK (so that its errors are that deployment's).
    local sim_n=() sim_group=() left=$total n
    if ((ndep > 0)); then
        local gsize np j
        for ((k = 1; k <= ndep; k++)); do
            gsize=$((total / ndep + (k <= total % ndep ? 1 : 0)))
            np=$(((gsize + per - 1) / per))
            for ((j = 0; j < np; j++)); do
                sim_n+=($((gsize / np + (j < gsize % np ? 1 : 0))))
                sim_group+=("d$k")
            done
        done
        nproc_sim=${#sim_n[@]}
        scale_keep_releases "${ports[0]}" "${dep_bundles[@]}"
    else
        for ((i = 0; i < nproc_sim; i++)); do
            n=$((left < per ? left : per))
            left=$((left - n))
            sim_n+=("$n") sim_group+=("")
        done
    fi
    # Each process spreads its agents over every server (agent i starts on server i mod n).
    local simpids=() t0 end_args=(--until-rollout-end --duration "${bound}s")
    # With deployments the simulators run until the bench has seen them converge (or the
    # bound) and stops them (SIGINT: each then writes its summary).
    ((ndep > 0)) && end_args=(--duration "$((ramp + 300 + 600 + bound))s")
    t0=$(date +%s.%N)
    for ((i = 0; i < nproc_sim; i++)); do
        local group_args=()
        [[ -n ${sim_group[$i]} ]] && group_args=(--group "${sim_group[$i]}=1")
        "$bin/fleet-sim" --agents "${sim_n[$i]}" --agent-version 1.0.0+1 --heartbeat 30s --long-poll \
            --ramp "${ramp}s" --download head --deltas --install-time 10s --token bench \
            --progress 30s "${urls[@]}" ${h2_args[@]+"${h2_args[@]}"} ${group_args[@]+"${group_args[@]}"} "${end_args[@]}" \
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
    if ((ndep > 0)); then
        scale_deployments
        return
    fi
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
