#!/usr/bin/env bash
# scripts/bench.sh fleet: 30 agents through a download limit of 5 with Retry-After 1
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh fleet.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" fleet "$@"

# One fleet round of the current variant serving bundle $2: 30 agents at once through
# the limit; appends "wall 503s-median slot-use peak" to $1.
fleet_round() {
    local out=$1 n=30 limit=5 home port
    home=$work/fleet-server-$vname-$RANDOM
    mkdir -p "$home/downloads/agent"
    port=$(free_port)
    start_server "$home" "$port" RUST_LOG=warn UPDATE_SERVER_DOWNLOADS_LIMIT=$limit \
        UPDATE_SERVER_DOWNLOADS_RETRY_AFTER=1 UPDATE_SERVER_ADMIN_TOKEN=bench
    serve_bundle "$home" "$port" "$2"
    local i env="export AGENT_UPDATE_STABILITY_WINDOW=1s
export AGENT_UPDATE_HEALTH_TIMEOUT=120s"
    local prefix=$work/fleet-$vname-$RANDOM
    for i in $(seq 1 "$n"); do install_agent "$prefix-$i" "http://127.0.0.1:$port" "$env"; done
    local t0
    t0=$(date +%s.%N)
    local starters=()
    for i in $(seq 1 "$n"); do
        "$prefix-$i/agent/current/bin/agent-wrapper.sh" start >/dev/null &
        starters+=($!)
    done
    wait "${starters[@]}" || note "a wrapper start reported failure; its supervisor keeps trying"
    # Sample the slots while any agent still waits for its download.
    local sum=0 samples=0 done_dl installed inflight
    while :; do
        done_dl=$({ grep -l "downloaded" "$prefix"-*/agent/logs/agent.log 2>/dev/null || true; } | wc -l)
        ((done_dl >= n)) && break
        inflight=$(curl -fsS "http://127.0.0.1:$port/metrics" | awk '$1 == "agentupdate_downloads_in_flight" { print $2 }' || echo 0)
        sum=$(awk -v s="$sum" -v v="${inflight:-0}" 'BEGIN { print s + v }')
        samples=$((samples + 1))
        sleep 0.1
    done
    until installed=$(curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/agents" |
        jq '[.[] | select(.update_status == "INSTALLED" and .version == "2.0.0+1")] | length') && ((installed >= n)); do
        sleep 0.1
    done
    local wall busy use peak
    wall=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')
    busy=$(for i in $(seq 1 "$n"); do grep -c "server busy (503" "$prefix-$i/agent/logs/agent.log" || true; done | median_of)
    use=$(awk -v s="$sum" -v k="$samples" -v l="$limit" 'BEGIN { if (k == 0) print "0"; else printf "%.2f", s / k / l }')
    peak=$(curl -fsS "http://127.0.0.1:$port/metrics" | awk '$1 == "agentupdate_downloads_in_flight_peak" { print $2 }')
    note "fleet ($vname): $n INSTALLED in $wall s; median 503s per agent $busy; slot use $use; peak $peak"
    echo "$wall $busy $use $peak" >>"$out"
    for i in $(seq 1 "$n"); do stop_home "$prefix-$i/agent"; done
}

bench_fleet() {
    local pad=${FLEET_PAD_MIB:-0}
    echo "fleet: 30 agents, limit 5, Retry-After 1, distribution padded by $pad MiB" >&2
    keys
    local variants=(ours) v
    [[ -n $baseline ]] && variants+=(baseline)
    declare -A bundle size
    for v in "${variants[@]}"; do
        use_variant "$v"
        base_bundle >/dev/null
        make_dist "$work/fd-$v" "$pad"
        bundle[$v]=$(pack 2.0.0 "$work/fd-$v" "$work/fb-$v")
        size[$v]=$(awk -v b="$(stat -c %s "${bundle[$v]}")" 'BEGIN { printf "%.1f", b / 1048576 }')
    done
    local i
    for i in 1 2 3; do
        for v in "${variants[@]}"; do
            use_variant "$v"
            fleet_round "$work/fleet-$v.txt" "${bundle[$v]}"
        done
    done
    use_variant ours
    local head="| measure | this tree |" rule="|---|---|"
    local r1="| bundle size | ${size[ours]} MiB" r2 r3 r4 r5
    r2="| wall time, start to the 30th \`INSTALLED\` | $(awk '{ print $1 }' "$work/fleet-ours.txt" | spread)"
    r3="| \`503\`s per agent (median over agents, median of rounds) | $(awk '{ print $2 }' "$work/fleet-ours.txt" | median_of)"
    r4="| slot use while any agent waits (mean in flight / limit) | $(awk '{ print $3 }' "$work/fleet-ours.txt" | median_of)"
    r5="| peak downloads in flight (server, most of any round) | $(awk '{ print $4 }' "$work/fleet-ours.txt" | sort -n | tail -1)"
    if [[ -n $baseline ]]; then
        head+=" baseline $(git -C "$baseline" rev-parse --short HEAD) |"
        rule+="---|"
        r1+=" | ${size[baseline]} MiB"
        r2+=" | $(awk '{ print $1 }' "$work/fleet-baseline.txt" | spread)"
        r3+=" | $(awk '{ print $2 }' "$work/fleet-baseline.txt" | median_of)"
        r4+=" | $(awk '{ print $3 }' "$work/fleet-baseline.txt" | median_of)"
        r5+=" | $(awk '{ print $4 }' "$work/fleet-baseline.txt" | sort -n | tail -1)"
    fi
    write_section fleet <<EOF
## Fleet: 30 agents through a download limit of 5

\`$(bench_command fleet)\` on $(machine). 30 release agents (1.0.0), each in its own
home, started at once through their wrappers against a release update-server serving
2.0.0 (the real distribution: the agent and its wrapper, padded by $pad MiB) with
\`downloads.limit = 5\` and \`Retry-After: 1\`, all on loopback on one machine (agents,
updaters and server share its cores). Median (min–max) of 3 rounds per tree, alternating.

$head
$rule
$r1 |
$r2 |
$r3 |
$r4 |
$r5 |
EOF
}
