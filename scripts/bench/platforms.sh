#!/usr/bin/env bash
# scripts/bench.sh platforms: bundles for x86_64 and aarch64, glibc and static musl: size; the musl and glibc agent's RSS and update time; a 10,000-agent rollout of a three-platform release vs a one-platform one
#   PLATFORMS_ONLY=size|update|fleet runs one part and prints it, BENCHMARKS.md untouched;
#   PLATFORMS_ROUNDS (default 5: size/RSS and update), PLATFORMS_FLEET_ROUNDS (default 3),
#   PLATFORMS_AGENTS (default 10000)
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh platforms.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, root, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" platforms "$@"

PLATFORM_GNU=x86_64-unknown-linux-gnu
PLATFORM_MUSL=x86_64-unknown-linux-musl
PLATFORM_ARM=aarch64-unknown-linux-gnu
PLATFORM_ARM_MUSL=aarch64-unknown-linux-musl

# The cross targets' tools: rustup targets, musl-gcc, Debian's aarch64 gcc (ring has C code).
platform_tools() {
    local pkgs=()
    command -v musl-gcc >/dev/null || pkgs+=(musl-tools)
    command -v aarch64-linux-gnu-gcc >/dev/null || pkgs+=(gcc-aarch64-linux-gnu)
    if ((${#pkgs[@]})); then
        if [[ $(id -u) -ne 0 ]]; then
            echo "bench.sh platforms: missing ${pkgs[*]}; install them (apt-get install ${pkgs[*]})" >&2
            exit 1
        fi
        apt-get install -y -qq "${pkgs[@]}" >/dev/null
    fi
    rustup target add "$PLATFORM_MUSL" "$PLATFORM_ARM" "$PLATFORM_ARM_MUSL" >/dev/null 2>&1 || {
        echo "bench.sh platforms: rustup target add $PLATFORM_MUSL $PLATFORM_ARM $PLATFORM_ARM_MUSL failed" >&2
        exit 1
    }
}

# platform_release V B: release builds of this tree packed by scripts/build-dist.sh as
# version V build B for every platform, as $work/platforms/V/agent-bundle-V-TARGET (the
# glibc one from the release build common.sh made, packed as this machine's platform).
platform_release() {
    local version=$1 build=$2 out=$work/platforms/$1
    AGENT_BIN_DIR=$bin scripts/build-dist.sh --version "$version" --build "$build" \
        --key "$work/keys/update.key" --out "$out/gnu" >/dev/null
    mv "$out/gnu/agent-bundle-$version" "$out/agent-bundle-$version-$PLATFORM_GNU"
    mv "$out/gnu/agent-bundle-$version.minisig" "$out/agent-bundle-$version-$PLATFORM_GNU.minisig"
    scripts/build-dist.sh --version "$version" --build "$build" --key "$work/keys/update.key" \
        --out "$out" --target "$PLATFORM_MUSL" --target "$PLATFORM_ARM" --target "$PLATFORM_ARM_MUSL" >/dev/null
}

# The RSS (MiB) of `agent run` installed from bundle $1 under $2, PLATFORMS_SETTLE seconds
# after it starts (no server answers: it runs its loop and backs off, as a cut-off agent).
platform_rss() {
    local bundle=$1 prefix=$2
    rm -rf "$prefix"
    "$bundle" --install="$prefix" >/dev/null
    printf '[server]\nurls = ["http://127.0.0.1:9"]\n[agent]\nheartbeat = "1s"\n' >"$prefix/agent/conf/agent.toml"
    "$prefix/agent/current/bin/agent" run >/dev/null 2>&1 &
    local pid=$!
    sleep "${PLATFORMS_SETTLE:-3}"
    awk '$1 == "VmRSS:" { printf "%.1f", $2 / 1024 }' "/proc/$pid/status"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# platform_update TARGET ROUND: seconds from 2.0.0's bundle for TARGET appearing in the download
# directory of a server that serves 1.0.0 to the agent (installed from 1.0.0's bundle for
# TARGET, long-polling as agents do by default) reporting 2.0.0+2 to that server: the
# server's scan, the answer to the held connect, download, verification, swap, start of
# the new agent and its first report.
platform_update() {
    local target=$1 port home=$work/pu-server-$1-$2 prefix=$work/pu-agent-$1-$2 t0 t1
    local b1=$work/platforms/1.0.0/agent-bundle-1.0.0-$target b2=$work/platforms/2.0.0/agent-bundle-2.0.0-$target
    port=$(free_port)
    sim_server "$home" "$port" "$b1"
    rm -rf "$prefix"
    "$b1" --install="$prefix" >/dev/null
    printf '[server]\nurls = ["http://127.0.0.1:%s"]\n[agent]\nheartbeat = "1s"\n' "$port" >"$prefix/agent/conf/agent.toml"
    # As the end-to-end tests run it: a 1 s stability window (the update reports after it).
    printf 'export AGENT_UPDATE_STABILITY_WINDOW=1s\n' >"$prefix/agent/conf/agent-env.sh"
    "$prefix/agent/current/bin/agent-wrapper.sh" start >/dev/null
    until_true 30 "the $target agent to report 1.0.0+1" one_agent_at "$port" 1.0.0+1
    t0=$(date +%s.%N)
    drop_bundle "$home/downloads/agent" "$b2"
    if ! until_true 120 "the $target agent to report 2.0.0+2" one_agent_at "$port" 2.0.0+2; then
        # No number for an update that did not happen: what the agent says, then stop.
        tail -n 20 "$prefix/agent/logs/update.log" "$prefix/agent/logs/wrapper.log" >&2 || true
        stop_home "$prefix/agent"
        stop_server
        return 1
    fi
    t1=$(date +%s.%N)
    stop_home "$prefix/agent"
    stop_server
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}

# serve_release HOME PORT BUNDLE...: makes these bundles (agent-bundle-V-TARGET, or one
# lone agent-bundle-V) the server's release, signatures first, every file renamed into
# place whole; returns once /agentupdate/version describes the first.
serve_release() {
    local home=$1 port=$2 dir=$1/downloads/agent b sha
    shift 2
    rm -f "$dir"/agent-bundle-*
    mkdir -p "$dir/.staging"
    for b in "$@"; do
        cp "$b" "$dir/.staging/"
        cp "$b.minisig" "$dir/.staging/"
    done
    for b in "$@"; do mv "$dir/.staging/$(basename "$b").minisig" "$dir/"; done
    for b in "$@"; do mv "$dir/.staging/$(basename "$b")" "$dir/"; done
    sha=$(sha256sum "$1" | cut -d' ' -f1)
    until_true 30 "the server to serve $(basename "$1")" \
        sh -c "curl -fsS http://127.0.0.1:$port/agentupdate/version 2>/dev/null | grep -q agent.latest.sha256=$sha"
}

# platform_rollout KIND ROUND: a fleet-sim rollout of 2.0.0 over PLATFORMS_AGENTS agents at
# 1.0.0; KIND one: a release of one (glibc) bundle, every agent on this machine's
# platform; three: a release of three, the fleet a third on each. Prints the rollout's
# seconds as the server recorded them (start to completion).
platform_rollout() {
    local kind=$1 round=$2 port home=$work/pr-server n=${PLATFORMS_AGENTS:-10000} v
    local r1=() r2=() mix=() files=()
    for v in 1.0.0 2.0.0; do
        local dir=$work/platforms/$v
        if [[ $kind == one ]]; then
            # A lone agent-bundle-V: a release of the one platform its properties name.
            mkdir -p "$dir/lone"
            cp "$dir/agent-bundle-$v-$PLATFORM_GNU" "$dir/lone/agent-bundle-$v"
            cp "$dir/agent-bundle-$v-$PLATFORM_GNU.minisig" "$dir/lone/agent-bundle-$v.minisig"
            files=("$dir/lone/agent-bundle-$v")
        else
            files=("$dir/agent-bundle-$v-$PLATFORM_GNU" "$dir/agent-bundle-$v-$PLATFORM_MUSL" "$dir/agent-bundle-$v-$PLATFORM_ARM")
        fi
        if [[ $v == 1.0.0 ]]; then r1=("${files[@]}"); else r2=("${files[@]}"); fi
    done
    [[ $kind == three ]] && mix=(--platform "$PLATFORM_MUSL=0.333" --platform "$PLATFORM_ARM=0.333")
    port=$(free_port)
    rm -rf "$home"
    mkdir -p "$home/downloads/agent"
    start_server "$home" "$port" RUST_LOG=warn UPDATE_SERVER_ADMIN_TOKEN=bench \
        "UPDATE_SERVER_ROLLOUT_WAVES=1%,10%,100%" UPDATE_SERVER_ROLLOUT_MAX_FAILURES=5% \
        UPDATE_SERVER_ROLLOUT_WAVE_WAIT=0 UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=600
    serve_release "$home" "$port" "${r1[@]}"
    local json=$work/pr-$kind-$round.json
    "$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --ramp 10s --long-poll \
        --download head --install-time 5s --fail-rate 0 --token bench --progress 30s "${mix[@]}" \
        --server "http://127.0.0.1:$port" --until-rollout-end --duration 300s --json "$json" \
        >/dev/null 2>"$work/pr-$kind-$round.err" &
    local sim_pid=$!
    # The whole fleet joined (started over 10 s) and holding its connects.
    sleep 20
    serve_release "$home" "$port" "${r2[@]}"
    wait "$sim_pid" || true
    # What the server recorded: the agents by platform and update status.
    local by
    by=$(curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/agents" |
        jq -r 'group_by(.platform + " " + (.update_status // "-")) | map("\(length) \(.[0].platform) \(.[0].update_status // "-")") | join(", ")')
    stop_server
    note "round $round, $kind platform(s): $(jq -r '.rollout | "\(.state) after \(.seconds // "?") s"' "$json"), errors $(jq '[.errors[]] | add // 0' "$json"); agents: $by"
    jq -e '.rollout.state == "completed"' "$json" >/dev/null || {
        echo "bench.sh platforms: the $kind-platform rollout of round $round did not complete; see $work/pr-$kind-$round.err" >&2
        return 1
    }
    jq -r '.rollout.seconds' "$json"
}

bench_platforms() {
    local only=${PLATFORMS_ONLY:-} rounds=${PLATFORMS_ROUNDS:-5} fleet_rounds=${PLATFORMS_FLEET_ROUNDS:-3}
    local n=${PLATFORMS_AGENTS:-10000}
    echo "platforms: bundles of this tree for x86_64 and aarch64, glibc and static musl${only:+ ($only only)}" >&2
    platform_tools
    keys
    platform_release 1.0.0 1
    sleep 1 # signed-at has one-second resolution: 2.0.0 must be signed after 1.0.0
    platform_release 2.0.0 2
    local t b sizes=()
    for t in "$PLATFORM_GNU" "$PLATFORM_MUSL" "$PLATFORM_ARM" "$PLATFORM_ARM_MUSL"; do
        b=$work/platforms/1.0.0/agent-bundle-1.0.0-$t
        sizes+=("$(($(stat -c %s "$b") / 1024))")
        note "$t: ${sizes[-1]} KiB"
    done

    # RSS and update time, glibc and musl alternated each round, so that the machine's
    # noise falls on both alike.
    local gnu_rss=() musl_rss=() gnu_up=() musl_up=() r
    if [[ -z $only || $only == size || $only == update ]]; then
        for ((r = 1; r <= rounds; r++)); do
            if [[ $only != update ]]; then
                gnu_rss+=("$(platform_rss "$work/platforms/1.0.0/agent-bundle-1.0.0-$PLATFORM_GNU" "$work/rss-gnu")")
                musl_rss+=("$(platform_rss "$work/platforms/1.0.0/agent-bundle-1.0.0-$PLATFORM_MUSL" "$work/rss-musl")")
                note "round $r: RSS glibc ${gnu_rss[-1]} MiB, musl ${musl_rss[-1]} MiB"
            fi
            if [[ $only != size ]]; then
                t=$(platform_update "$PLATFORM_GNU" "$r") || exit 1
                gnu_up+=("$t")
                t=$(platform_update "$PLATFORM_MUSL" "$r") || exit 1
                musl_up+=("$t")
                note "round $r: update glibc ${gnu_up[-1]} s, musl ${musl_up[-1]} s"
            fi
        done
    fi

    # The fleet-sim rollouts, one platform and three alternated.
    local one=() three=()
    if [[ -z $only || $only == fleet ]]; then
        for ((r = 1; r <= fleet_rounds; r++)); do
            t=$(platform_rollout one "$r") || exit 1
            one+=("$t")
            t=$(platform_rollout three "$r") || exit 1
            three+=("$t")
        done
    fi

    local rss_row="" update_row="" fleet_row=""
    if ((${#gnu_rss[@]})); then
        rss_row="| agent RSS once up | $(printf '%s\n' "${gnu_rss[@]}" | spread_as %.1f " MiB") | $(printf '%s\n' "${musl_rss[@]}" | spread_as %.1f " MiB") | $(ratio "$(printf '%s\n' "${musl_rss[@]}" | median_of)" "$(printf '%s\n' "${gnu_rss[@]}" | median_of)") |"
    fi
    if ((${#gnu_up[@]})); then
        update_row="| update, 2.0.0 dropped in → agent reports it | $(printf '%s\n' "${gnu_up[@]}" | spread) | $(printf '%s\n' "${musl_up[@]}" | spread) | $(ratio "$(printf '%s\n' "${musl_up[@]}" | median_of)" "$(printf '%s\n' "${gnu_up[@]}" | median_of)") |"
    fi
    if ((${#one[@]})); then
        fleet_row="| $n | $(printf '%s\n' "${one[@]}" | spread) | $(printf '%s\n' "${three[@]}" | spread) | $(ratio "$(printf '%s\n' "${three[@]}" | median_of)" "$(printf '%s\n' "${one[@]}" | median_of)") |"
    fi
    if [[ -n $only ]]; then
        printf 'sizes (KiB): %s %s %s %s\n%s\n%s\n%s\n' "${sizes[@]}" "$rss_row" "$update_row" "$fleet_row"
        echo "platforms: PLATFORMS_ONLY=$only, BENCHMARKS.md left as it was" >&2
        return
    fi

    write_section platforms <<EOF
## Platforms: x86_64 and aarch64, glibc and static musl, one release

\`PLATFORMS_ROUNDS=$rounds PLATFORMS_FLEET_ROUNDS=$fleet_rounds $(bench_command platforms)\` on $(machine).
Release builds of this tree packed by \`scripts/build-dist.sh\` (\`--target T\` for each
platform but this machine's own, whose bundle is the plain build's); median (min–max) over
the rounds, the compared things alternated within each round.

**Bundle size** (version 1.0.0, each bundle's stub is its platform's \`agent-bundle\`):

| x86_64-unknown-linux-gnu | x86_64-unknown-linux-musl | aarch64-unknown-linux-gnu | aarch64-unknown-linux-musl |
|---|---|---|---|
| ${sizes[0]} KiB | ${sizes[1]} KiB | ${sizes[2]} KiB | ${sizes[3]} KiB |

**The static musl agent against the glibc one** (x86_64). RSS: \`agent run\`
${PLATFORMS_SETTLE:-3} s after it starts, no workload, no server answering. Update: a
server serving 1.0.0 and the agent installed from that platform's 1.0.0 bundle
(long-polling, as agents do by default; 1 s stability window), then 2.0.0's bundle
renamed into the download directory; the time from then until \`/admin/agents\` shows
the agent at 2.0.0+2 (the server's scan once a second, the held connect answered, the
download, verification, swap, the new agent's start and first report).

| | x86_64-unknown-linux-gnu | x86_64-unknown-linux-musl (static) | ratio (musl / glibc) |
|---|---|---|---|
$rss_row
$update_row

aarch64 runs here only under qemu-user (the end-to-end tests do so): its RSS and times
would measure qemu's translator, not the agent, so they are not reported.

**A rollout of a release of three platforms against one.** \`fleet-sim\`, $n agents at
1.0.0+1 (long polls, heartbeat 30 s, started over 10 s, \`--download head\`, installs of
5 s, none failing) against one update-server on SQLite; 2.0.0 dropped in 20 s after the
start, waves \`["1%", "10%", "100%"]\` with no soak; time from the rollout's start to its
completion as the server recorded it. *One*: a lone \`agent-bundle-2.0.0\` (glibc) and
every agent on x86_64 glibc. *Three*: \`agent-bundle-2.0.0-T\` for x86_64 glibc, x86_64
musl and aarch64 glibc, and a third of the fleet on each (\`--platform
$PLATFORM_MUSL=0.333 --platform $PLATFORM_ARM=0.333\`, spread so every wave mixes them),
each asking for its own platform's bundle.

| agents | one platform | three platforms | ratio (three / one) |
|---|---|---|---|
$fleet_row
EOF
}
