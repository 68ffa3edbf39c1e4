#!/usr/bin/env bash
# scripts/bench.sh bundle: pack / install / verify of a 100 MiB distribution vs tar czf / tar xzf / b2sum+sha256sum
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh bundle.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" bundle "$@"

bench_bundle() {
    echo "bundle: 100 MiB distribution" >&2
    keys
    local dist=$work/dist
    make_dist "$dist" 100
    local size
    size=$(du -sm "$dist" | cut -f1)
    local bundle
    bundle=$(pack 1.0.0 "$dist" "$work/out")
    local bsize=$(($(stat -c %s "$bundle") / 1024 / 1024))

    local pack_t tarc_t inst_t tarx_t ver_t hash_t
    pack_t=$(median --prepare "rm -rf $work/p" "$bin/agent-bundle pack --dist $dist --version 1.0.0 --build 1 --key $work/keys/update.key --out $work/p")
    tarc_t=$(median "tar czf $work/dist.tar.gz -C $dist .")
    inst_t=$(median --prepare "rm -rf $work/inst" "$bundle --install=$work/inst")
    tarx_t=$(median --prepare "rm -rf $work/tx && mkdir $work/tx" "tar xzf $work/dist.tar.gz -C $work/tx")
    ver_t=$(median "$bin/agent-bundle verify $bundle --pub $work/keys/update.pub")
    hash_t=$(median "b2sum $bundle >/dev/null && sha256sum $bundle >/dev/null")
    note "pack $pack_t s, tar czf $tarc_t s, install $inst_t s, tar xzf $tarx_t s, verify $ver_t s, b2sum+sha256sum $hash_t s"

    write_section bundle <<EOF
## Bundle: pack, install, verify

\`scripts/bench.sh bundle\` on $(machine). Distribution of ${size} MiB (real binaries, 60 % random,
40 % base64 text), bundle ${bsize} MiB. Median of ${RUNS:-5} runs (hyperfine). Install fsyncs what
it writes and renames a staging tree into place; \`tar xzf\` does neither.

| operation | ours | peer | peer time | ratio (ours / peer) | target |
|---|---|---|---|---|---|
| pack | $(secs "$pack_t") | \`tar czf\` | $(secs "$tarc_t") | $(ratio "$pack_t" "$tarc_t") | — |
| \`--install\` | $(secs "$inst_t") | \`tar xzf\` | $(secs "$tarx_t") | $(ratio "$inst_t" "$tarx_t") | ≤ 1.5 |
| \`verify\` | $(secs "$ver_t") | \`b2sum; sha256sum\` | $(secs "$hash_t") | $(ratio "$ver_t" "$hash_t") | ≤ 1.2 |
EOF
}
