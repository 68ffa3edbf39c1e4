#!/usr/bin/env bash
# scripts/bench.sh delta: bytes per agent of a delta against the whole bundle (one configuration file changed, the workload replaced, the agent rebuilt after a small code change) beside bsdiff, zstd --patch-from and xdelta3; time and memory to make and apply one
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh delta.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, root, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" delta "$@"

# delta_dist DIR AGENT [WORKLOAD]: a distribution carrying this agent binary and this
# workload program (the node exporter, as in the workload benchmark); without one, the
# reference distribution scripts/build-dist.sh assembles.
delta_dist() {
    local dir=$1
    mkdir -p "$dir/bin" "$dir/conf.default"
    cp "$2" "$dir/bin/agent"
    [[ -z ${3:-} ]] || cp "$3" "$dir/bin/workload"
    cp "$bin/agent-service" "$dir/bin/agent-service"
    cp "$root/installer/agent-wrapper.sh" "$dir/bin/agent-wrapper.sh"
    cp "$root/installer/agent.toml" "$dir/conf.default/agent.toml"
    cp "$root/installer/README.txt" "$dir/README.txt"
    cp "$root/LICENSE" "$dir/LICENSE"
}

# delta_measure TOOL OLD NEW OUT: makes OUT with TOOL; prints "seconds peak-KiB".
delta_measure() {
    local tool=$1 old=$2 new=$3 out=$4 t=$work/time.txt
    rm -f "$out"
    case $tool in
    ours) /usr/bin/time -f '%e %M' -o "$t" "$bin/agent-bundle" delta "$old" "$new" --out "$out" >/dev/null ;;
    bsdiff) /usr/bin/time -f '%e %M' -o "$t" bsdiff "$old" "$new" "$out" ;;
    zstd) /usr/bin/time -f '%e %M' -o "$t" zstd -q -19 --long=27 --patch-from="$old" "$new" -o "$out" 2>/dev/null ;;
    xdelta3) /usr/bin/time -f '%e %M' -o "$t" xdelta3 -e -9 -f -s "$old" "$new" "$out" ;;
    apply) /usr/bin/time -f '%e %M' -o "$t" "$bin/agent-bundle" apply-delta "$old" "$new" --out "$out" >/dev/null ;;
    esac
    tail -1 "$t"
}

# delta_fleet MODE OLD NEW JSON: a fleet-sim rollout of NEW to DELTA_AGENTS agents running
# OLD, with deltas (MODE=deltas) or whole bundles (MODE=whole); writes the sim's JSON and
# appends "bundle-bytes delta-bytes" sent (the server's /metrics) to JSON.bytes.
delta_fleet() {
    local mode=$1 old=$2 new=$3 json=$4 port
    port=$(free_port)
    sim_server "$work/delta-srv" "$port" "$old" UPDATE_SERVER_ROLLOUT_WAVES=1%,10%,100% \
        UPDATE_SERVER_ROLLOUT_WAVE_WAIT=0 UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=600
    local extra=()
    [[ $mode == deltas ]] && extra=(--deltas)
    "$bin/fleet-sim" --server "http://127.0.0.1:$port" --agents "${DELTA_AGENTS:-10000}" \
        --agent-version 1.0.0+1 --heartbeat 30s --long-poll --ramp 20s --install-time 2s \
        --download full --until-rollout-end --duration 600s --token bench --progress 30s \
        --json "$json" "${extra[@]}" >/dev/null 2>"$json.err" &
    local sim_pid=$!
    # Every agent has registered on OLD (and, with deltas, learned its sha256) first.
    sleep 25
    serve_bundle "$work/delta-srv" "$port" "$new"
    wait "$sim_pid"
    curl -fsS "http://127.0.0.1:$port/metrics" | awk '
        /^agentupdate_bytes_sent_total\{kind="bundle"\}/ { b = $2 }
        /^agentupdate_bytes_sent_total\{kind="delta"\}/ { d = $2 }
        END { printf "%.0f %.0f\n", b, d }' >"$json.bytes"
    stop_server
}

