#!/usr/bin/env bash
# scripts/bench.sh windows: the Windows bundle beside the Linux one; the Windows agent's update under Wine vs the Linux agent's, alternating rounds; the Windows service's and agent's memory under Wine; the MSI's install to the agent registered vs the bundle's --install
#   WINDOWS_ROUNDS (default 5), WINDOWS_MSI_ROUNDS (default 3); WINDOWS_ONLY=size|update|msi
#   runs one part and prints it, BENCHMARKS.md untouched
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh windows.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, root, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" windows "$@"

WINDOWS_TARGET=x86_64-pc-windows-gnu
WINE64=/usr/lib/wine/wine64
WINESERVER=/usr/lib/wine/wineserver

# Debian's 64-bit Wine and the mingw cross compiler (the linker, and the C compiler for
# ring's C code), and the rustup target.
windows_tools() {
    local pkgs=()
    [[ -x $WINE64 ]] || pkgs+=(wine64)
    command -v x86_64-w64-mingw32-gcc >/dev/null || pkgs+=(gcc-mingw-w64-x86-64)
    if ((${#pkgs[@]})); then
        if [[ $(id -u) -ne 0 ]]; then
            echo "bench.sh windows: missing ${pkgs[*]}; install them (apt-get install ${pkgs[*]})" >&2
            exit 1
        fi
        apt-get install -y -qq "${pkgs[@]}" >/dev/null
    fi
    rustup target add "$WINDOWS_TARGET" >/dev/null 2>&1 || {
        echo "bench.sh windows: rustup target add $WINDOWS_TARGET failed" >&2
        exit 1
    }
}

# wine_env CMD...: runs a Wine command in the benchmark's prefix, quietly.
wine_env() {
    WINEPREFIX=$wine_prefix WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml=" DISPLAY='' "$@"
}

# The benchmark's Wine prefix, made once under target/ (as the tests make theirs): booted
# once, with the ProcessPrng shim Rust's std needs under Wine 8 (the tests' own file),
# and one server kept up for the run.
windows_prefix() {
    wine_prefix=$root/target/wine-bench/prefix
    if [[ ! -f $wine_prefix/.ready ]]; then
        wine_env "$WINESERVER" -k 2>/dev/null || true
        rm -rf "$wine_prefix"
        mkdir -p "$wine_prefix"
        wine_env "$WINESERVER" -p
        wine_env "$WINE64" wineboot -i </dev/null >/dev/null 2>&1
        x86_64-w64-mingw32-gcc -shared -O2 -o "$wine_prefix/drive_c/windows/system32/bcryptprimitives.dll" \
            tests/support/wine/bcryptprimitives.c -ladvapi32
        # A new prefix boots twice (two service managers): end that session, boot once.
        wine_env "$WINESERVER" -k 2>/dev/null || true
        wine_env "$WINESERVER" -w 2>/dev/null || true
        touch "$wine_prefix/.ready"
    fi
    wine_env "$WINESERVER" -p
    on_exit+=("wine_env $WINESERVER -k")
}

# windows_release V B: release builds of this tree packed by scripts/build-dist.sh as
# version V build B, for Linux (this machine's glibc) and for Windows, under
# $work/windows/V.
windows_release() {
    local version=$1 build=$2 out=$work/windows/$1
    AGENT_BIN_DIR=$bin AGENT_DIST_ROOT=$work/windows/dist-$1 scripts/build-dist.sh --version "$version" \
        --build "$build" --key "$work/keys/update.key" --out "$out" >/dev/null
    AGENT_BIN_DIR=$bin AGENT_DIST_ROOT=$work/windows/dist-$1 scripts/build-dist.sh --version "$version" \
        --build "$build" --key "$work/keys/update.key" --out "$out" --target "$WINDOWS_TARGET" >/dev/null
}

# The settings both agents run with: a 1 s heartbeat and stability window, as the
# end-to-end tests use (the update reports after the window).
agent_conf() {
    printf '[server]\nurls = ["http://127.0.0.1:%s"]\n[agent]\nheartbeat = "1s"\n[update]\nstability-window = "1s"\n' "$1"
}

# rss_of TEXT [COMM]: resident MiB of the processes whose command line contains TEXT (a
# plain string), and that are named COMM when it is given. Under Wine a Windows program's
# process shows its Windows command line, and a Rust program's is named "main" (its main
# thread's name), so the Windows ones are told by their command line alone.
rss_of() {
    local dir total=0 kb
    for dir in /proc/[0-9]*; do
        [[ -z ${2:-} || $(cat "$dir/comm" 2>/dev/null) == "$2" ]] || continue
        tr '\0' ' ' <"$dir/cmdline" 2>/dev/null | grep -qF -- "$1" || continue
        kb=$(awk '$1 == "VmRSS:" { print $2 }' "$dir/status" 2>/dev/null || echo 0)
        total=$((total + ${kb:-0}))
    done
    awk -v k="$total" 'BEGIN { printf "%.1f", k / 1024 }'
}

# windows_update KIND ROUND: seconds from 2.0.0's bundle for KIND (linux or windows)
# renamed into the download directory of a server that serves 1.0.0 to the agent
# (installed from KIND's 1.0.0 bundle: the wrapper, or the Windows service under Wine),
# to the agent reporting 2.0.0+2. Then, with 2.0.0 settled, the resident memory of the
# agent and of its supervisor (the wrapper script, or agent-service.exe) as
# "seconds agent_mib supervisor_mib".
windows_update() {
    local kind=$1 round=$2 port home=$work/wu-server-$1-$2 prefix=$work/wu-agent-$1-$2 t0 t1
    local v1=$work/windows/1.0.0 v2=$work/windows/2.0.0 b1 b2 service=agent-bench-$2
    if [[ $kind == windows ]]; then
        b1=$v1/agent-bundle-1.0.0-$WINDOWS_TARGET.exe b2=$v2/agent-bundle-2.0.0-$WINDOWS_TARGET.exe
    else
        b1=$v1/agent-bundle-1.0.0 b2=$v2/agent-bundle-2.0.0
    fi
    port=$(free_port)
    sim_server "$home" "$port" "$b1"
    rm -rf "$prefix"
    mkdir -p "$prefix"
    if [[ $kind == windows ]]; then
        local win_root="Z:${prefix//\//\\}"
        wine_env "$WINE64" "$b1" --install="$win_root" --no-service \
            </dev/null >"$work/wu-install-$round.out" 2>&1
        agent_conf "$port" >"$prefix/agent/conf/agent.toml"
        # Registered and started as --install would, once the settings are in place.
        wine_env "$WINE64" "$prefix/agent/bin/agent-service.exe" install --service-name "$service" \
            --home "$win_root\\agent" </dev/null >>"$work/wu-install-$round.out" 2>&1
    else
        "$b1" --install="$prefix" >/dev/null
        agent_conf "$port" >"$prefix/agent/conf/agent.toml"
        "$prefix/agent/current/bin/agent-wrapper.sh" start >/dev/null
    fi
    until_true 120 "the $kind agent to report 1.0.0+1" one_agent_at "$port" 1.0.0+1 || {
        tail -n 20 "$work/wu-install-$round.out" "$prefix/agent/logs/"*.log >&2 2>/dev/null || true
        return 1
    }
    t0=$(date +%s.%N)
    drop_bundle "$home/downloads/agent" "$b2"
    if ! until_true 300 "the $kind agent to report 2.0.0+2" one_agent_at "$port" 2.0.0+2; then
        tail -n 20 "$prefix/agent/logs/update.log" "$prefix/agent/logs/"{wrapper,service}.log >&2 2>/dev/null || true
        return 1
    fi
    t1=$(date +%s.%N)
    # Settled: the updater has ended and the new agent runs its loop.
    sleep "${WINDOWS_SETTLE:-3}"
    local agent_mib supervisor_mib
    if [[ $kind == windows ]]; then
        agent_mib=$(rss_of "$win_root\\agent\\versions\\2.0.0+2\\bin\\agent.exe run")
        supervisor_mib=$(rss_of "$win_root\\agent\\bin\\agent-service.exe run")
        wine_env "$WINE64" net stop "$service" </dev/null >/dev/null 2>&1 || true
        wine_env "$WINE64" sc delete "$service" </dev/null >/dev/null 2>&1 || true
        pkill -KILL -f -- "${prefix//\//\\}" 2>/dev/null || true
    else
        agent_mib=$(rss_of "$prefix/agent/" agent)
        supervisor_mib=$(rss_of "$prefix/agent/" agent-wrapper.s)
        stop_home "$prefix/agent"
    fi
    stop_server
    awk -v a="$t0" -v b="$t1" -v m="$agent_mib" -v s="$supervisor_mib" 'BEGIN { printf "%.3f %s %s\n", b - a, m, s }'
}

# registered_as PORT LABEL: whether the server lists an agent labelled bench=LABEL.
registered_as() {
    curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$1/admin/agents" 2>/dev/null |
        jq -e --arg l "$2" 'any(.[]; .labels.bench == $l)' >/dev/null
}

# windows_msi KIND ROUND PORT: seconds from the install command's start to the server on
# PORT (serving 1.0.0, enrollment token "bench-enroll") listing the agent as registered
# with its label, under Wine, on a machine of its own (a directory and service name of
# its own in the shared prefix). KIND msi: `msiexec /i agent.msi /qn SERVER_URL=…
# ENROLL_TOKEN=… LABELS=bench=…`, the MSI build-dist.sh wrote; KIND bundle: the same
# release's bundle `--install --server-url … --enroll-token … --label bench=…`. Each
# machine is removed after (msiexec /x for the MSI, so that the next round installs the
# product afresh, not as a maintenance run of an installed one), untimed.
windows_msi() {
    local kind=$1 round=$2 port=$3 dir=$work/wm-$1-$2 t0 t1
    local label=$kind-$round service=agent-bench-$1-$2 v1=$work/windows/1.0.0
    local msi=$v1/agent-1.0.0-$WINDOWS_TARGET.msi bundle=$v1/agent-bundle-1.0.0-$WINDOWS_TARGET.exe
    local win_dir="Z:${dir//\//\\}" win_msi url=http://127.0.0.1:$port
    win_msi="Z:${msi//\//\\}"
    rm -rf "$dir"
    mkdir -p "$dir"
    t0=$(date +%s.%N)
    if [[ $kind == msi ]]; then
        wine_env "$WINE64" msiexec /i "$win_msi" /qn "INSTALLDIR=$win_dir\\" "SERVICE_NAME=$service" \
            "SERVER_URL=$url" ENROLL_TOKEN=bench-enroll "LABELS=bench=$label" \
            </dev/null >"$dir.out" 2>&1 || {
            echo "bench.sh windows: msiexec /i failed:" >&2
            tail -n 20 "$dir.out" >&2
            return 1
        }
    else
        wine_env "$WINE64" "$bundle" --install="$win_dir" --service-name "$service" --server-url "$url" \
            --enroll-token bench-enroll --label "bench=$label" </dev/null >"$dir.out" 2>&1 || {
            echo "bench.sh windows: the bundle's --install failed:" >&2
            tail -n 20 "$dir.out" >&2
            return 1
        }
    fi
    until_true 120 "the $kind agent of round $round to register" registered_as "$port" "$label" || return 1
    t1=$(date +%s.%N)
    if [[ $kind == msi ]]; then
        wine_env "$WINE64" msiexec /x "$win_msi" /qn </dev/null >>"$dir.out" 2>&1 || true
    else
        wine_env "$WINE64" net stop "$service" </dev/null >/dev/null 2>&1 || true
        wine_env "$WINE64" sc delete "$service" </dev/null >/dev/null 2>&1 || true
    fi
    pkill -KILL -f -- "${dir//\//\\}" 2>/dev/null || true
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}

# The MSI against the bundle's --install, alternated (the first of each round swapped),
# WINDOWS_MSI_ROUNDS rounds; prints the table's two rows.
windows_msi_rows() {
    local rounds=${WINDOWS_MSI_ROUNDS:-3} port r kind t by_msi=() by_bundle=()
    port=$(free_port)
    sim_server "$work/wm-server" "$port" "$work/windows/1.0.0/agent-bundle-1.0.0-$WINDOWS_TARGET.exe" \
        UPDATE_SERVER_AGENTS_ENROLLMENT_TOKEN=bench-enroll
    for ((r = 1; r <= rounds; r++)); do
        local order=(msi bundle)
        ((r % 2 == 0)) && order=(bundle msi)
        for kind in "${order[@]}"; do
            t=$(windows_msi "$kind" "$r" "$port") || exit 1
            if [[ $kind == msi ]]; then by_msi+=("$t"); else by_bundle+=("$t"); fi
        done
        note "round $r: msiexec /i ${by_msi[-1]} s, the bundle's --install ${by_bundle[-1]} s (to registered)"
    done
    stop_server
    echo "| \`msiexec /i agent.msi /qn\` | $(printf '%s\n' "${by_msi[@]}" | spread) | $rounds |"
    echo "| \`agent-bundle-….exe --install\` | $(printf '%s\n' "${by_bundle[@]}" | spread) | $rounds |"
}

bench_windows() {
    local only=${WINDOWS_ONLY:-} rounds=${WINDOWS_ROUNDS:-5}
    echo "windows: the Windows agent under Wine beside the Linux agent${only:+ ($only only)}" >&2
    windows_tools
    keys
    windows_release 1.0.0 1
    sleep 1 # signed-at has one-second resolution: 2.0.0 must be signed after 1.0.0
    windows_release 2.0.0 2
    local lin_b=$work/windows/1.0.0/agent-bundle-1.0.0 win_b=$work/windows/1.0.0/agent-bundle-1.0.0-$WINDOWS_TARGET.exe
    local lin_kib win_kib lin_agent_kib win_agent_kib win_service_kib
    lin_kib=$(($(stat -c %s "$lin_b") / 1024))
    win_kib=$(($(stat -c %s "$win_b") / 1024))
    lin_agent_kib=$(($(stat -c %s "$bin/agent") / 1024))
    win_agent_kib=$(($(stat -c %s "target/$WINDOWS_TARGET/release/agent.exe") / 1024))
    win_service_kib=$(($(stat -c %s "target/$WINDOWS_TARGET/release/agent-service.exe") / 1024))
    note "bundle: Linux $lin_kib KiB, Windows $win_kib KiB"
    local size_row
    size_row="| bundle | $lin_kib KiB | $win_kib KiB | $(ratio "$win_kib" "$lin_kib") |
| agent program | $lin_agent_kib KiB (\`agent\`) | $win_agent_kib KiB (\`agent.exe\`) | $(ratio "$win_agent_kib" "$lin_agent_kib") |"

    local lin_t=() win_t=() lin_a=() win_a=() lin_s=() win_s=() r out
    if [[ -z $only || $only == update ]]; then
        windows_prefix
        for ((r = 1; r <= rounds; r++)); do
            # Alternated, the first of each round swapped, so the noise falls on both.
            local order=(linux windows)
            ((r % 2 == 0)) && order=(windows linux)
            local kind
            for kind in "${order[@]}"; do
                out=$(windows_update "$kind" "$r") || exit 1
                read -r t a s <<<"$out"
                if [[ $kind == windows ]]; then win_t+=("$t") win_a+=("$a") win_s+=("$s"); else lin_t+=("$t") lin_a+=("$a") lin_s+=("$s"); fi
            done
            note "round $r: update Linux ${lin_t[-1]} s, Windows under Wine ${win_t[-1]} s; agent RSS ${lin_a[-1]} / ${win_a[-1]} MiB, supervisor ${lin_s[-1]} / ${win_s[-1]} MiB"
        done
    fi
    local msi_rows=""
    if [[ -z $only || $only == msi ]]; then
        windows_prefix
        msi_rows=$(windows_msi_rows)
    fi
    local update_row="" memory_rows=""
    if ((${#lin_t[@]})); then
        update_row="| update, 2.0.0 dropped in → agent reports it | $(printf '%s\n' "${lin_t[@]}" | spread) | $(printf '%s\n' "${win_t[@]}" | spread) | $(ratio "$(printf '%s\n' "${win_t[@]}" | median_of)" "$(printf '%s\n' "${lin_t[@]}" | median_of)") |"
        memory_rows="| agent RSS, 2.0.0 settled | $(printf '%s\n' "${lin_a[@]}" | spread_as %.1f " MiB") | $(printf '%s\n' "${win_a[@]}" | spread_as %.1f " MiB") | $(ratio "$(printf '%s\n' "${win_a[@]}" | median_of)" "$(printf '%s\n' "${lin_a[@]}" | median_of)") |
| supervisor RSS (agent-wrapper.sh / agent-service.exe) | $(printf '%s\n' "${lin_s[@]}" | spread_as %.1f " MiB") | $(printf '%s\n' "${win_s[@]}" | spread_as %.1f " MiB") | $(ratio "$(printf '%s\n' "${win_s[@]}" | median_of)" "$(printf '%s\n' "${lin_s[@]}" | median_of)") |"
    fi
    if [[ -n $only ]]; then
        printf '%s\n%s\n%s\n%s\n' "$size_row" "$update_row" "$memory_rows" "$msi_rows"
        echo "windows: WINDOWS_ONLY=$only, BENCHMARKS.md left as it was" >&2
        return
    fi

    write_section windows <<EOF
## Windows: the agent as a Windows service, under Wine, beside the Linux agent

\`WINDOWS_ROUNDS=$rounds $(bench_command windows)\` on $(machine), Wine $(wine_env "$WINE64" --version 2>/dev/null || echo "?"), at commit $(git -C "$root" rev-parse --short HEAD).
Release builds of this tree packed by \`scripts/build-dist.sh\` (the Linux bundle for this
machine, \`--target $WINDOWS_TARGET\` for Windows, cross-built with mingw); median
(min–max) over the rounds, Linux and Windows alternated within each round (the first of
each round swapped).

| | Linux (x86_64 glibc) | Windows (x86_64, under Wine 8) | ratio (Windows / Linux) |
|---|---|---|---|
$size_row
| \`agent-service.exe\` (the service; Linux has \`agent-wrapper.sh\`) | – | $win_service_kib KiB | – |

$update_row
$memory_rows

The Windows bundle carries three programs where the Linux one carries one and a script:
\`agent.exe\`, the service \`agent-service.exe\`, and \`agent-bundle.exe\` (the updater,
run from a copy since a running program's file cannot be replaced), besides its own stub.

Update: a server serving 1.0.0 and the agent installed from that platform's 1.0.0 bundle
(Linux: started by its wrapper; Windows: \`--install\` under Wine, then registered and
started as a Windows service; both long-polling, 1 s heartbeat and stability window), then
2.0.0's bundle renamed into the download directory; the time until \`/admin/agents\` shows
the agent at 2.0.0+2 (the server's scan, the held connect answered, a delta, verification,
the swap, the new agent's start through its wrapper or service, the stability window and
its report). The two releases carry the same programs, so the deltas are small and the
time is the update's machinery, not its bytes.

**Wine is in the way.** Every Windows process here is a Linux process running Wine's
loader: a start costs several times what it does on Windows (Wine maps its own DLLs and
talks to \`wineserver\` for every handle), and the resident memory counts Wine's DLLs and
heaps beside the program's. The Windows figures bound what a real Windows machine does;
they are not a measure of it.
EOF

    write_section windows-msi <<EOF
## Windows: the MSI against the bundle's --install (issue 62)

\`WINDOWS_MSI_ROUNDS=${WINDOWS_MSI_ROUNDS:-3} $(bench_command windows)\` on $(machine), Wine $(wine_env "$WINE64" --version 2>/dev/null || echo "?"), at commit $(git -C "$root" rev-parse --short HEAD).
From the command's start to the server listing the agent (registered with its label),
under Wine, on a machine of its own each time (a directory and service name of its own),
alternated: \`msiexec /i agent.msi /qn SERVER_URL=… ENROLL_TOKEN=… LABELS=bench=…\`
(the MSI \`scripts/build-dist.sh --target $WINDOWS_TARGET\` wrote, removed with
\`msiexec /x\` after each round) against the same release's bundle \`--install
--server-url … --enroll-token … --label bench=…\`; median (min–max) over the rounds.

| how | median (min–max) | rounds |
|---|---|---|
$msi_rows

The MSI costs msiexec itself, the bundle extracted from the MSI's cabinet into
\`agent-setup\\\`, and the enrollment check the MSI asks for (\`--check-server\`: the new
agent asks the server's \`/install/check-enrollment\` before it is put in place, about
one agent start under Wine). Both then install the same way and register at the agent's
first contact.
EOF
}
