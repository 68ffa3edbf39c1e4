#!/usr/bin/env bash
# scripts/bench.sh agent: first 409 to updater spawned, 20 MiB and 100 MiB bundles (download vs verify)
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh agent.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" agent "$@"

bench_agent() {
    echo "agent: first 409 to updater spawned" >&2
    keys
    base_bundle >/dev/null
    local home=$work/agent-server port rows=""
    mkdir -p "$home/downloads/agent"
    port=$(free_port)
    start_server "$home" "$port" RUST_LOG=warn
    local mib
    # Bundles of about 20 and 100 MiB: the stub is in front, the payload incompressible.
    local stub_mib=$(($(stat -c %s "$bin/agent-bundle") / 1048576))
    for mib in 20 100; do
        make_dist "$work/ad$mib" "$((mib - stub_mib))" 0
        local b2
        b2=$(pack 2.0.0 "$work/ad$mib" "$work/ab$mib")
        serve_bundle "$home" "$port" "$b2"
        local totals=() downloads=() verifies=() i
        for i in 1 2 3; do
            local p=$work/agent-$mib-$i
            install_agent "$p" "http://127.0.0.1:$port" ""
            (cd "$p" && "$p/agent/current/bin/agent" run >/dev/null 2>&1 &)
            local log=$p/agent/logs/agent.log
            wait_file 120 "$log" "updater started"
            local t409 tspawn
            t409=$(log_secs "$(grep -m1 'expects 2.0.0+1; updating' "$log")")
            tspawn=$(log_secs "$(grep -m1 'updater started' "$log")")
            totals+=("$(awk -v a="$tspawn" -v b="$t409" 'BEGIN { print a - b }')")
            downloads+=("$(grep -m1 -o 'bytes in [0-9.]*s' "$log" | grep -o '[0-9.]*')")
            verifies+=("$(grep -m1 -o 'verified in [0-9.]*s' "$log" | grep -o '[0-9.]*')")
            wait_file 60 "$p/agent/logs/update.log" "committed" || true
            stop_home "$p/agent"
        done
        local mt md mv
        mt=$(printf '%s\n' "${totals[@]}" | sort -n | sed -n 2p)
        md=$(printf '%s\n' "${downloads[@]}" | sort -n | sed -n 2p)
        mv=$(printf '%s\n' "${verifies[@]}" | sort -n | sed -n 2p)
        note "$mib MiB: 409 to spawn $mt s, download (hashing included) $md s, verify after $mv s"
        rows+="| $(($(stat -c %s "$b2") / 1048576)) MiB | $(secs "$mt") | $(secs "$md") | $(secs "$mv") | $(awk -v v="$mv" -v d="$md" 'BEGIN { printf "%.1f %%", 100 * v / d }') |"$'\n'
    done
    write_section agent <<EOF
## Agent: from the first 409 to the updater

\`scripts/bench.sh agent\` on $(machine). A release agent 1.0.0 against a release
update-server on loopback serving 2.0.0, its distribution padded with random bytes to
about 20 and 100 MiB less the stub; median of 3 runs each. The release binaries (with line
tables) alone make a bundle of about 27 MiB, the smallest this machine can measure. "Download" includes
hashing (md5, sha256 and BLAKE2b, on a second thread while the bytes arrive); "verify" is
what remains after the last byte: the signature over the BLAKE2b digest already computed,
the trusted comment, the payload's version and the replay check.

| bundle | first 409 → updater spawned | download | verify after download | verify / download (target ≤ 10 %) |
|---|---|---|---|---|
${rows}
EOF
}
