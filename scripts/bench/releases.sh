#!/usr/bin/env bash
# scripts/bench.sh releases: a real agent's `release rollback` to the version it kept vs its
# forward update to a new release, alternating, with the bundle bytes each sent; then
# 10,000 fleet-sim agents' rollback vs a forward rollout of the same release
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh releases.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" releases "$@"

# agent_at URL ID VERSION [STATUS]: whether the agent ID runs VERSION (and reported
# STATUS for it, when given).
agent_at() {
    curl -fsS -H "Authorization: Bearer bench" "$1/admin/agents" 2>/dev/null |
        jq -e --arg id "$2" --arg v "$3" --arg s "${4:-}" \
            '.[] | select(.id == $id and .version == $v and ($s == "" or .update_status == $s))' >/dev/null
}

# wait_agent URL ID VERSION [STATUS]: polls until agent_at, for at most two minutes.
wait_agent() { until_true 120 "agent $2 to report $3${4:+ $4}" agent_at "$@"; }

bundle_bytes() {
    curl -fsS "$1/metrics" | awk -F' ' '/^agentupdate_bytes_sent_total\{kind="(bundle|delta)"\}/ { s += $2 } END { printf "%d", s }'
}

# rollout_done URL VERSION: prints "seconds" (completed_at - started_at) once the fleet's
# rollout of VERSION has completed; polls for at most ten minutes.
rollout_done() {
    local end=$((SECONDS + 600)) r
    while ((SECONDS < end)); do
        r=$(curl -fsS -H "Authorization: Bearer bench" "$1/admin/rollout" 2>/dev/null || true)
        if jq -e --arg v "$2" '.version == $v and .state == "completed"' <<<"$r" >/dev/null 2>&1; then
            jq -r '.completed_at - .started_at' <<<"$r"
            return 0
        fi
        sleep 0.2
    done
    echo "bench.sh: the rollout of $2 did not complete; last: $r" >&2
    return 1
}

# The fleet half: RELEASES_AGENTS fleet-sim agents (long polls, deltas) on one server. Each
# round rolls forward to B (timed), forward again to C, then back to B, which every agent
# kept (timed): the same release's rollout forward and as a rollback. Appends "forward
# rollback forward_bytes rollback_bytes" per round to $work/releases-fleet.txt.
releases_fleet() {
    local n=$1 rounds=$2 port url
    ulimit -Hn $((n * 2 + 4096)) 2>/dev/null || true
    ulimit -n "$(ulimit -Hn)"
    make_dist "$work/relf-dist" 1
    local b1
    b1=$(pack 1.0.0 "$work/relf-dist" "$work/relf-b1")
    port=$(free_port)
    url=http://127.0.0.1:$port
    sim_server "$work/relf-server" "$port" "$b1" UPDATE_SERVER_BUNDLE_PUBLIC_KEY="$work/keys/update.pub"
    local release=("$bin/update-server" release --server "$url" --token bench)
    "$bin/fleet-sim" --server "$url" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --long-poll \
        --ramp 30s --install-time 2s --download full --deltas --duration 3600s --token bench \
        --json "$work/relf.json" >/dev/null 2>"$work/relf.err" &
    local sim=$!
    pids+=("$sim")
    local end=$((SECONDS + 300))
    until [[ $(curl -fsS "$url/metrics" | awk '/^agentupdate_agents\{/ { s += $2 } END { print s + 0 }') -ge $n ]]; do
        ((SECONDS < end)) || { echo "bench.sh: the simulated fleet never registered" >&2; return 1; }
        sleep 1
    done
    : >"$work/releases-fleet.txt"
    local r b c t0 b0 forward back fbytes bbytes
    for r in $(seq 1 "$rounds"); do
        sleep 1 # signed-at has one-second resolution: each release is newer
        echo "b $r" >"$work/relf-dist/lib/round.txt"
        b=$(pack "2.0.$r" "$work/relf-dist" "$work/relf-b-$r")
        b0=$(bundle_bytes "$url")
        "${release[@]}" publish "$b" >/dev/null
        forward=$(rollout_done "$url" "2.0.$r+1")
        fbytes=$(($(bundle_bytes "$url") - b0))
        sleep 1
        echo "c $r" >"$work/relf-dist/lib/round.txt"
        c=$(pack "3.0.$r" "$work/relf-dist" "$work/relf-c-$r")
        "${release[@]}" publish "$c" >/dev/null
        rollout_done "$url" "3.0.$r+1" >/dev/null
        rm -rf "$work/relf-back"
        "${release[@]}" export --release "2.0.$r+1" --out "$work/relf-back" >/dev/null
        "$bin/agent-bundle" sign --key "$work/keys/update.key" "$work/relf-back/agent-bundle-2.0.$r" >/dev/null
        b0=$(bundle_bytes "$url")
        "${release[@]}" rollback --to "2.0.$r+1" --signatures "$work/relf-back" >/dev/null
        back=$(rollout_done "$url" "2.0.$r+1")
        bbytes=$(($(bundle_bytes "$url") - b0))
        note "fleet round $r: forward ${forward}s ($fbytes bytes), rollback ${back}s ($bbytes bytes)"
        echo "$forward $back $fbytes $bbytes" >>"$work/releases-fleet.txt"
    done
    kill "$sim" 2>/dev/null || true
    wait "$sim" 2>/dev/null || true
    stop_server
}

