#!/usr/bin/env bash
# scripts/bench.sh update: downtime of an update and of a rollback (default timings) vs a wrapper restart
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh update.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" update "$@"

# total_of LINES PATTERN: the "total Ns" of the first update.log line matching PATTERN.
total_of() { grep -m1 "$2" <<<"$1" | grep -o 'total [0-9.]*s' | grep -o '[0-9.]*'; }

# One update round of the current variant against the server at $1 (home $2): an update
# to $3, a plain wrapper restart, then the broken bundle $4 rolled back with the default
# timings. Appends "update restart rollback" seconds to $5 and the update's step
# breakdown to $5.steps.
update_round() {
    local port=$1 home=$2 good=$3 bad=$4 out=$5 p
    p=$work/up-$vname-$RANDOM
    serve_bundle "$home" "$port" "$good"
    install_agent "$p" "http://127.0.0.1:$port" "export AGENT_UPDATE_STABILITY_WINDOW=1s"
    "$p/agent/current/bin/agent-wrapper.sh" start >/dev/null
    local ul=$p/agent/logs/update.log
    wait_file 120 "$ul" "committed"
    local lines up
    lines=$(cat "$ul")
    up=$(awk -v a="$(total_of "$lines" 'is up')" -v b="$(total_of "$lines" 'old agent')" 'BEGIN { print a - b }')
    for what in "old agent" "configuration" "current ->" "through its wrapper" "is up"; do
        printf '%s %ss; ' "$what" "$(grep -m1 "$what" <<<"$lines" | grep -o 'step [0-9.]*s' | grep -o '[0-9.]*')"
    done >"$out.steps"
    # A plain restart of the same agent, to the same "up" condition.
    local before t0 t1 restart
    before=$(cat "$p/agent/run/agent.pid")
    t0=$(date +%s.%N)
    "$p/agent/current/bin/agent-wrapper.sh" restart >/dev/null
    until [[ -f $p/agent/run/health.json ]] && grep -q '"components_started": true' "$p/agent/run/health.json" &&
        ! grep -q "\"pid\": $before," "$p/agent/run/health.json"; do sleep 0.01; done
    t1=$(date +%s.%N)
    restart=$(awk -v a="$t1" -v b="$t0" 'BEGIN { print a - b }')
    # Then a broken bundle (its agent exits at once), rolled back with every update
    # timing at its default: what a user gets.
    printf '\n' >"$p/agent/conf/agent-env.sh"
    serve_bundle "$home" "$port" "$bad"
    wait_file 180 "$ul" "rolled back to"
    lines=$(grep -F -- '-> 3.0.0+1]' "$ul")
    local back
    back=$(awk -v a="$(total_of "$lines" 'started 2.0.0+1 again')" -v b="$(total_of "$lines" 'old agent')" 'BEGIN { print a - b }')
    echo "$up $restart $back" >>"$out"
    stop_home "$p/agent"
}

bench_update() {
    echo "update: downtime of an update and of a rollback vs a wrapper restart" >&2
    keys
    local home=$work/update-server port
    mkdir -p "$home/downloads/agent"
    port=$(free_port)
    start_server "$home" "$port" RUST_LOG=warn
    local variants=(ours) v
    [[ -n $baseline ]] && variants+=(baseline)
    declare -A good bad
    for v in "${variants[@]}"; do
        use_variant "$v"
        base_bundle >/dev/null
        make_dist "$work/ud-$v" 20
        good[$v]=$(pack 2.0.0 "$work/ud-$v" "$work/ub-$v")
        cp -a "$work/ud-$v" "$work/ubad-dist-$v"
        printf '#!/bin/sh\nexit 1\n' >"$work/ubad-dist-$v/bin/agent"
        bad[$v]=$(pack 3.0.0 "$work/ubad-dist-$v" "$work/ubad-$v")
    done
    # Rounds alternate between the variants; a baseline rollback waits out its whole
    # health timeout (60 s), so it gets three rounds to our five.
    local i
    for i in 1 2 3 4 5; do
        for v in "${variants[@]}"; do
            [[ $v == baseline && $i -gt 3 ]] && continue
            use_variant "$v"
            note "round $i, $v"
            update_round "$port" "$home" "${good[$v]}" "${bad[$v]}" "$work/update-$v.txt"
        done
    done
    use_variant ours
    local names=("update (old agent's exit to new agent up)"
        "\`agent-wrapper.sh restart\` (the peer)"
        "rollback of a version that exits at once (old agent's exit to old agent up)")
    local rows="" col
    for col in 1 2 3; do
        local row
        row="| ${names[$((col - 1))]} | $(awk -v c="$col" '{ print $c }' "$work/update-ours.txt" | spread)"
        if [[ -n $baseline ]]; then
            row+=" | $(awk -v c="$col" '{ print $c }' "$work/update-baseline.txt" | spread)"
        fi
        rows+="$row |"$'\n'
    done
    local mu mr mb
    mu=$(awk '{ print $1 }' "$work/update-ours.txt" | median_of)
    mr=$(awk '{ print $2 }' "$work/update-ours.txt" | median_of)
    mb=$(awk '{ print $3 }' "$work/update-ours.txt" | median_of)
    local head="| | this tree |" rule="|---|---|"
    if [[ -n $baseline ]]; then
        head="| | this tree | baseline $(git -C "$baseline" rev-parse --short HEAD) |"
        rule="|---|---|---|"
    fi
    note "downtime: update $mu s, rollback $mb s, wrapper restart $mr s"
    write_section update <<EOF
## Updater: downtime

\`$(bench_command update)\` on $(machine). A release agent with a 20 MiB
distribution and a release update-server on loopback; median (min–max) of 5 rounds
(3 for the baseline), alternating between the trees. Update downtime: from the old agent's
exit (as the updater sees it) to the new agent up (alive, right version, components
started; the stability window, 1 s here, follows and the agent already serves during it).
Rollback: a bundle whose agent exits at once, with the default \`update.health-timeout\`
(60 s) and \`update.stability-window\` (10 s), from the old agent's exit to the old version
started again. The peer is \`agent-wrapper.sh restart\` of the same agent to the same
condition.

$head
$rule
${rows}
Ratios to a wrapper restart (this tree, medians): update $(ratio "$mu" "$mr") (target ≤ 2),
rollback $(ratio "$mb" "$mr").

Where an update's downtime goes (steps of the last run's \`logs/update.log\`): $(sed 's/; $//' "$work/update-ours.txt.steps").
The unpack (with an fsync of every file) happens before the old agent stops: the agent
keeps serving until the journal shows the new version on disk, so the downtime is the
stop, the configuration merge, the switch and the start. A rollback is the crash
detection (the wrapper sees the new agent exit before it reports itself), the stop of its
supervisor, the switch back and the old agent's start.
EOF
}
