#!/usr/bin/env bash
# scripts/bench.sh releasebounds: what one server keeps, on disk and in memory, for three
# releases of three platforms (BOUNDS_MIB, 100 MiB distributions) published in a row, each
# earlier one kept served by a deployment, and the deltas between them; against one
# platform and one release pair, alternating rounds (BOUNDS_ROUNDS, 3)
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh releasebounds.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" releasebounds "$@"

BOUNDS_PLATFORMS=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu x86_64-unknown-linux-musl)
BOUNDS_VERSIONS=(1.0.0 1.1.0 1.2.0)

# bounds_pack MIB: the three releases of the three platforms, packed in order (each signed
# after the one before) as $work/rb-rel/V/agent-bundle-V-TARGET with its .minisig. Each
# platform's distribution is its own MIB MiB, nine tenths random; from one release to the
# next 256 KiB of its lib/libchanged.so (MIB/25 MiB, at least 1) change.
bounds_pack() {
    local mib=$1 changed=$(($1 / 25 > 1 ? $1 / 25 : 1)) p v i dist out
    for p in "${BOUNDS_PLATFORMS[@]}"; do
        dist=$work/rb-dist-$p
        mkdir -p "$dist/lib"
        head -c "$((changed * 1024 * 1024))" /dev/urandom >"$dist/lib/libchanged.so"
        make_dist "$dist" "$mib" 1
    done
    for i in "${!BOUNDS_VERSIONS[@]}"; do
        v=${BOUNDS_VERSIONS[$i]}
        out=$work/rb-rel/$v
        mkdir -p "$out"
        for p in "${BOUNDS_PLATFORMS[@]}"; do
            dist=$work/rb-dist-$p
            if ((i > 0)); then
                dd if=/dev/urandom of="$dist/lib/libchanged.so" bs=64K count=4 seek=$((i * 4)) \
                    conv=notrunc status=none
            fi
            "$bin/agent-bundle" pack --dist "$dist" --version "$v" --build 1 --platform "$p" \
                --key "$work/keys/update.key" --out "$work/rb-pack" >/dev/null
            mv "$work/rb-pack/agent-bundle-$v.minisig" "$out/agent-bundle-$v-$p.minisig"
            mv "$work/rb-pack/agent-bundle-$v" "$out/agent-bundle-$v-$p"
        done
        sleep 1 # signed-at has one-second resolution: each release is newer
    done
}

# bytes_of PATH [FIND ARGS...]: bytes of the files under PATH (that match).
bytes_of() {
    [[ -e $1 ]] || { echo 0; return; }
    find "$@" -type f -printf '%s\n' 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'
}

# bounds_disk HOME: bytes under the server's home by what they are: kept releases,
# download directory, served copies, deployments' copies, delta bases, deltas, database,
# the rest, all.
bounds_disk() {
    local h=$1 kept dl served deployed bases deltas db all
    kept=$(bytes_of "$h/releases")
    dl=$(bytes_of "$h/downloads")
    served=$(bytes_of "$h/cache" \( -name 'bundle-*' -o -name 'msi-*' \))
    deployed=$(bytes_of "$h/cache" -name 'kept-*')
    bases=$(bytes_of "$h/deltas/bases")
    deltas=$(bytes_of "$h/deltas" -maxdepth 1 \( -name '*.delta' -o -name '*.none' \))
    db=$(bytes_of "$h" -maxdepth 1 \( -name '*.db' -o -name '*.db-*' -o -name '*.sqlite*' \))
    all=$(bytes_of "$h")
    echo "$kept $dl $served $deployed $bases $deltas $db $((all - kept - dl - served - deployed - bases - deltas - db)) $all"
}

# bounds_delta URL FROM PLATFORM: waits (at most BOUNDS_WAIT s) until the server answers the
# delta from bundle FROM to its served bundle of PLATFORM as an agent asks for it: 200.
# A 404 (none worth sending, or it failed) ends the benchmark with the server's words.
bounds_delta() {
    local end=$((SECONDS + ${BOUNDS_WAIT:-600})) code body=$work/rb-delta.body
    while ((SECONDS < end)); do
        code=$(curl -sS -o "$body" -w '%{http_code}' "$1/agentupdate/delta?from=$2&platform=$3" || echo 000)
        case $code in
        200) return 0 ;;
        404) echo "bench.sh: no delta from $2 for $3: $(head -c 300 "$body")" >&2; return 1 ;;
        esac
        sleep 0.1
    done
    echo "bench.sh: the delta from $2 for $3 was not made in ${BOUNDS_WAIT:-600} s (last: $code)" >&2
    return 1
}

