#!/usr/bin/env bash
# scripts/bench.sh platforms: the reference bundle for glibc and for static musl (x86_64): size, and the agent's RSS once up
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh platforms.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, root, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" platforms "$@"

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

bench_platforms() {
    echo "platforms: glibc and static musl bundles of this tree" >&2
    keys
    local out=$work/platforms musl=x86_64-unknown-linux-musl
    command -v musl-gcc >/dev/null || apt-get install -y -qq musl-tools >/dev/null
    rustup target add "$musl" >/dev/null 2>&1 || true
    AGENT_BIN_DIR=$bin scripts/build-dist.sh --version 1.0.0 --build 1 --key "$work/keys/update.key" --out "$out/gnu" >&2
    CC_x86_64_unknown_linux_musl=musl-gcc scripts/build-dist.sh --version 1.0.0 --build 1 \
        --key "$work/keys/update.key" --out "$out/musl" --target "$musl" >&2
    local gnu_b musl_b
    gnu_b=$out/gnu/agent-bundle-1.0.0
    musl_b=$out/musl/agent-bundle-1.0.0-$musl
    local gnu_size musl_size
    gnu_size=$(stat -c %s "$gnu_b")
    musl_size=$(stat -c %s "$musl_b")
    # Alternated, so that the machine's noise falls on both alike.
    local rounds=${PLATFORMS_ROUNDS:-5} gnu_rss=() musl_rss=()
    for ((r = 1; r <= rounds; r++)); do
        gnu_rss+=("$(platform_rss "$gnu_b" "$work/rss-gnu")")
        musl_rss+=("$(platform_rss "$musl_b" "$work/rss-musl")")
        note "round $r: glibc ${gnu_rss[-1]} MiB, musl ${musl_rss[-1]} MiB"
    done
    local g m
    g=$(printf '%s\n' "${gnu_rss[@]}" | spread_as %.1f " MiB")
    m=$(printf '%s\n' "${musl_rss[@]}" | spread_as %.1f " MiB")
    local gm mm
    gm=$(printf '%s\n' "${gnu_rss[@]}" | median_of)
    mm=$(printf '%s\n' "${musl_rss[@]}" | median_of)

    write_section platforms <<EOF
## Platforms: the glibc and the static musl bundle

\`scripts/bench.sh platforms\` on $(machine) (\`PLATFORMS_ROUNDS=${rounds}\`, alternating). Release
builds of this tree, packed by \`scripts/build-dist.sh\` (\`--target $musl\` for musl). RSS of
\`agent run\` ${PLATFORMS_SETTLE:-3} s after it starts with no workload and no server answering:
median (min–max).

| | x86_64-unknown-linux-gnu | $musl (static) | ratio (musl / glibc) |
|---|---|---|---|
| bundle size | $((gnu_size / 1024)) KiB | $((musl_size / 1024)) KiB | $(ratio "$musl_size" "$gnu_size") |
| agent RSS once up | $g | $m | $(ratio "$mm" "$gm") |

Not measured yet: aarch64 (cross builds under qemu), update time, and a 10,000-agent
rollout of a release of several platforms against one.
EOF
}
