#!/usr/bin/env bash
# What every benchmark of scripts/bench.sh shares: the tools it needs, the release build,
# the variant measured (BENCH_BASELINE), the scratch directory and its cleanup, and the
# helpers more than one benchmark calls. Sourced by scripts/bench.sh from the repository
# root, after it has read its arguments; not run alone.
#
# Why these helpers are bash beside the tests' Rust harness (tests/support): a benchmark
# measures two builds side by side (this tree's and BENCH_BASELINE's, `use_variant`), each
# with its own tree's binaries and installer files, and drives tools the harness does not
# (wrk, hyperfine, nginx, PostgreSQL's own binaries). The helpers are thin calls of the
# commands the harness calls too (agent-bundle keygen and pack, update-server), and make
# distributions of a given size, which the tests never need.
# shellcheck disable=SC2034,SC2154 # globals set here are read by the benchmarks; root is bench.sh's

need=()
for tool in hyperfine wrk nginx jq curl minisign python3 openssl /usr/bin/time; do
    command -v "$tool" >/dev/null || need+=("$tool")
done
if ((${#need[@]})); then
    pkgs=()
    for tool in "${need[@]}"; do
        case "$tool" in nginx) pkgs+=(nginx-light) ;; /usr/bin/time) pkgs+=(time) ;; *) pkgs+=("$tool") ;; esac
    done
    if [[ $(id -u) -eq 0 ]]; then
        apt-get update -qq && apt-get install -y -qq "${pkgs[@]}" >/dev/null
    else
        echo "bench.sh: missing ${need[*]}; install them (apt-get install ${pkgs[*]})" >&2
        exit 1
    fi
fi

# BENCH_PROFILE=dev: the dev build (target/debug, as the tests run it) instead of the
# release one; a section says which build it measured.
if [[ ${BENCH_PROFILE:-release} == dev ]]; then
    echo "building dev binaries..." >&2
    cargo build --workspace --bins --locked >&2
    bin=$root/target/debug
    bench_build="dev build"
else
    echo "building release binaries..." >&2
    cargo build --release --locked --bins >&2
    bin=$root/target/release
    bench_build="release build"
fi
baseline=${BENCH_BASELINE:-}
if [[ -n $baseline && ! -x $baseline/target/release/agent-bundle ]]; then
    echo "bench.sh: BENCH_BASELINE=$baseline has no target/release/agent-bundle; build it there first" >&2
    exit 1
fi
# The variant being measured: its binaries and the tree its installer files come from.
vbin=$bin
vroot=$root
vname=ours
use_variant() {
    vname=$1
    case $1 in
    ours) vbin=$bin vroot=$root ;;
    baseline) vbin=$baseline/target/release vroot=$baseline ;;
    esac
}

work=$(mktemp -d /tmp/agent-bench.XXXXXX)
pids=()
# Commands a benchmark needs run however it ends (eval'd by cleanup), e.g. undoing a
# source change it made to build a second release.
on_exit=()
cleanup() {
    local undo
    for undo in "${on_exit[@]}"; do eval "$undo" || true; done
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    # Agents, wrappers and updaters detach on purpose; end whatever runs from here.
    pkill -KILL -f "$work" 2>/dev/null || true
    if [[ -n ${pgdir:-} ]]; then
        runuser -u postgres -- "$(pg_bin)/pg_ctl" -D "$pgdir/data" -m immediate stop >/dev/null 2>&1 || true
        rm -rf "$pgdir"
    fi
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

note() { printf '  %s\n' "$*" >&2; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "n/a"; else printf "%.2f", a / b }'; }

secs() { awk -v s="$1" 'BEGIN { printf "%.3f s", s }'; }

# spread_as FORMAT [UNIT]: reads numbers, prints "median UNIT (min–max)", each number in
# the printf FORMAT ("%%" in UNIT for a percent sign); "n/a" when there are none.
spread_as() {
    sort -n | awk -v f="$1" -v u="${2:-}" '{ a[NR] = $1 } END {
        if (NR == 0) print "n/a"; else printf f u " (" f "–" f ")", a[int((NR + 1) / 2)], a[1], a[NR] }'
}

# Reads numbers, prints "median s (min–max)".
spread() { spread_as %.3f " s"; }

# Reads milliseconds, prints "median ms (min–max)".
spread_ms() { spread_as %.2f " ms"; }

# Reads numbers, prints the median alone.
median_of() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }

# Median wall time in seconds of a command (hyperfine; a shell is used for pipes).
median() {
    local json=$work/hyperfine.json
    hyperfine --style none --runs "${RUNS:-5}" --export-json "$json" "$@" >/dev/null 2>&1
    jq -r '.results[0].median' "$json"
}