bench_releases() {
    echo "releases: rollback to the kept version vs a forward update, one real agent" >&2
    local rounds=${RELEASES_ROUNDS:-5} mib=${RELEASES_MIB:-20} agents=${RELEASES_AGENTS:-10000}
    local fleet_rounds=${RELEASES_FLEET_ROUNDS:-3}
    keys
    local home=$work/releases-server port url
    mkdir -p "$home/downloads/agent"
    port=$(free_port)
    url=http://127.0.0.1:$port
    start_server "$home" "$port" RUST_LOG=warn UPDATE_SERVER_ADMIN_TOKEN=bench \
        UPDATE_SERVER_BUNDLE_PUBLIC_KEY="$work/keys/update.pub"
    local release=("$bin/update-server" release --server "$url" --token bench)
    make_dist "$work/rel-dist" "$mib"
    local base
    base=$(base_bundle)
    "${release[@]}" publish "$base" >/dev/null
    install_agent "$work/rel-agent" "$url" "export AGENT_UPDATE_STABILITY_WINDOW=1s"
    "$work/rel-agent/agent/current/bin/agent-wrapper.sh" start >/dev/null
    local id
    wait_file 60 "$work/rel-agent/agent/data/agent-id" "."
    id=$(cat "$work/rel-agent/agent/data/agent-id")
    wait_agent "$url" "$id" 1.0.0+1
    # The version rolled back to: as big as the releases rolled forward to, kept by the
    # agent from then on (each forward update keeps the version it leaves).
    echo "kept" >"$work/rel-dist/lib/round.txt"
    "${release[@]}" publish "$(pack 1.5.0 "$work/rel-dist" "$work/rel-kept")" >/dev/null
    wait_agent "$url" "$id" 1.5.0+1 INSTALLED
    sleep 1 # signed-at has one-second resolution: the next release is newer
    : >"$work/releases.txt"
    local i t0 t1 b0 forward back fbytes bbytes new
    for i in $(seq 1 "$rounds"); do
        # A new release (packed now: signed after what the agent runs), forward.
        echo "round $i" >"$work/rel-dist/lib/round.txt"
        new=$(pack "2.0.$i" "$work/rel-dist" "$work/rel-b$i")
        b0=$(bundle_bytes "$url")
        t0=$(date +%s.%N)
        "${release[@]}" publish "$new" >/dev/null
        wait_agent "$url" "$id" "2.0.$i+1" INSTALLED
        t1=$(date +%s.%N)
        forward=$(awk -v a="$t1" -v b="$t0" 'BEGIN { print a - b }')
        fbytes=$(($(bundle_bytes "$url") - b0))
        # Back to 1.5.0, which the agent kept: its bytes signed again, then the rollback.
        rm -rf "$work/rel-back"
        "${release[@]}" export --release 1.5.0+1 --out "$work/rel-back" >/dev/null
        "$bin/agent-bundle" sign --key "$work/keys/update.key" "$work/rel-back/agent-bundle-1.5.0" >/dev/null
        b0=$(bundle_bytes "$url")
        t0=$(date +%s.%N)
        "${release[@]}" rollback --to 1.5.0+1 --signatures "$work/rel-back" >/dev/null
        wait_agent "$url" "$id" 1.5.0+1 INSTALLED
        t1=$(date +%s.%N)
        back=$(awk -v a="$t1" -v b="$t0" 'BEGIN { print a - b }')
        bbytes=$(($(bundle_bytes "$url") - b0))
        note "round $i: forward ${forward}s ($fbytes bytes), rollback ${back}s ($bbytes bytes)"
        echo "$forward $back $fbytes $bbytes" >>"$work/releases.txt"
        sleep 1 # signed-at has one-second resolution: the next release is newer
    done
    stop_home "$work/rel-agent/agent"
    kill "$server_pid" 2>/dev/null || true
    releases_fleet "$agents" "$fleet_rounds"
    local fleet_f fleet_b
    fleet_f=$(awk '{ print $1 }' "$work/releases-fleet.txt" | median_of)
    fleet_b=$(awk '{ print $2 }' "$work/releases-fleet.txt" | median_of)
    local mf mb size
    mf=$(awk '{ print $1 }' "$work/releases.txt" | median_of)
    mb=$(awk '{ print $2 }' "$work/releases.txt" | median_of)
    size=$(stat -c %s "$new")
    write_section releases <<EOF
## Releases: a rollback from the kept version against a forward update

\`$(bench_command releases)\` (RELEASES_ROUNDS=$rounds, RELEASES_MIB=$mib) on $(machine).
One release agent (stability window 1 s) and a release update-server on loopback;
bundles of $(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1048576 }') MiB, the kept one as big as the new ones. Each round publishes a
new release (\`release publish\`) and times it to the agent's \`INSTALLED\` on it, then
rolls back to 1.5.0, which the agent kept (\`release export --release\`, \`agent-bundle
sign\`, \`release rollback\`), timed from the rollback command to \`INSTALLED\` on 1.5.0.
Forward and rollback alternate, $rounds rounds; median (min–max). Bytes are the server's bundle
and delta bytes sent (\`agentupdate_bytes_sent_total\`) during each.

| | time to INSTALLED | bundle + delta bytes sent |
|---|---|---|
| forward update to a new release | $(awk '{ print $1 }' "$work/releases.txt" | spread) | $(awk '{ print $3 }' "$work/releases.txt" | spread_as %.0f) |
| \`release rollback\` to the kept version | $(awk '{ print $2 }' "$work/releases.txt" | spread) | $(awk '{ print $4 }' "$work/releases.txt" | spread_as %.0f) |

A rollback takes $(ratio "$mb" "$mf") of a forward update's time (medians) and sends no
bundle byte: the agent verifies the kept bundle against the new signature, switches and
checks health, which the forward update does too after its download (or delta).
Each forward release differs from the one before by one small file, so a forward update
mostly takes a delta of a few hundred bytes (a round whose delta was not made yet
downloads the whole bundle): even against a delta of a few hundred bytes the kept
version is faster, and against a whole download on a real network the gap only grows.

**A fleet.** $agents \`fleet-sim\` agents (long polls, \`--deltas\`, installs of 2 s, every
agent keeping the bundle it ran before, as real agents do) on one release update-server;
waves \`["100%"]\`. Each of $fleet_rounds rounds rolls forward to release B (timed), forward
again to C, then \`release rollback\` to B (timed): the same release, rolled out forward and
as a rollback. Time is the server's, from the rollout's start to its last agent
\`INSTALLED\`; bytes as above.

| | rollout time | bundle + delta bytes sent |
|---|---|---|
| forward rollout of B | $(awk '{ print $1 }' "$work/releases-fleet.txt" | spread) | $(awk '{ print $3 }' "$work/releases-fleet.txt" | spread_as %.0f) |
| \`release rollback\` to B | $(awk '{ print $2 }' "$work/releases-fleet.txt" | spread) | $(awk '{ print $4 }' "$work/releases-fleet.txt" | spread_as %.0f) |

The fleet's rollback takes $(ratio "$fleet_b" "$fleet_f") of the forward rollout's time (medians) and sends
no byte. Here the forward rollouts take deltas of under a kilobyte per agent, so both
are paced by the server taking 10,000 agents' reports (SQLite, one server), not by
bytes: what the rollback saves a fleet is the whole of the bytes (and a download source
or delta worker it would otherwise need), and its time where bytes are the limit.
EOF
}