# bounds_run KIND ROUND: a fresh dev server (SQLite) and the releases of KIND (3x3: three
# releases of three platforms; 1x1: 1.0.0 and 1.1.0 of x86_64 glibc) published in a row.
# After each: its bundles kept as delta bases, every delta to it from each earlier
# release of its platform asked for as an agent does until made, then a deployment keeping
# the release before it served. Appends per release "KIND ROUND V publish_s deltas_s
# hwm_after_publish hwm_after_deltas DISK..." to $work/rb-releases.txt and per run
# "KIND ROUND hwm_mib anon_mib deltas_made" to $work/rb-runs.txt; the deltas' making times
# (ms, from the server's log) to $work/rb-delta-ms-KIND.txt.
bounds_run() {
    local kind=$1 round=$2 plats vers
    if [[ $kind == 3x3 ]]; then
        plats=("${BOUNDS_PLATFORMS[@]}") vers=("${BOUNDS_VERSIONS[@]}")
    else
        plats=("${BOUNDS_PLATFORMS[0]}") vers=("${BOUNDS_VERSIONS[@]:0:2}")
    fi
    local home=$work/rb-$kind-$round port url pid sampler
    rm -rf "$home" "$home.log"
    mkdir -p "$home/downloads/agent"
    port=$(free_port)
    url=http://127.0.0.1:$port
    start_server "$home" "$port" RUST_LOG=info UPDATE_SERVER_ADMIN_TOKEN=bench \
        UPDATE_SERVER_BUNDLE_PUBLIC_KEY="$work/keys/update.pub"
    pid=$server_pid
    sample_anon "$pid" "$work/rb-anon-$kind-$round" &
    sampler=$!
    local release=("$bin/update-server" release --server "$url" --token bench)
    local i j v p up t0 t1 t2 hwm_pub sha from
    for i in "${!vers[@]}"; do
        v=${vers[$i]}
        up=$work/rb-up-$kind-$round-$v
        mkdir -p "$up"
        for p in "${plats[@]}"; do
            ln "$work/rb-rel/$v/agent-bundle-$v-$p" "$work/rb-rel/$v/agent-bundle-$v-$p.minisig" "$up/"
        done
        t0=$(date +%s.%N)
        "${release[@]}" publish "$up" >/dev/null
        t1=$(date +%s.%N)
        hwm_pub=$(hwm_mib "$pid")
        # Its bundles kept as bases (the worker looks each second), so the next release
        # has deltas from them; and every delta to it, asked for as an agent does.
        for p in "${plats[@]}"; do
            sha=$(sha256sum "$up/agent-bundle-$v-$p" | cut -d' ' -f1)
            until_true 300 "bundle $v for $p kept as a delta base" test -f "$home/deltas/bases/$sha.base"
            for ((j = 0; j < i; j++)); do
                from=$(sha256sum "$work/rb-rel/${vers[$j]}/agent-bundle-${vers[$j]}-$p" | cut -d' ' -f1)
                bounds_delta "$url" "$from" "$p"
            done
        done
        t2=$(date +%s.%N)
        # The release before stays served, for a deployment no agent is in.
        if ((i > 0)); then
            curl -fsS -o /dev/null -H "Authorization: Bearer bench" -H "Content-Type: application/json" \
                -d "{\"name\":\"keep-$i\",\"selector\":\"bench=keep-$i\",\"release\":\"${vers[$((i - 1))]}+1\",\"priority\":$i}" \
                "$url/admin/deployments"
            until_true 300 "release ${vers[$((i - 1))]} served by name" \
                curl -fs -o /dev/null "$url/agentupdate/version?release=${vers[$((i - 1))]}+1&platform=${plats[0]}"
        fi
        echo "$kind $round $v $(awk -v a="$t1" -v b="$t0" 'BEGIN { print a - b }') $(awk -v a="$t2" -v b="$t1" 'BEGIN { print a - b }') $hwm_pub $(hwm_mib "$pid") $(bounds_disk "$home")" >>"$work/rb-releases.txt"
        note "$kind round $round, $v: published in $(secs "$(awk -v a="$t1" -v b="$t0" 'BEGIN { print a - b }')"), deltas ready $(secs "$(awk -v a="$t2" -v b="$t1" 'BEGIN { print a - b }')") later; VmHWM $(hwm_mib "$pid") MiB"
    done
    # The deployments removed: no release but the current one is served by name any more.
    if ((${#vers[@]} > 1)); then
        for ((i = 1; i < ${#vers[@]}; i++)); do
            curl -fsS -o /dev/null -X DELETE -H "Authorization: Bearer bench" "$url/admin/deployments/keep-$i"
        done
        until_true 300 "release ${vers[0]} no longer served by name" \
            sh -c "! curl -fs -o /dev/null '$url/agentupdate/version?release=${vers[0]}+1&platform=${plats[0]}'"
        sleep 2 # a look of the background loop after the one that forgot them
        echo "$kind $round undeployed 0 0 0 $(hwm_mib "$pid") $(bounds_disk "$home")" >>"$work/rb-releases.txt"
    fi
    local hwm anon made
    hwm=$(hwm_mib "$pid")
    stop_server
    wait "$sampler" 2>/dev/null || true
    anon=$(awk '{ printf "%.0f", $1 / 1024 }' "$work/rb-anon-$kind-$round")
    # "delta from A to B: N bytes, ... made in T s" carries took_ms.
    sed 's/\x1b\[[0-9;]*m//g' "$home.log" | grep 'made in' | grep -o 'took_ms[=":]*[0-9]*' |
        grep -o '[0-9]*$' >>"$work/rb-delta-ms-$kind.txt" || true
    made=$(sed 's/\x1b\[[0-9;]*m//g' "$home.log" | grep -c 'made in' || true)
    echo "$kind $round $hwm $anon $made" >>"$work/rb-runs.txt"
    note "$kind round $round: VmHWM $hwm MiB, RssAnon peak $anon MiB, $made deltas made"
    # The bundles stay for the next round; a home is 2-3 GiB at 100 MiB.
    rm -rf "$home" "$work/rb-up-$kind-$round-"*
}

# bounds_col KIND FIELD: the FIELD-th number of rb-runs.txt's KIND lines, median (min–max).
bounds_col() { awk -v k="$1" -v f="$2" '$1 == k { print $f }' "$work/rb-runs.txt" | spread_as %.0f " MiB"; }

# bounds_rel KIND V FIELD [FORMAT UNIT]: FIELD of release V's lines of KIND, median (min–max).
bounds_rel() {
    awk -v k="$1" -v v="$2" -v f="$3" '$1 == k && $3 == v { print $f }' "$work/rb-releases.txt" |
        spread_as "${4:-%.1f}" "${5:- s}"
}

# bounds_disk_row KIND V LABEL: the disk of release V's last KIND line, in MiB.
bounds_disk_row() {
    awk -v k="$1" -v v="$2" -v l="$3" '$1 == k && $3 == v { last = $0 } END {
        n = split(last, a, " "); printf "| %s |", l
        for (i = 8; i <= n; i++) printf " %.1f |", a[i] / 1048576
        print "" }' "$work/rb-releases.txt"
}

bench_releasebounds() {
    local rounds=${BOUNDS_ROUNDS:-3} mib=${BOUNDS_MIB:-100}
    echo "releasebounds: 3 releases × 3 platforms of $mib MiB vs 1 platform × 2 releases ($rounds rounds)" >&2
    keys
    use_variant ours
    rm -rf "$work/rb-rel" "$work"/rb-*.txt
    if [[ -n ${BOUNDS_FROM:-} ]]; then
        # The data an earlier run saved (BOUNDS_SAVE), written up again.
        cp "$BOUNDS_FROM"/rb-*.txt "$work/"
    else
        bounds_pack "$mib"
        stat -c %s "$work/rb-rel/1.0.0/agent-bundle-1.0.0-${BOUNDS_PLATFORMS[0]}" >"$work/rb-size.txt"
        local r
        for r in $(seq 1 "$rounds"); do
            bounds_run 3x3 "$r"
            bounds_run 1x1 "$r"
            [[ -z ${BOUNDS_SAVE:-} ]] || { mkdir -p "$BOUNDS_SAVE" && cp "$work"/rb-*.txt "$BOUNDS_SAVE/"; }
        done
    fi
    local size
    size=$(cat "$work/rb-size.txt")
    rounds=$(awk '$1 == "3x3"' "$work/rb-runs.txt" | wc -l)
    local h33 h11 a33 a11 p33 p11
    h33=$(awk '$1 == "3x3" { print $3 }' "$work/rb-runs.txt" | median_of)
    h11=$(awk '$1 == "1x1" { print $3 }' "$work/rb-runs.txt" | median_of)
    a33=$(awk '$1 == "3x3" { print $4 }' "$work/rb-runs.txt" | median_of)
    a11=$(awk '$1 == "1x1" { print $4 }' "$work/rb-runs.txt" | median_of)
    p33=$(awk '$1 == "3x3" && $3 == "1.0.0" { print $6 }' "$work/rb-releases.txt" | median_of)
    p11=$(awk '$1 == "1x1" && $3 == "1.0.0" { print $6 }' "$work/rb-releases.txt" | median_of)
    local d33 d11
    d33=$(awk '$1 == "3x3" && $3 == "1.2.0" { print $16 / 1048576 }' "$work/rb-releases.txt" | median_of)
    d11=$(awk '$1 == "1x1" && $3 == "1.1.0" { print $16 / 1048576 }' "$work/rb-releases.txt" | median_of)
    write_section releasebounds <<EOF
## Releases kept bounded: three releases of three platforms against one pair

\`$(bench_command releasebounds)\` (BOUNDS_ROUNDS=$rounds, BOUNDS_MIB=$mib) on $(machine),
$bench_build of update-server (SQLite, admin token set). Distributions of $mib MiB, nine
tenths random, one per platform; from one release to the next 256 KiB of a
$((mib / 25 > 1 ? mib / 25 : 1)) MiB file change; bundles of $(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1048576 }') MiB. **3 × 3**: a fresh server; 1.0.0, 1.1.0
and 1.2.0, each of \`${BOUNDS_PLATFORMS[*]}\`, published in a row (\`release publish
DIR\`, timed); after each, every delta to it from each earlier release of the same
platform is asked for as an agent asks (\`GET /agentupdate/delta?from=&platform=\`, 503
while it is made) until answered \`200\`, then a deployment no agent is in is created
naming the release before, so that after 1.2.0 three releases are served at once. **1 × 1**:
the same with \`${BOUNDS_PLATFORMS[0]}\` alone, 1.0.0 then 1.1.0 (one delta). The two
alternate, $rounds rounds of each; median (min–max). Peak RSS is the server's \`VmHWM\` at
the end of a run; RssAnon is sampled every 50 ms. A delta's time is the server's own
(\`took_ms\` of its log line).

| | 3 releases × 3 platforms | 1 platform, 1.0.0 → 1.1.0 | 3 × 3 / 1 × 1 |
|---|---|---|---|
| server peak RSS (VmHWM) | $(bounds_col 3x3 3) | $(bounds_col 1x1 3) | $(ratio "$h33" "$h11") |
| peak RssAnon (sampled) | $(bounds_col 3x3 4) | $(bounds_col 1x1 4) | $(ratio "$a33" "$a11") |
| VmHWM after publishing 1.0.0 (no delta yet) | $(awk '$1 == "3x3" && $3 == "1.0.0" { print $6 }' "$work/rb-releases.txt" | spread_as %.0f " MiB") | $(awk '$1 == "1x1" && $3 == "1.0.0" { print $6 }' "$work/rb-releases.txt" | spread_as %.0f " MiB") | $(ratio "$p33" "$p11") |
| deltas made per run | $(awk '$1 == "3x3" { print $5 }' "$work/rb-runs.txt" | spread_as %.0f) | $(awk '$1 == "1x1" { print $5 }' "$work/rb-runs.txt" | spread_as %.0f) | |
| a delta's making (server's time) | $(awk '{ print $1 / 1000 }' "$work/rb-delta-ms-3x3.txt" | spread) | $(awk '{ print $1 / 1000 }' "$work/rb-delta-ms-1x1.txt" | spread) | |
| publish of 1.0.0 | $(bounds_rel 3x3 1.0.0 4) | $(bounds_rel 1x1 1.0.0 4) | |
| publish of 1.1.0 | $(bounds_rel 3x3 1.1.0 4) | $(bounds_rel 1x1 1.1.0 4) | |
| publish of 1.2.0 | $(bounds_rel 3x3 1.2.0 4) | | |
| publish of 1.1.0 to its deltas all made | $(bounds_rel 3x3 1.1.0 5) (3) | $(bounds_rel 1x1 1.1.0 5) (1) | |
| publish of 1.2.0 to its deltas all made | $(bounds_rel 3x3 1.2.0 5) (6) | | |
| bytes under the server's home at the end | $(printf '%.0f MiB' "$d33") | $(printf '%.0f MiB' "$d11") | $(ratio "$d33" "$d11") |

On disk under the server's home (MiB, the last round), after each release was published,
its deltas made and the release before it named by a deployment:

| after | \`releases/<id>/\` | \`downloads/agent/\` | \`cache/bundle-*\` | \`cache/kept-*\` | \`deltas/bases/\` | \`deltas/*.delta\` | database | other | all |
|---|---|---|---|---|---|---|---|---|---|
$(bounds_disk_row 3x3 1.0.0 "3 × 3: 1.0.0")
$(bounds_disk_row 3x3 1.1.0 "3 × 3: 1.1.0")
$(bounds_disk_row 3x3 1.2.0 "3 × 3: 1.2.0")
$(bounds_disk_row 3x3 undeployed "3 × 3: both deployments removed")
$(bounds_disk_row 1x1 1.0.0 "1 × 1: 1.0.0")
$(bounds_disk_row 1x1 1.1.0 "1 × 1: 1.1.0")
$(bounds_disk_row 1x1 undeployed "1 × 1: its deployment removed")

**Kept per release** (from the code). \`releases/<version>+<build>/\` holds each bundle and
its \`.minisig\` as published, for the current release, the \`releases.keep\` (5) before it
and any release a deployment names (\`Publisher::forget_unkept\` deletes the others' at the
next publish). The current release is also in \`downloads/agent/\` (written whole by
\`publish::install\`, the other releases' files removed) and in the store's private, mapped
copies \`cache/bundle-<sha256>\` (\`BundleStore::remove_stale_copies\` drops those no longer
current). Each release a deployment names is read into \`cache/kept-<sha256>\`
(\`catalog::private_copy\`), mapped and served from there; \`Catalog::retain\` deletes them
once no deployment names it (before this section's commit nothing did: the copies outlived
their deployments, one per bundle of every release ever named). Nothing is unpacked on
disk: a publish counts what a bundle inflates to as it inflates it (\`releases.max-unpacked\`),
and SQLite holds the records, not the bytes. So a current bundle is on disk four times
(\`releases/\`, \`downloads/\`, \`cache/\`, \`deltas/bases/\`), a deployment's twice or three times.

**Kept per base.** Every bundle once current is copied to \`deltas/bases/<sha256>\` (with its
\`<sha256>.base\` record); the \`KEEP_PER_PLATFORM\` = 4 most recent of each platform stay (a
served one always), older ones are deleted at the next release change (\`bases_to_drop\`).
Deltas are made toward the current release only, from each kept base of its platform
(\`plan\`): at most 3 per platform, \`deltas/<from>-<to>.delta\` (\`.none\` when over half the
bundle), deleted once their \`to\` is no longer current (\`remove_unwanted\`); a
deployment's other release gets none (\`/agentupdate/delta\` answers 404, the agent downloads).

**What bounds memory.** One worker makes one delta at a time on a blocking thread
(\`Deltas::spawn\`); the served bundle taken apart (\`agent_delta::make::Target\`: its
layout, not its bytes) is kept while deltas to it are queued; a diff holds two files of at
most \`Limits::max_diff_input\` (64 MiB) and bsdiff's suffix array, larger files are sent
whole; bundles and made deltas are mapped files (their pages count in VmHWM when read, not
in RssAnon); at most \`UPLOADS_AT_ONCE\` (2) uploads at once, written to disk.

**Whether the numbers confirm it.** On disk they do: after 1.2.0 each release's bundles are
under \`releases/\`, the current one's also under \`downloads/\` and \`cache/bundle-*\`, the two
a deployment names under \`cache/kept-*\`, every bundle once current under \`deltas/bases/\`
(9 of at most 4 per platform), and the deltas (toward 1.2.0 only) a few hundred KiB each;
the 3 × 3 home is $(ratio "$d33" "$d11") times the 1 × 1's, as nine bundles of three releases against
two of two predict, and the row after the deployments' removal shows their copies gone.
In memory, three bundles published at once peaked no higher than one (VmHWM after 1.0.0
above); the peak is set while deltas are made, and with nine deltas made against one it is
$(ratio "$h33" "$h11") times the 1 × 1's: the same bound, not a multiple. A quick run with
\`BOUNDS_MIB=10 BOUNDS_ROUNDS=1\` showed more of a gap (149 against 97 MiB, 1.54), about as
high as here with a tenth of the bytes: it grows with the threads that made deltas, not with
releases, platforms or bytes. Each delta is made on whichever tokio blocking thread
\`Deltas::spawn\`'s \`spawn_blocking\` hands it, and glibc gives each thread its own malloc
arena, which keeps its freed peak (the same quick run with \`MALLOC_ARENA_MAX=1\`: 135 against
102 MiB); the blocking pool and the arena cap (8 per core) bound it.
Delta times here are a dev build on
a machine shared with another engineer's builds and tests.
EOF
}
