#!/usr/bin/env bash
# scripts/bench.sh maintenance: fleet-sim at 10,000 agents: a rollout to a group whose
#   maintenance window opens a minute after the release vs the same rollout with no window
#   (bytes sent before the opening, opening to last INSTALLED vs publish to last INSTALLED)
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh maintenance.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" maintenance "$@"

# maint_bytes PORT: "bundle delta" bytes the server sent so far (its /metrics).
maint_bytes() {
    curl -fsS "http://127.0.0.1:$1/metrics" | awk '
        /^agentupdate_bytes_sent_total\{kind="bundle"\}/ { b = $2 }
        /^agentupdate_bytes_sent_total\{kind="delta"\}/ { d = $2 }
        END { printf "%.0f %.0f\n", b, d }'
}

# sleep_until UNIX_SECONDS
sleep_until() {
    local left
    left=$(awk -v t="$1" -v now="$(date +%s.%N)" 'BEGIN { d = t - now; print (d > 0 ? d : 0) }')
    sleep "$left"
}

# maint_round MODE ROUND: one rollout of b2 to the fleet, its group with a window that opens
# 60 s after the release is published (MODE=window) or none (MODE=none). Writes the
# sim's JSON and "opens before-bundle before-delta end-bundle end-delta" to JSON.bytes.
maint_round() {
    local mode=$1 round=$2 port json=$work/maint-$1-$2.json
    port=$(free_port)
    # The window opens on a whole minute (HH:MM) at least 105 s away: 45 s for the fleet
    # to register, then the release, then a minute.
    local t0 opens publish
    t0=$(date +%s)
    opens=$(((t0 + 105 + 59) / 60 * 60))
    publish=$((opens - 60))
    server_args=()
    if [[ $mode == window ]]; then
        cat >"$work/maint.toml" <<EOF
[[maintenance]]
groups = ["db"]
start = "$(date -u -d "@$opens" +%H:%M)"
duration = "30m"
timezone = "UTC"
EOF
        server_args=(--config "$work/maint.toml")
    fi
    sim_server "$work/ms" "$port" "$maint_b1" UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=900
    server_args=()
    "$bin/fleet-sim" --server "http://127.0.0.1:$port" --agents "$maint_n" --group db=1 \
        --agent-version 1.0.0+1 --heartbeat 30s --long-poll --ramp 30s --install-time 10s \
        --download full --deltas --until-rollout-end --duration 900s --token bench --progress 30s \
        --json "$json" >/dev/null 2>"$json.err" &
    local sim_pid=$!
    sleep_until "$publish"
    serve_bundle "$work/ms" "$port" "$maint_b2"
    # Everything fetched ahead is fetched by the opening; taken a second before it.
    local before=("-" "-")
    if [[ $mode == window ]]; then
        sleep_until "$((opens - 1))"
        read -r -a before < <(maint_bytes "$port")
    fi
    wait "$sim_pid"
    local after
    after=$(maint_bytes "$port")
    echo "$opens ${before[*]} $after" >"$json.bytes"
    curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/rollout" >"$json.rollout"
    stop_server
}