# Replaces the block of section $1 in BENCHMARKS.md with stdin.
write_section() {
    local name=$1 body=$work/section.md file=$root/BENCHMARKS.md
    cat >"$body"
    [[ -f $file ]] || printf '%s\n\n%s\n' '# Benchmarks' "Made by scripts/bench.sh; each section names the command that made it." >"$file"
    if ! grep -q "<!-- bench:$name:start -->" "$file"; then
        printf '\n<!-- bench:%s:start -->\n<!-- bench:%s:end -->\n' "$name" "$name" >>"$file"
    fi
    awk -v name="$name" -v body="$body" '
        $0 == "<!-- bench:" name ":start -->" { print; while ((getline line < body) > 0) print line; skip = 1; next }
        $0 == "<!-- bench:" name ":end -->" { skip = 0 }
        !skip { print }
    ' "$file" >"$file.tmp" && mv "$file.tmp" "$file"
}

machine() {
    printf '%s, %s cores, %s MiB RAM, %s' "$(uname -m)" "$(nproc)" \
        "$(awk '/MemTotal/ { printf "%d", $2 / 1024 }' /proc/meminfo)" "$(date -u +%Y-%m-%d)"
}

# A distribution of about $2 MiB: the real binaries plus incompressible and text-like
# payload, the mix a real agent with bundled libraries has.
make_dist() {
    local dir=$1 mib=$2 text_share=${3:-4}
    mkdir -p "$dir/bin" "$dir/conf.default" "$dir/lib"
    cp "$vbin/agent" "$dir/bin/agent"
    # The supervisor the wrapper runs, in versions that have one (older wrappers were
    # the supervisor themselves).
    [[ ! -f $vbin/agent-service ]] || cp "$vbin/agent-service" "$dir/bin/agent-service"
    cp "$vroot/installer/agent-wrapper.sh" "$dir/bin/agent-wrapper.sh"
    cp "$vroot/installer/agent.toml" "$dir/conf.default/agent.toml"
    cp "$vroot/installer/README.txt" "$dir/README.txt"
    cp "$vroot/LICENSE" "$dir/LICENSE"
    # Pad to the target size, counting the binaries already there (base64 makes 3/10 of
    # the padding into 4/10).
    local have want pad
    have=$(du -sb "$dir" | cut -f1)
    want=$((mib * 1024 * 1024))
    pad=$((want > have ? want - have : 0))
    head -c "$((pad * (10 - text_share) / 10))" /dev/urandom >"$dir/lib/blob.bin"
    head -c "$((pad * text_share * 3 / 40))" /dev/urandom | base64 >"$dir/lib/data.txt"
}

# make_pki DIR: a private CA and a P-256 certificate for 127.0.0.1 it issued (DIR/ca.pem,
# DIR/server.pem, DIR/server.key).
make_pki() {
    local dir=$1
    mkdir -p "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=bench CA" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
        -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$dir/ext.cnf"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 1 -extfile "$dir/ext.cnf" -out "$dir/server.pem" 2>/dev/null
}

keys() {
    [[ -f $work/keys/update.key ]] || "$bin/agent-bundle" keygen --out "$work/keys" >/dev/null
}

# pack V DIST OUT: packs and prints the bundle path.
pack() {
    "$vbin/agent-bundle" pack --dist "$2" --version "$1" --build 1 --key "$work/keys/update.key" --out "$3" >/dev/null
    echo "$3/agent-bundle-$1"
}