# The [profile.release] settings the binaries were built with, and each package's
# overrides ([profile.release.package.NAME]), on one line.
release_profile() {
    awk '/^\[profile.release\]/ { on = 1; next }
        /^\[profile.release.package./ { on = 1; name = $0; gsub(/^\[profile.release.package.|"|\]$/, "", name); printf "; %s: ", name; sep = ""; next }
        /^\[/ { on = 0 }
        on && /=/ { gsub(/ /, ""); printf "%s%s", sep, $0; sep = ", " }' "$root/Cargo.toml"
}

bench_delta() {
    echo "delta: deltas between bundles of this tree vs bsdiff, zstd --patch-from, xdelta3" >&2
    local need=()
    command -v bsdiff >/dev/null || need+=(bsdiff)
    command -v xdelta3 >/dev/null || need+=(xdelta3)
    command -v zstd >/dev/null || need+=(zstd)
    command -v prometheus-node-exporter >/dev/null || need+=(prometheus-node-exporter)
    command -v shellcheck >/dev/null || need+=(shellcheck)
    if ((${#need[@]})); then apt-get install -y -qq "${need[@]}" >/dev/null; fi
    keys
    local d=$work/delta
    mkdir -p "$d"
    # Two release builds of this checkout, one line of the agent's code apart
    # (scripts/bench/agent-change.patch, applied for the second build and taken back out
    # however the run ends), built as the first was; then the plain build again so the
    # other benchmarks measure this tree.
    local change=$root/scripts/bench/agent-change.patch
    cp "$bin/agent" "$d/agent-1"
    git -C "$root" apply --check "$change" || {
        echo "bench.sh delta: $change no longer applies to crates/agent; make it again against this tree" >&2
        exit 1
    }
    git -C "$root" apply "$change"
    on_exit+=("git -C '$root' apply -R '$change'")
    local built=0
    cargo build --release --locked --bins >&2 || built=$?
    git -C "$root" apply -R "$change"
    on_exit=()
    ((built == 0)) || exit "$built"
    cp "$bin/agent" "$d/agent-2"
    cargo build --release --locked --bins >&2
    if cmp -s "$d/agent-1" "$d/agent-2"; then
        echo "bench.sh delta: the two agent builds are identical; the change had no effect" >&2
        exit 1
    fi
    if ! cmp -s "$d/agent-1" "$bin/agent"; then
        echo "bench.sh delta: two builds of the same source differ: the build is not reproducible, which every delta pays for" >&2
    fi
    local exporter other
    exporter=$(command -v prometheus-node-exporter)
    # The replacement workload has nothing in common with the old one: the worst case,
    # where a delta can only send the new program.
    other=$(command -v shellcheck)

    delta_dist "$d/v1" "$d/agent-1" "$exporter"
    local cases=(config workload agent)
    delta_dist "$d/config" "$d/agent-1" "$exporter"
    printf '\n# release 1.0.1: one line of configuration\n' >>"$d/config/conf.default/agent.toml"
    delta_dist "$d/workload" "$d/agent-1" "$other"
    delta_dist "$d/agent" "$d/agent-2" "$exporter"
    # The same rebuilt agent in the reference distribution (no workload): what a fleet
    # of plain agents downloads.
    delta_dist "$d/v1-plain" "$d/agent-1"
    delta_dist "$d/plain" "$d/agent-2"
    cases+=(plain)
    local old old_plain
    old=$(pack 1.0.0 "$d/v1" "$d/out-v1")
    old_plain=$(pack 1.0.0 "$d/v1-plain" "$d/out-v1-plain")
    local c
    for c in "${cases[@]}"; do
        pack 1.0.1 "$d/$c" "$d/out-$c" >/dev/null
    done
    old_of() { if [[ $1 == plain ]]; then echo "$old_plain"; else echo "$old"; fi; }
    # The two agent binaries alone, for reference: what bsdiff makes of the change.
    bsdiff "$d/agent-1" "$d/agent-2" "$d/agent-bin.bsdiff"

    local rounds=${DELTA_ROUNDS:-3} tools=(ours bsdiff zstd xdelta3)
    declare -A size time mem apply_time apply_mem
    local r tool m new
    for ((r = 1; r <= rounds; r++)); do
        for c in "${cases[@]}"; do
            new=$d/out-$c/agent-bundle-1.0.1
            for tool in "${tools[@]}"; do
                m=$(delta_measure "$tool" "$(old_of "$c")" "$new" "$d/$c.$tool")
                size[$c.$tool]=$(stat -c %s "$d/$c.$tool")
                time[$c.$tool]+="${m% *} "
                mem[$c.$tool]+="${m#* } "
            done
            m=$(delta_measure apply "$(old_of "$c")" "$d/$c.ours" "$d/$c.rebuilt")
            cmp -s "$d/$c.rebuilt" "$new" || { echo "bench.sh delta: $c: the rebuilt bundle differs from the packed one" >&2; exit 1; }
            apply_time[$c]+="${m% *} "
            apply_mem[$c]+="${m#* } "
            note "round $r $c: ours ${size[$c.ours]} B, bsdiff ${size[$c.bsdiff]} B, zstd ${size[$c.zstd]} B, xdelta3 ${size[$c.xdelta3]} B"
        done
    done

    # The rollout of the rebuilt agent to a simulated fleet, with deltas and without,
    # alternating.
    local sim_rounds=${DELTA_SIM_ROUNDS:-2} agents=${DELTA_AGENTS:-10000} mode
    for ((r = 1; r <= sim_rounds; r++)); do
        for mode in deltas whole; do
            delta_fleet "$mode" "$old" "$d/out-agent/agent-bundle-1.0.1" "$d/fleet-$mode-$r.json"
            note "fleet round $r, $mode: $(jq -r '.rollout | "\(.state) in \(.seconds // "?") s"' "$d/fleet-$mode-$r.json"), sent (bundle delta) $(cat "$d/fleet-$mode-$r.json.bytes")"
        done
    done
    local fleet_text
    if ((sim_rounds > 0)); then
        fleet_row() { # fleet_row MODE LABEL
            local f=("$d"/fleet-"$1"-*.json) x
            printf '| %s | %s | %s | %s | %s |\n' "$2" \
                "$(for x in "${f[@]}"; do jq -r '.rollout.seconds // empty' "$x"; done | spread_as %.1f " s")" \
                "$(for x in "${f[@]}"; do awk '{ print ($1 + $2) / 1048576 }' "$x.bytes"; done | spread_as %.0f " MiB")" \
                "$(for x in "${f[@]}"; do awk -v n="$agents" '{ print ($1 + $2) / n / 1024 }' "$x.bytes"; done | spread_as %.1f " KiB")" \
                "$(for x in "${f[@]}"; do jq -r '"\(.deltas_taken) / \(.delta_fallbacks)"' "$x"; done | paste -sd, - | sed 's/,/, /g')"
        }
        local fleet_rows
        fleet_rows="$(fleet_row deltas "deltas (\`--deltas\`)")"$'\n'"$(fleet_row whole "whole bundles")"
        local dsec wsec dbytes wbytes
        dsec=$(for x in "$d"/fleet-deltas-*.json; do jq -r '.rollout.seconds // empty' "$x"; done | median_of)
        wsec=$(for x in "$d"/fleet-whole-*.json; do jq -r '.rollout.seconds // empty' "$x"; done | median_of)
        dbytes=$(cat "$d"/fleet-deltas-*.json.bytes | awk '{ print $1 + $2 }' | median_of)
        wbytes=$(cat "$d"/fleet-whole-*.json.bytes | awk '{ print $1 + $2 }' | median_of)
        fleet_text=$(
            cat <<EOF
A rollout of the rebuilt agent (waves 1 %, 10 %, 100 %, no soak, installs of 2 s) to
$agents \`fleet-sim\` agents long-polling one server on loopback, with deltas and with whole
bundles, alternating (\`DELTA_SIM_ROUNDS=${sim_rounds}\`). Bytes are what the server's \`/metrics\`
counts as sent (\`agentupdate_bytes_sent_total\`, bundles and deltas); the time is the
rollout's, from its start to its end; median (min–max):

| | rollout time | bytes sent | per agent | updates by delta / fell back (per run) |
|---|---|---|---|---|
${fleet_rows}

Deltas against whole bundles: $(awk -v a="$dbytes" -v b="$wbytes" 'BEGIN { printf "%.1f %%", a * 100 / b }') of the bytes, $(awk -v a="$dsec" -v b="$wsec" 'BEGIN { printf "%.0f %%", a * 100 / b }') of the time. With two runs a side, the median shown is the lower one.
EOF
        )
    else
        fleet_text="The fleet-sim rollout of the rebuilt agent was not run in this run (\`DELTA_SIM_ROUNDS=0\`)."
    fi

    local bundle share
    bundle=$(stat -c %s "$d/out-agent/agent-bundle-1.0.1")
    # The new workload's share of its bundle, compressed as the packer compresses it.
    share=$(gzip -6 -c "$other" | wc -c)
    pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f %%", a * 100 / b }'; }
    cell() { printf '%s B (%s)' "$1" "$(pct "$1" "$2")"; }
    mem_spread() { tr ' ' '\n' | grep . | awk '{ print $1 / 1024 }' | spread_as %.0f " MiB"; }
    local rows="" label b
    for c in "${cases[@]}"; do
        case $c in
        config) label="one configuration file changed" ;;
        workload) label="workload replaced (node exporter → another program)" ;;
        agent) label="agent rebuilt after a one-line code change" ;;
        plain) label="the same, reference distribution (agent, no workload)" ;;
        esac
        b=$(stat -c %s "$d/out-$c/agent-bundle-1.0.1")
        rows+="| $label | $b B | $(cell "${size[$c.ours]}" "$b") | $(cell "${size[$c.bsdiff]}" "$b") | $(cell "${size[$c.zstd]}" "$b") | $(cell "${size[$c.xdelta3]}" "$b") |"$'\n'
    done
    local trows=""
    for c in "${cases[@]}"; do
        trows+="| $c | $(tr ' ' '\n' <<<"${time[$c.ours]}" | grep . | spread) | $(mem_spread <<<"${mem[$c.ours]}") | $(tr ' ' '\n' <<<"${apply_time[$c]}" | grep . | spread) | $(mem_spread <<<"${apply_mem[$c]}") | $(tr ' ' '\n' <<<"${time[$c.bsdiff]}" | grep . | spread) / $(mem_spread <<<"${mem[$c.bsdiff]}") | $(tr ' ' '\n' <<<"${time[$c.zstd]}" | grep . | spread) / $(mem_spread <<<"${mem[$c.zstd]}") | $(tr ' ' '\n' <<<"${time[$c.xdelta3]}" | grep . | spread) / $(mem_spread <<<"${mem[$c.xdelta3]}") |"$'\n'
    done

    write_section delta <<EOF
## Deltas: bytes per agent against the whole bundle

\`scripts/bench.sh delta\` on $(machine) (\`DELTA_ROUNDS=${rounds}\`; the four makers
alternate within each round). Release builds of this tree (release profile: $(release_profile)).
The first three bundles carry the agent, its wrapper and defaults, and the node exporter
($(stat -c %s "$exporter") B) as its workload; the last is the reference distribution
(\`scripts/build-dist.sh\`'s: the agent, its wrapper and defaults, no workload). The old
bundle is 1.0.0, each new one 1.0.1 with one change. The rebuilt agent is a second release
build of this checkout with one line of its code changed
(\`scripts/bench/agent-change.patch\`: a floor under \`retry_after_wait\`, a function
inlined where it is called). \`ours\` is
\`agent-bundle delta\`, the maker the server runs; the peers are run on the two whole bundle
files: \`bsdiff\` (4.3), \`zstd -19 --long=27 --patch-from\`, \`xdelta3 -e -9 -s\`. Every round
checks that \`agent-bundle apply-delta\` rebuilds the new bundle byte for byte.

| release | bundle | ours | bsdiff | zstd --patch-from | xdelta3 |
|---|---|---|---|---|---|
${rows}
Targets: one file under 1 %; the workload replaced no more than its compressed share
($share B, $(pct "$share" "$(stat -c %s "$d/out-workload/agent-bundle-1.0.1")") of that bundle:
the new program has nothing in common with the old one, so every maker must send it);
the agent rebuilt under 2.5 % of the reference bundle, and that bundle no larger than
7 MiB (7340032 B): it is $(stat -c %s "$d/out-plain/agent-bundle-1.0.1") B. For reference, \`bsdiff\` of the two agent
binaries alone ($(stat -c %s "$d/agent-2") B) is $(stat -c %s "$d/agent-bin.bsdiff") B.

Time and peak memory (GNU time's maximum RSS), median (min–max) over the rounds:

| release | ours: make | ours: make, memory | ours: apply | ours: apply, memory | bsdiff: make | zstd: make | xdelta3: make |
|---|---|---|---|---|---|---|---|
${trows}
${fleet_text}

Ours diffs each changed file's uncompressed bytes (bsdiff's suffix sort, one core, files
up to 64 MiB) and names every unchanged file's compressed bytes in the old bundle, so its
cost follows what changed, not the bundle's size. Applying holds one changed file (old and
new) in memory at a time.
EOF
}