bench_maintenance() {
    maint_n=${MAINTENANCE_AGENTS:-10000}
    local rounds=${MAINTENANCE_ROUNDS:-3}
    echo "maintenance: $maint_n simulated agents, a window opening a minute after the release vs none" >&2
    ulimit -Hn $((maint_n * 2 + 4096)) 2>/dev/null || true
    ulimit -n "$(ulimit -Hn)"
    keys
    use_variant ours
    # Two releases a small change apart (64 KiB of the payload differ), so a delta is
    # what an agent fetches, as a fleet updating between builds does.
    make_dist "$work/md1" 1
    cp -r "$work/md1" "$work/md2"
    head -c 65536 /dev/urandom >>"$work/md2/lib/blob.bin"
    maint_b1=$(pack 1.0.0 "$work/md1" "$work/mb1")
    sleep 1
    maint_b2=$(pack 2.0.0 "$work/md2" "$work/mb2")
    local round mode
    for round in $(seq "$rounds"); do
        for mode in window none; do
            maint_round "$mode" "$round"
            local j=$work/maint-$mode-$round.json
            note "round $round, $mode: $(jq -r '.rollout | "\(.state) after \(.seconds // "?") s"' "$j"), bytes $(cat "$j.bytes"), ahead $(jq .ahead_taken "$j") agents, errors $(jq '[.errors[]] | add // 0' "$j")"
        done
    done

    # Per round: the share (in %) of the bytes sent before the opening; time from the
    # opening (window) or the publish (none) to the rollout's completion (its last
    # INSTALLED: a wave completes when its agents have committed).
    local shares=() bshares=() wtimes=() ntimes=() werr=0 nerr=0 ahead=() j opens b0 d0 b1 d1
    for round in $(seq "$rounds"); do
        j=$work/maint-window-$round.json
        read -r opens b0 d0 b1 d1 <"$j.bytes"
        shares+=("$(awk -v a="$((b0 + d0))" -v b="$((b1 + d1))" 'BEGIN { printf "%.1f", b ? a / b * 100 : 0 }')")
        bshares+=("$(awk -v b0="$b0" -v d0="$d0" -v b1="$b1" -v d1="$d1" 'BEGIN { printf "%.1f MiB of %.1f MiB bundles, %.1f MiB of %.1f MiB deltas", b0 / 1048576, b1 / 1048576, d0 / 1048576, d1 / 1048576 }')")
        wtimes+=("$(jq --argjson o "$opens" '.rollout.ended_at // empty | . - $o' "$j")")
        ahead+=("$(jq .ahead_taken "$j")")
        werr=$((werr + $(jq '[.errors[]] | add // 0' "$j")))
        j=$work/maint-none-$round.json
        ntimes+=("$(jq '.rollout.seconds // empty' "$j")")
        nerr=$((nerr + $(jq '[.errors[]] | add // 0' "$j")))
    done
    local kinds
    kinds=$(cat "$work"/maint-window-*.json | jq -rs 'map(.errors | to_entries) | add // [] | group_by(.key) | map("\(map(.value) | add) \(.[0].key)") | join(", ")')
    local outcome
    outcome=$(for j in "$work"/maint-*-*.json; do jq -r '.rollout.state // "none seen"' "$j"; done | sort | uniq -c | awk '{ printf "%s%s× %s", (NR > 1 ? ", " : ""), $1, $2 }')
    local knobs=() knob
    for knob in MAINTENANCE_AGENTS MAINTENANCE_ROUNDS; do
        [[ -n ${!knob:-} ]] && knobs+=("$knob=${!knob}")
    done
    write_section maintenance <<EOF2
## Maintenance windows: a fleet downloads ahead and installs at the opening

\`${knobs[*]:+${knobs[*]} }$(bench_command maintenance)\` on $(machine). One release
update-server (SQLite) and \`fleet-sim\` with $maint_n agents of group \`db\` on loopback,
long-polling (heartbeat 30 s, started over 30 s), \`--deltas --download full\` (each agent
asks a delta from the bundle it runs, the whole bundle on a \`404\`), installs of 10 s.
The release (2.0.0, $(awk -v b="$(stat -c %s "$maint_b2")" 'BEGIN { printf "%.1f MiB", b / 1048576 }'), 64 KiB of its payload changed) is dropped in 45–105 s after the
start; waves \`["100%"]\`. With a window, \`[[maintenance]] groups = ["db"]\` opens on the
whole minute 60 s after the release (duration 30 m): the agents, told the release and
the opening (\`WAITING_WINDOW\`), fetch it ahead as real agents do
(\`update.download-ahead\`) and install when the server wakes their held connects at the
opening. Without one, they are told at the release and fetch then. $rounds rounds of each,
alternating; median (min–max). Bytes are the server's own count (\`/metrics\`), a second
before the opening and at the rollout's end; the time ends at the rollout's completion
as the server recorded it (its last agent \`INSTALLED\`).

| | window a minute after the release | no window |
|---|---|---|
| bytes sent before the opening (share of the rollout's) | $(printf '%s\n' "${shares[@]}" | spread_as %.1f " %%") | – |
| agents holding the release at the opening | $(printf '%s\n' "${ahead[@]}" | spread_as %s) of $maint_n | – |
| time to the last \`INSTALLED\` | $(printf '%s\n' "${wtimes[@]}" | spread) from the opening | $(printf '%s\n' "${ntimes[@]}" | spread) from the release |
| errors seen by the agents | $werr${kinds:+ ($kinds)} | $nerr |

Rollouts: $outcome. At the opening the server wakes every held connect of the group at
once (paced by the download slots it hands out, which agents holding the release do not
take), and all of them report, install and report again together, where a rollout
without a window spreads them over the downloads. Their reports and first \`409\`s are
written as a group commit (\`agent_fleet::group\`: what arrives while a write is under
way goes in the next one), not a transaction each. Bytes per window round (before the opening, of all the rollout
sent): $(printf '%s; ' "${bshares[@]}")
EOF2
}