wait_http() {
    local url=$1 _
    for _ in $(seq 1 200); do
        curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "bench.sh: $url never answered; server logs:" >&2
    tail -n 5 "$work"/*.log >&2 2>/dev/null || true
    return 1
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
        shuf -i 20000-60000 -n 1
}

# start_server HOME PORT [ENV...]: starts update-server in the background, with the
# arguments in the array server_args when set (a --config, say).
start_server() {
    local home=$1 port=$2
    shift 2
    env "$@" "${server_bin:-$bin}/update-server" --home "$home" --listen "127.0.0.1:$port" \
        ${server_args[@]+"${server_args[@]}"} >"$home.log" 2>&1 &
    pids+=($!)
    server_pid=$!
    wait_http "${health_url:-http://127.0.0.1:$port/healthz}"
}

# wrk_run CONNS SECONDS URL: prints "requests bytes seconds socket_errors non2xx".
wrk_run() {
    local lua=$work/report.lua
    cat >"$lua" <<'EOF'
done = function(s, latency, requests)
    local e = s.errors
    io.write(string.format("WRK %d %d %.6f %d %d\n", s.requests, s.bytes, s.duration / 1e6,
        e.connect + e.read + e.write + e.timeout, e.status))
end
EOF
    local threads=2
    (($1 < threads)) && threads=$1
    wrk -t"$threads" -c"$1" -d"$2"s --timeout 60s -s "$lua" "$3" 2>&1 | awk '/^WRK / { print $2, $3, $4, $5, $6 }'
}

pg_bin() { compgen -G "/usr/lib/postgresql/*/bin" | sort -V | tail -1; }

# cpu_secs PID...: CPU seconds (user + system) the processes used so far.
cpu_secs() {
    local tck total=0 pid
    tck=$(getconf CLK_TCK)
    for pid in "$@"; do
        total=$(awk -v t="$total" -v k="$tck" '{ print t + ($14 + $15) / k }' "/proc/$pid/stat" 2>/dev/null || echo "$total")
    done
    echo "$total"
}

# hwm_mib PID: peak resident memory.
hwm_mib() { status_mib VmHWM "$1"; }

# status_mib FIELD PID: a /proc/PID/status field given in kB, in MiB.
status_mib() { awk -v f="$1:" '$1 == f { printf "%.0f", $2 / 1024 }' "/proc/$2/status"; }

# sample_anon PID FILE: writes the highest RssAnon (KiB) of PID to FILE while it lives.
sample_anon() {
    local max=0 cur
    echo 0 >"$2"
    while [[ -r /proc/$1/status ]]; do
        cur=$(awk '/RssAnon/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0)
        if ((${cur:-0} > max)); then
            max=$cur
            echo "$max" >"$2"
        fi
        sleep 0.05
    done
}

# An agent 1.0.0+1 (release binaries of the variant) installed under $1, talking to $2,
# env lines $3.
install_agent() {
    local prefix=$1 url=$2 env=$3
    "$(base_bundle)" --install="$prefix" >/dev/null
    printf '[server]\nurls = ["%s"]\n[agent]\nheartbeat = "1s"\n' "$url" >"$prefix/agent/conf/agent.toml"
    printf '%s\n' "$env" >"$prefix/agent/conf/agent-env.sh"
}

# The bundle agents of the variant start from (prints its path). Packed before any bundle
# they update to: an agent refuses a bundle signed earlier than the one it runs.
base_bundle() {
    local dir=$work/b1-$vname
    if [[ ! -f $dir/agent-bundle-1.0.0 ]]; then
        make_dist "$dir-dist" 0
        pack 1.0.0 "$dir-dist" "$dir" >/dev/null
        sleep 1 # signed-at has one-second resolution
    fi
    echo "$dir/agent-bundle-1.0.0"
}

# serve_bundle SERVER_HOME PORT BUNDLE: makes it the one bundle the server serves, and
# returns once /agentupdate/version describes it.
serve_bundle() {
    local sha
    rm -f "$1/downloads/agent/"agent-bundle-*
    cp "$3" "$3.minisig" "$1/downloads/agent/"
    sha=$(sha256sum "$3" | cut -d' ' -f1)
    until curl -fsS "http://127.0.0.1:$2/agentupdate/version" 2>/dev/null | grep -q "agent.latest.sha256=$sha"; do
        sleep 0.1
    done
}

wait_file() { # wait_file SECONDS FILE TEXT
    local end=$((SECONDS + $1))
    until grep -q "$3" "$2" 2>/dev/null; do
        if ((SECONDS > end)); then
            echo "bench.sh: timed out waiting for '$3' in $2" >&2
            tail -n 20 "$2" >&2 2>/dev/null || true
            return 1
        fi
        sleep 0.05
    done
}

# Seconds (with fraction) of the RFC 3339 timestamp that starts a tracing log line.
log_secs() { date -d "$(awk '{ print $1; exit }' <<<"$1")" +%s.%N; }

stop_home() {
    "$1/current/bin/agent-wrapper.sh" kill >/dev/null 2>&1 || true
    pkill -KILL -f "$1" 2>/dev/null || true
}

# The command line that made a section, as it was run.
bench_command() {
    local profile=
    [[ ${BENCH_PROFILE:-release} == release ]] || profile="BENCH_PROFILE=$BENCH_PROFILE "
    if [[ -n $baseline && $1 != rollout ]]; then
        echo "${profile}BENCH_BASELINE=<checkout of $(git -C "$baseline" rev-parse --short HEAD)> scripts/bench.sh $1"
    else
        echo "${profile}scripts/bench.sh $1"
    fi
}

# A release update-server on $2 with home $1 and env $3..., serving bundle $4; sets
# server_pid.
sim_server() {
    local home=$1 port=$2 served=$3
    shift 3
    rm -rf "$home"
    mkdir -p "$home/downloads/agent"
    start_server "$home" "$port" RUST_LOG=warn UPDATE_SERVER_ADMIN_TOKEN=bench "$@"
    serve_bundle "$home" "$port" "$served"
}

stop_server() {
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
}

# until_true SECONDS WHAT COMMAND...: polls COMMAND every 50 ms; fails saying WHAT after
# SECONDS.
until_true() {
    local secs=$1 what=$2
    local end=$((SECONDS + secs))
    shift 2
    until "$@"; do
        if ((SECONDS > end)); then
            echo "bench.sh: timed out after $secs s waiting for $what" >&2
            return 1
        fi
        sleep 0.05
    done
}

# one_agent_at PORT VERSION: whether the server's one agent reports VERSION.
one_agent_at() {
    curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$1/admin/agents" 2>/dev/null |
        jq -e --arg v "$2" 'length == 1 and .[0].version == $v' >/dev/null
}

# drop_bundle DIR BUNDLE: puts BUNDLE (and its signature) into the download directory DIR
# as the only release, each file renamed into place whole, signature first.
drop_bundle() {
    local dir=$1 bundle=$2 name
    name=$(basename "$bundle")
    rm -f "$dir"/agent-bundle-*
    cp "$bundle.minisig" "$dir/.part.minisig"
    cp "$bundle" "$dir/.part"
    mv "$dir/.part.minisig" "$dir/$name.minisig"
    mv "$dir/.part" "$dir/$name"
}
