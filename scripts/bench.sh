#!/usr/bin/env bash
# Benchmarks, each against a peer measured in the same run on the same machine.
# usage: scripts/bench.sh [SECTION...]     (default: bundle server)
#   bundle   pack / install / verify of a 100 MiB distribution vs tar czf / tar xzf / b2sum+sha256sum
#   server   download throughput and /version rate vs nginx; 2000 attempts at limit 45
#   agent    first 409 to updater spawned, 20 MiB and 100 MiB bundles (download vs verify)
#   update   downtime of an update and of a rollback (default timings) vs a wrapper restart
#   fleet    30 agents through a download limit of 5 with Retry-After 1
#   rollout  fleet-sim: connect latency with and without a rollout, wave times with a plan
#   hostile  peak memory of install/update on a hostile archive; server memory under slow heads
#   trust    HTTPS download and /version rate vs nginx with ssl on the same certificate;
#            the cost of token checks on connect at 1,000 agents vs the server before them
#   cloud    fleet-sim at 10,000 agents: one server on SQLite vs two on PostgreSQL, then
#            staged rollouts (1%, 10%, 100%) with 2 % and 10 % simulated failures
#   longpoll fleet-sim at 10,000 agents: a staged rollout with long polls vs heartbeats;
#            one server holding 20,000 long-polling agents (RSS, CPU, wave to told);
#            LONGPOLL_ONLY=rollout|held runs one part and prints it, BENCHMARKS.md untouched
#            (LONGPOLL_MODES="longpoll" then skips the heartbeat rounds)
#   workload the node exporter as a workload: its downtime in an update vs a plain restart
#            of the same program; the agent's CPU and RSS while it supervises
#   opamp    fleet-sim --protocol opamp at 10,000 agents over HTTP and WebSocket vs the
#            native protocol; a configuration push to APPLIED on 10,000 WebSocket agents
#   config   fleet-sim: a configuration set to 1,000 and 10,000 agents (APPLIED at the
#            server), heartbeats vs long polls; connect latency with a config rollout vs none
# Each section rewrites its own block in BENCHMARKS.md; the others are left as they were.
# BENCH_BASELINE=DIR: a checkout of an earlier commit with target/release built; update,
# fleet and longpoll's held agents then measure it too, alternating with this tree.
# Needs: hyperfine, wrk, nginx, jq, minisign, python3, GNU time (installed with apt-get when
# missing and run as root).
set -euo pipefail

usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; }
cd "$(dirname "$0")/.."
root=$(pwd)

sections=()
for arg in "$@"; do
    case "$arg" in
    bundle | server | agent | update | fleet | rollout | hostile | trust | cloud | longpoll | workload | opamp | config) sections+=("$arg") ;;
    all) sections+=(bundle server agent update fleet rollout hostile trust cloud longpoll workload opamp config) ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench.sh: unknown section $arg" >&2; usage >&2; exit 2 ;;
    esac
done
((${#sections[@]})) || sections=(bundle server)

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

echo "building release binaries..." >&2
cargo build --release --locked --bins >&2
bin=$root/target/release
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
cleanup() {
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

keys() {
    [[ -f $work/keys/update.key ]] || "$bin/agent-bundle" keygen --out "$work/keys" >/dev/null
}

# pack V DIST OUT: packs and prints the bundle path.
pack() {
    "$vbin/agent-bundle" pack --dist "$2" --version "$1" --build 1 --key "$work/keys/update.key" --out "$3" >/dev/null
    echo "$3/agent-bundle-$1"
}

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

# start_server HOME PORT [ENV...]: starts update-server in the background.
start_server() {
    local home=$1 port=$2
    shift 2
    env "$@" "${server_bin:-$bin}/update-server" --home "$home" --listen "127.0.0.1:$port" >"$home.log" 2>&1 &
    pids+=($!)
    server_pid=$!
    wait_http "${health_url:-http://127.0.0.1:$port/healthz}"
}

start_nginx() {
    local dir=$1 port=$2
    mkdir -p "$dir/www/agentupdate" "$dir/logs"
    cat >"$dir/nginx.conf" <<EOF
user root;
worker_processes auto;
daemon off;
pid $dir/nginx.pid;
error_log $dir/logs/error.log;
events { worker_connections 8192; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    default_type text/plain;
    server {
        listen 127.0.0.1:$port;
        root $dir/www;
    }
}
EOF
    nginx -p "$dir" -c "$dir/nginx.conf" &
    pids+=($!)
    wait_http "http://127.0.0.1:$port/agentupdate/version"
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

bench_server() {
    echo "server: download throughput, /version rate, 2000 attempts at limit 45" >&2
    keys
    local dist=$work/sdist
    make_dist "$dist" 100
    local bundle
    bundle=$(pack 1.0.0 "$dist" "$work/sout")
    local home=$work/server sport nport
    mkdir -p "$home/downloads/agent"
    cp "$bundle" "$bundle.minisig" "$home/downloads/agent/"
    sport=$(free_port)
    start_server "$home" "$sport" UPDATE_SERVER_SERVER_MAX_CONNECTIONS=8192 RUST_LOG=warn
    mkdir -p "$work/nginx/www/agentupdate"
    curl -fsS "http://127.0.0.1:$sport/agentupdate/version" >"$work/nginx/www/agentupdate/version"
    cp "$bundle" "$work/nginx/www/agentupdate/download"
    nport=$(free_port)
    start_nginx "$work/nginx" "$nport"

    # Rounds alternate between the two servers, so that what else the machine does
    # falls on both alike.
    local i bytes secs req
    for i in 1 2 3 4 5; do
        read -r _ bytes secs _ _ < <(wrk_run 16 8 "http://127.0.0.1:$sport/agentupdate/download")
        awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.0f\n", b / s / 1048576 }' >>"$work/dl-ours"
        read -r _ bytes secs _ _ < <(wrk_run 16 8 "http://127.0.0.1:$nport/agentupdate/download")
        awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.0f\n", b / s / 1048576 }' >>"$work/dl-nginx"
        read -r req _ secs _ _ < <(wrk_run 64 5 "http://127.0.0.1:$sport/agentupdate/version")
        awk -v r="$req" -v s="$secs" 'BEGIN { printf "%.0f\n", r / s }' >>"$work/v-ours"
        read -r req _ secs _ _ < <(wrk_run 64 5 "http://127.0.0.1:$nport/agentupdate/version")
        awk -v r="$req" -v s="$secs" 'BEGIN { printf "%.0f\n", r / s }' >>"$work/v-nginx"
        note "round $i: download $(tail -1 "$work/dl-ours") vs $(tail -1 "$work/dl-nginx") MiB/s, /version $(tail -1 "$work/v-ours") vs $(tail -1 "$work/v-nginx") req/s"
    done
    local dl_ours dl_nginx v_ours v_nginx
    dl_ours=$(median_of <"$work/dl-ours")
    dl_nginx=$(median_of <"$work/dl-nginx")
    v_ours=$(median_of <"$work/v-ours")
    v_nginx=$(median_of <"$work/v-nginx")
    range() { spread_as %s <"$1"; }

    # A fresh server for the storm, so its peak RSS and peak in-flight are its own.
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    sport=$(free_port)
    start_server "$home" "$sport" UPDATE_SERVER_SERVER_MAX_CONNECTIONS=8192 RUST_LOG=warn
    local storm sampler
    # The kernel keeps no peak of anonymous memory; sample it while the storm runs.
    sample_anon "$server_pid" "$work/anon-peak" &
    sampler=$!
    read -r storm_req _ storm_secs storm_err storm_503 < <(wrk_run 2000 8 "http://127.0.0.1:$sport/agentupdate/download")
    storm=$(curl -fsS "http://127.0.0.1:$sport/metrics")
    local peak rss served
    peak=$(awk '$1 == "agentupdate_downloads_in_flight_peak" { print $2 }' <<<"$storm")
    served=$(awk '/^agentupdate_downloads_total\{code="200"\}/ { print $2 }' <<<"$storm" | head -1)
    rss=$(awk '/VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$server_pid/status")
    kill "$sampler" 2>/dev/null || true
    local anon
    anon=$(awk '{ printf "%.1f", $1 / 1024 }' "$work/anon-peak")
    note "storm: $storm_req answers in ${storm_secs}s, socket errors $storm_err, 503s $storm_503, peak in flight $peak, peak RSS $rss MiB, peak anonymous RSS $anon MiB"

    write_section server <<EOF2
## update-server against nginx

\`scripts/bench.sh server\` on $(machine). Bundle of $(($(stat -c %s "$bundle") / 1048576)) MiB.
nginx $(nginx -v 2>&1 | sed 's/.*\///') serves the same file (\`sendfile on\`) and a static copy of the
\`/agentupdate/version\` text, on the same loopback, load from \`wrk\` (2 threads) in the same run.
Both servers and wrk share the machine's cores. Five rounds, alternating between the two
servers; median (min–max), and the ratio of the medians.

| measure | update-server | nginx | ratio | target |
|---|---|---|---|---|
| download, 16 parallel clients, 8 s (MiB/s) | $(range "$work/dl-ours") | $(range "$work/dl-nginx") | $(ratio "$dl_ours" "$dl_nginx") | ≥ 0.9 |
| \`/agentupdate/version\`, 64 connections, 5 s (req/s) | $(range "$work/v-ours") | $(range "$work/v-nginx") | $(ratio "$v_ours" "$v_nginx") | ≥ 1.0 |

2,000 concurrent download attempts for 8 s at \`downloads.limit = 45\` (fresh server):
$storm_req answers, of them $storm_503 \`503\`; socket errors (connect, read, write, timeout): **$storm_err**
(target 0); server's peak downloads in flight: **$peak** (target ≤ 45)${served:+; downloads answered 200: $served};
server peak anonymous RSS (heap and stacks, sampled every 50 ms): **$anon MiB** (target < 64 MiB).
Peak total RSS (VmHWM) was $rss MiB: it also counts the pages of the memory-mapped bundle
that were touched, which are the kernel's page cache of that file, shared and reclaimable,
not memory the server allocated.
EOF2
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

# negotiated PORT CA: "TLSv1.3 TLS_AES_256_GCM_SHA384" as openssl's client gets it.
negotiated() {
    openssl s_client -connect "127.0.0.1:$1" -CAfile "$2" </dev/null 2>/dev/null |
        awk '/^New, / { p = $2; c = $NF } END { sub(",", "", p); print p, c }'
}

# The server as it was before agent credentials (the parent of the commit that added
# them), built once into target/bench-before-credentials.
BEFORE_CREDENTIALS=dc4eca8
before_credentials() {
    local dir=$root/target/bench-before-credentials
    if [[ ! -x $dir/target/release/update-server ]]; then
        echo "building update-server at $BEFORE_CREDENTIALS (before credentials) in $dir..." >&2
        [[ -d $dir ]] || git -C "$root" worktree add --detach "$dir" "$BEFORE_CREDENTIALS" >&2
        (cd "$dir" && cargo build --release --locked --bin update-server >&2)
    fi
    echo "$dir/target/release"
}

bench_trust() {
    echo "trust: HTTPS against nginx with ssl; token checks on connect at 1,000 agents" >&2
    keys
    local pki=$work/pki
    make_pki "$pki"
    local dist=$work/tdist
    make_dist "$dist" 100
    local bundle
    bundle=$(pack 1.0.0 "$dist" "$work/tout")
    local home=$work/tserver sport nport
    mkdir -p "$home/downloads/agent"
    cp "$bundle" "$bundle.minisig" "$home/downloads/agent/"
    sport=$(free_port)
    health_url="https://127.0.0.1:$sport/healthz" CURL_CA_BUNDLE=$pki/ca.pem \
        start_server "$home" "$sport" UPDATE_SERVER_SERVER_MAX_CONNECTIONS=8192 RUST_LOG=warn \
        "UPDATE_SERVER_TLS_CERT=$pki/server.pem" "UPDATE_SERVER_TLS_KEY=$pki/server.key"
    local www=$work/tnginx/www
    mkdir -p "$www/agentupdate" "$work/tnginx/logs"
    curl -fsS --cacert "$pki/ca.pem" "https://127.0.0.1:$sport/agentupdate/version" >"$www/agentupdate/version"
    cp "$bundle" "$www/agentupdate/download"
    nport=$(free_port)
    cat >"$work/tnginx/nginx.conf" <<EOF
user root;
worker_processes auto;
daemon off;
pid $work/tnginx/nginx.pid;
error_log $work/tnginx/logs/error.log;
events { worker_connections 8192; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    default_type text/plain;
    server {
        listen 127.0.0.1:$nport ssl;
        ssl_certificate $pki/server.pem;
        ssl_certificate_key $pki/server.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        root $www;
    }
}
EOF
    nginx -p "$work/tnginx" -c "$work/tnginx/nginx.conf" &
    pids+=($!)
    CURL_CA_BUNDLE=$pki/ca.pem wait_http "https://127.0.0.1:$nport/agentupdate/version"
    local ours_tls nginx_tls
    ours_tls=$(negotiated "$sport" "$pki/ca.pem")
    nginx_tls=$(negotiated "$nport" "$pki/ca.pem")
    note "negotiated: update-server $ours_tls, nginx $nginx_tls"

    local i bytes secs req
    for i in 1 2 3 4 5; do
        read -r _ bytes secs _ _ < <(wrk_run 16 8 "https://127.0.0.1:$sport/agentupdate/download")
        awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.0f\n", b / s / 1048576 }' >>"$work/tdl-ours"
        read -r _ bytes secs _ _ < <(wrk_run 16 8 "https://127.0.0.1:$nport/agentupdate/download")
        awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.0f\n", b / s / 1048576 }' >>"$work/tdl-nginx"
        read -r req _ secs _ _ < <(wrk_run 64 5 "https://127.0.0.1:$sport/agentupdate/version")
        awk -v r="$req" -v s="$secs" 'BEGIN { printf "%.0f\n", r / s }' >>"$work/tv-ours"
        read -r req _ secs _ _ < <(wrk_run 64 5 "https://127.0.0.1:$nport/agentupdate/version")
        awk -v r="$req" -v s="$secs" 'BEGIN { printf "%.0f\n", r / s }' >>"$work/tv-nginx"
        note "round $i: HTTPS download $(tail -1 "$work/tdl-ours") vs $(tail -1 "$work/tdl-nginx") MiB/s, /version $(tail -1 "$work/tv-ours") vs $(tail -1 "$work/tv-nginx") req/s"
    done
    stop_server
    range() { spread_as %s <"$1"; }

    # Token checks: the same fleet-sim fleet (it keeps and sends the token a server hands
    # out) against this server and against the server before credentials, alternating.
    local before n=${TRUST_AGENTS:-1000}
    before=$(before_credentials)
    make_dist "$work/cd" 0
    local b1
    b1=$(pack 1.0.0 "$work/cd" "$work/cb1")
    local sim=("$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 2s --ramp 5s
        --download head --progress 10s)
    local variant port
    for i in 1 2 3; do
        for variant in ours before; do
            port=$(free_port)
            if [[ $variant == before ]]; then server_bin=$before; else server_bin=$bin; fi
            sim_server "$work/cs-$variant" "$port" "$b1"
            "${sim[@]}" --server "http://127.0.0.1:$port" --warmup 15s --duration 40s \
                --json "$work/cred-$variant-$i.json" >/dev/null 2>"$work/cred-$variant-$i.err"
            stop_server
        done
        server_bin=$bin
        note "round $i: connect p50 $(jq .endpoints.connect.p50_ms "$work/cred-ours-$i.json") ms with token checks, $(jq .endpoints.connect.p50_ms "$work/cred-before-$i.json") ms before them"
    done
    local ours50 ours99 before50 before99 m_o50 m_b50 m_o99 m_b99 errors
    ours50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/cred-ours-$i.json"; done | spread_ms)
    ours99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/cred-ours-$i.json"; done | spread_ms)
    before50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/cred-before-$i.json"; done | spread_ms)
    before99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/cred-before-$i.json"; done | spread_ms)
    m_o50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/cred-ours-$i.json"; done | median_of)
    m_b50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/cred-before-$i.json"; done | median_of)
    m_o99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/cred-ours-$i.json"; done | median_of)
    m_b99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/cred-before-$i.json"; done | median_of)
    errors=$(cat "$work"/cred-*.json | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')

    write_section trust <<EOF2
## Trust: HTTPS against nginx, and the cost of agent credentials

\`scripts/bench.sh trust\` on $(machine).

**HTTPS.** Bundle of $(($(stat -c %s "$bundle") / 1048576)) MiB; one P-256 certificate from a
private CA, used by both servers. nginx $(nginx -v 2>&1 | sed 's/.*\///') with \`ssl\` (TLS 1.2 and
1.3, its default ciphers, \`sendfile\` on, which TLS cannot use without kernel TLS) and a
static copy of the \`/agentupdate/version\` text; load from \`wrk\` (2 threads, OpenSSL
$(openssl version | awk '{ print $2 }')) on the same loopback. Negotiated with each: update-server
**$ours_tls**, nginx **$nginx_tls**. Five rounds, alternating; median (min–max), and the
ratio of the medians.

| measure | update-server (rustls) | nginx (OpenSSL) | ratio | target |
|---|---|---|---|---|
| HTTPS download, 16 parallel clients, 8 s (MiB/s) | $(range "$work/tdl-ours") | $(range "$work/tdl-nginx") | $(ratio "$(median_of <"$work/tdl-ours")" "$(median_of <"$work/tdl-nginx")") | ≥ 0.9 |
| HTTPS \`/agentupdate/version\`, 64 connections, 5 s (req/s) | $(range "$work/tv-ours") | $(range "$work/tv-nginx") | $(ratio "$(median_of <"$work/tv-ours")" "$(median_of <"$work/tv-nginx")") | ≥ 1.0 |

**Token checks.** \`fleet-sim\` with $n agents (heartbeat 2 s, plain HTTP, SQLite) against
this server, where every \`connect\` carries the agent's bearer token and is checked
(sha256 of the token, constant-time comparison with the stored hash), and against the
server at $BEFORE_CREDENTIALS, the commit before credentials, which checks nothing; the
same client binary, which keeps and sends a token only when a server hands one out.
Three rounds of each, alternating; latency of \`POST /agent/connect\` as the agents see it,
median (min–max) over the rounds. Errors over all runs: **$errors**.

| | with token checks | before credentials | added (medians) |
|---|---|---|---|
| connect p50 | $ours50 | $before50 | $(awk -v a="$m_o50" -v b="$m_b50" 'BEGIN { printf "%+.2f ms", a - b }') |
| connect p99 | $ours99 | $before99 | $(awk -v a="$m_o99" -v b="$m_b99" 'BEGIN { printf "%+.2f ms", a - b }') |

What the difference is made of: one more indexed read per call (the id's token hash,
\`SELECT token_hash FROM agents WHERE id = \$1\`) and a sha256 of 32 bytes; the hash and the
comparison cost microseconds, the read is the rest. It also includes everything else
that changed between the two commits on the plain-HTTP path (the connection layer that
TLS now shares).
EOF2
}

pg_bin() { compgen -G "/usr/lib/postgresql/*/bin" | sort -V | tail -1; }

# start_pg PORT: a throw-away PostgreSQL cluster in $pgdir on PORT (trust on loopback).
# synchronous_commit=off is SQLite's synchronous=NORMAL in WAL mode: a power cut may lose
# the last commits, never the database.
start_pg() {
    local port=$1 bin
    bin=$(pg_bin)
    [[ -n $bin ]] || { echo "bench.sh: PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 1; }
    pgdir=$(mktemp -d /tmp/agent-bench-pg.XXXXXX)
    chown postgres:postgres "$pgdir"
    runuser -u postgres -- "$bin/initdb" -D "$pgdir/data" -U postgres -E UTF8 --auth=trust >/dev/null
    runuser -u postgres -- "$bin/pg_ctl" -D "$pgdir/data" -l "$pgdir/log" -w start \
        -o "-p $port -k $pgdir -c listen_addresses=127.0.0.1 -c max_connections=200 -c synchronous_commit=off" >/dev/null
}

# fresh_db PORT: an empty database "fleet".
fresh_db() {
    PGOPTIONS='-c client_min_messages=warning' psql -h 127.0.0.1 -p "$1" -U postgres -X -q \
        -c 'DROP DATABASE IF EXISTS fleet' -c 'CREATE DATABASE fleet' >/dev/null
}

# cpu_secs PID...: CPU seconds (user + system) the processes used so far.
cpu_secs() {
    local tck total=0 pid
    tck=$(getconf CLK_TCK)
    for pid in "$@"; do
        total=$(awk -v t="$total" -v k="$tck" '{ print t + ($14 + $15) / k }' "/proc/$pid/stat" 2>/dev/null || echo "$total")
    done
    echo "$total"
}

# pg_cpu_secs: CPU seconds of every postgres process now running.
pg_cpu_secs() {
    # shellcheck disable=SC2046
    cpu_secs $(pgrep -u postgres -x postgres)
}

# hwm_mib PID: peak resident memory.
hwm_mib() { status_mib VmHWM "$1"; }
# rss_mib PID: resident memory now.
rss_mib() { status_mib VmRSS "$1"; }
# status_mib FIELD PID: a /proc/PID/status field given in kB, in MiB.
status_mib() { awk -v f="$1:" '$1 == f { printf "%.0f", $2 / 1024 }' "/proc/$2/status"; }

bench_cloud() {
    local n=${CLOUD_AGENTS:-10000}
    echo "cloud: $n simulated agents, one server on SQLite vs two on PostgreSQL; staged rollouts" >&2
    keys
    make_dist "$work/cd" 0
    local b1 b2
    b1=$(pack 1.0.0 "$work/cd" "$work/cb1")
    sleep 1
    b2=$(pack 2.0.0 "$work/cd" "$work/cb2")
    local pgport
    pgport=$(free_port)
    start_pg "$pgport"
    local url="postgres://postgres@127.0.0.1:$pgport/fleet"
    local sim=("$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --ramp 30s
        --download head --token bench --progress 30s)
    local setups=(sqlite postgres)

    # up SETUP PLAN FAIL...: starts the setup's servers serving b1 with the rollout plan;
    # sets $urls (the servers, for fleet-sim) and $spids.
    up() {
        local setup=$1 i port
        shift
        urls=() spids=()
        if [[ $setup == sqlite ]]; then
            port=$(free_port)
            sim_server "$work/cs-0" "$port" "$b1" "$@"
            urls+=(--server "http://127.0.0.1:$port") spids+=("$server_pid")
        else
            fresh_db "$pgport"
            for i in 0 1; do
                port=$(free_port)
                sim_server "$work/cs-$i" "$port" "$b1" "UPDATE_SERVER_DATABASE_URL=$url" \
                    "UPDATE_SERVER_SERVER_NAME=s$i" "$@"
                urls+=(--server "http://127.0.0.1:$port") spids+=("$server_pid")
            done
        fi
    }
    down() {
        local pid
        for pid in "${spids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    }

    # Heartbeats: 10,000 agents every 30 s (± 20 %), nothing to update; the last 60 s of
    # each run are measured, CPU over the same span.
    local round setup c0 p0 c1 p1
    for round in 1 2 3; do
        for setup in "${setups[@]}"; do
            up "$setup"
            "${sim[@]}" "${urls[@]}" --warmup 45s --duration 105s \
                --json "$work/steady-$setup-$round.json" >/dev/null 2>"$work/steady-$setup-$round.err" &
            local sim_pid=$!
            sleep 45
            c0=$(cpu_secs "${spids[@]}") p0=$(pg_cpu_secs)
            sleep 60
            c1=$(cpu_secs "${spids[@]}") p1=$(pg_cpu_secs)
            wait "$sim_pid"
            local hwm=0 pid
            for pid in "${spids[@]}"; do hwm=$(( $(hwm_mib "$pid") > hwm ? $(hwm_mib "$pid") : hwm )); done
            awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.1f\n", (b - a) / 60 * 100 }' >>"$work/cpu-$setup"
            if [[ $setup == postgres ]]; then
                awk -v a="$p0" -v b="$p1" 'BEGIN { printf "%.1f\n", (b - a) / 60 * 100 }' >>"$work/pgcpu"
            fi
            echo "$hwm" >>"$work/rss-$setup"
            down
            note "round $round, $setup: $(jq '[.endpoints[].per_second] | add | round' "$work/steady-$setup-$round.json") calls/s, connect p50 $(jq .endpoints.connect.p50_ms "$work/steady-$setup-$round.json") ms p99 $(jq .endpoints.connect.p99_ms "$work/steady-$setup-$round.json") ms, server CPU $(tail -1 "$work/cpu-$setup") %, peak RSS $hwm MiB"
        done
    done

    # Staged rollouts across the same fleet: waves 1%, 10%, 100%, max-failures 5 %,
    # installs of 10 s of which 2 % (then 10 %) fail.
    local plan=("UPDATE_SERVER_ROLLOUT_WAVES=1%,10%,100%" UPDATE_SERVER_ROLLOUT_MAX_FAILURES=5%
        UPDATE_SERVER_ROLLOUT_WAVE_WAIT=0 UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=600)
    local rate
    for round in 1 2; do
        for rate in 0.02 0.10; do
            [[ $round == 2 && $rate == 0.10 ]] && continue
            for setup in "${setups[@]}"; do
                up "$setup" "${plan[@]}"
                "${sim[@]}" "${urls[@]}" --install-time 10s --fail-rate "$rate" --until-rollout-end \
                    --duration 900s --json "$work/roll-$setup-$rate-$round.json" >/dev/null \
                    2>"$work/roll-$setup-$rate-$round.err" &
                local sim_pid=$!
                sleep 45
                local i
                for i in "${!spids[@]}"; do
                    serve_bundle "$work/cs-$i" "${urls[$((2 * i + 1))]##*:}" "$b2"
                done
                wait "$sim_pid"
                down
                note "round $round, $setup, fail rate $rate: $(jq -r '.rollout | "\(.state) at wave \(.wave) after \(.seconds // "?") s"' "$work/roll-$setup-$rate-$round.json")"
            done
        done
    done

    steady_row() { # steady_row SETUP NAME
        local f=("$work"/steady-"$1"-*.json)
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$2" \
            "$(for x in "${f[@]}"; do jq '[.endpoints[].per_second] | add' "$x"; done | awk '{ printf "%.0f\n", $1 }' | spread_as %s)" \
            "$(for x in "${f[@]}"; do jq .endpoints.connect.p50_ms "$x"; done | spread_ms)" \
            "$(for x in "${f[@]}"; do jq .endpoints.connect.p99_ms "$x"; done | spread_ms)" \
            "$(cat "${f[@]}" | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')" \
            "$(spread_as %s " %%" <"$work/cpu-$1")" \
            "$(sort -n "$work/rss-$1" | awk '{ a[NR] = $1 } END { printf "%s MiB", a[NR] }')"
    }
    roll_row() { # roll_row SETUP RATE NAME
        local f=("$work"/roll-"$1"-"$2"-*.json) x
        local outcome
        outcome=$(for x in "${f[@]}"; do jq -r '.rollout | "\(.state) (wave \(.wave) of 3)"' "$x"; done | sort | uniq -c | awk '{ c = $1; $1 = ""; printf "%s%s×%s", (NR > 1 ? ", " : ""), c, $0 }')
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$3" "$(awk -v r="$2" 'BEGIN { printf "%g %%", r * 100 }')" "$outcome" \
            "$(for x in "${f[@]}"; do jq '.rollout.seconds // empty' "$x"; done | spread)" \
            "$(for x in "${f[@]}"; do jq '.endpoints.report.p50_ms // empty' "$x"; done | spread_ms)" \
            "$(for x in "${f[@]}"; do jq '.endpoints.report.p99_ms // empty' "$x"; done | spread_ms)" \
            "$(cat "${f[@]}" | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')"
    }
    write_section cloud <<EOF2
## A server cloud: 10,000 agents on SQLite and on PostgreSQL

\`scripts/bench.sh cloud\` on $(machine). \`fleet-sim\` with $n agents on loopback
(each with its own id and credentials, heartbeat 30 s ± 20 %, started over 30 s), against
one release update-server on SQLite (\`fleet.db\` under its home, WAL) and against two
on one PostgreSQL $("$(pg_bin)/postgres" --version | awk '{ print $3 }') (a local cluster with
\`synchronous_commit = off\`, SQLite's durability in WAL mode; the agents spread over
both servers). Everything shares the machine's two cores, fleet-sim included.

**Heartbeats.** Three rounds of each setup, alternating; 60 s measured after 45 s of
warm-up; median (min–max) over the rounds. Calls are fleet-sim's (register and connect),
latencies its own clock. Server CPU is the update-server processes' user and system time
over the same 60 s (100 % is one core; both servers summed); PostgreSQL's own processes
used $(spread_as %s " %%" <"$work/pgcpu") more in the
PostgreSQL runs. Peak RSS is the larger server's VmHWM.

| setup | calls/s | connect p50 | connect p99 | errors | server CPU | peak RSS |
|---|---|---|---|---|---|---|
$(steady_row sqlite "one server, SQLite")
$(steady_row postgres "two servers, PostgreSQL")

**Staged rollouts.** The same fleet; 45 s after it started, 2.0.0 is dropped in (on each
server), rolled out in waves \`["1%", "10%", "100%"]\` with \`max-failures = "5%"\`, no soak;
each simulated install takes 10 s and fails with the given probability (\`--fail-rate\`),
and fleet-sim stops when the rollout completes or halts. Time is from the rollout's start
to its end as the server recorded it: mostly heartbeats, since an agent learns that its
wave opened at its next contact (up to 36 s later), then installs. Two rounds at 2 %,
one at 10 %.

| setup | failures | outcome | time | report p50 | report p99 | errors |
|---|---|---|---|---|---|---|
$(roll_row sqlite 0.02 "one server, SQLite")
$(roll_row postgres 0.02 "two servers, PostgreSQL")
$(roll_row sqlite 0.10 "one server, SQLite")
$(roll_row postgres 0.10 "two servers, PostgreSQL")

At 10 % failures the rollout must halt in its second wave at the latest (target); at 2 %
it must complete.
EOF2
}

bench_longpoll() {
    local n=${LONGPOLL_AGENTS:-10000} held=${LONGPOLL_HELD:-20000}
    echo "longpoll: a rollout of $n agents with long polls vs heartbeats; $held held agents" >&2
    # fleet-sim and the server each need a descriptor per agent.
    ulimit -Hn $((held * 2 + 4096)) 2>/dev/null || true
    ulimit -n "$(ulimit -Hn)"
    # Where the file limit cannot be raised (a container), hold what fits beside each
    # process's own files: agents past the server's connection cap would only queue.
    local fits=$(($(ulimit -n) - 200)) asked=$held
    ((held > fits)) && held=$fits
    keys
    make_dist "$work/ld" 0
    local b1 b2
    b1=$(pack 1.0.0 "$work/ld" "$work/lb1")
    sleep 1
    b2=$(pack 2.0.0 "$work/ld" "$work/lb2")
    local plan=("UPDATE_SERVER_ROLLOUT_WAVES=1%,10%,100%" UPDATE_SERVER_ROLLOUT_MAX_FAILURES=5%
        UPDATE_SERVER_ROLLOUT_WAVE_WAIT=0 UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=600)
    local sim=("$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --ramp 30s
        --download head --token bench --progress 30s --install-time 10s --fail-rate 0.02)

    # The same rollout, both ways, alternating: heartbeats (how agents ran before) and long
    # polls (how they run now); time from the rollout's start to its end as recorded.
    local round mode port only=${LONGPOLL_ONLY:-}
    local rounds=${LONGPOLL_ROUNDS:-3} held_rounds=${LONGPOLL_HELD_ROUNDS:-2}
    [[ $only == held ]] && rounds=0
    [[ $only == rollout ]] && held_rounds=0
    for round in $(seq "$rounds"); do
        for mode in ${LONGPOLL_MODES:-heartbeat longpoll}; do
            port=$(free_port)
            sim_server "$work/ls" "$port" "$b1" "${plan[@]}"
            local flag=()
            [[ $mode == longpoll ]] && flag=(--long-poll)
            "${sim[@]}" "${flag[@]}" --server "http://127.0.0.1:$port" --until-rollout-end \
                --duration 900s --json "$work/lp-$mode-$round.json" >/dev/null 2>"$work/lp-$mode-$round.err" &
            local sim_pid=$!
            sleep 45
            serve_bundle "$work/ls" "$port" "$b2"
            wait "$sim_pid"
            stop_server
            jq '.rollout.seconds // empty' "$work/lp-$mode-$round.json" >>"$work/lp-$mode"
            note "round $round, $mode: $(jq -r '.rollout | "\(.state) after \(.seconds // "?") s"' "$work/lp-$mode-$round.json"), errors $(jq '[.errors[]] | add // 0' "$work/lp-$mode-$round.json")"
        done
    done

    # One server holding $held long-polling agents (heartbeat 30 s, so each re-holds every
    # 30 s): peak RSS, CPU over 60 s at rest, then a first wave of 10 % opened by a new
    # bundle: how long after the wave opened each of its agents was told (the server's
    # told_at minus the wave's opened_at). Installs take longer than the measurement.
    # With BENCH_BASELINE, the same rounds alternate with that checkout's server (the old way).
    local rest=() rss=() cpu=() lag=() brest=() brss=() bcpu=() blag=() variant variants=(ours)
    [[ -n $baseline ]] && variants+=(baseline)
    for round in $(seq "$held_rounds"); do
        for variant in "${variants[@]}"; do
            server_bin=$bin
            [[ $variant == baseline ]] && server_bin=$baseline/target/release
            port=$(free_port)
            sim_server "$work/lh" "$port" "$b1" "UPDATE_SERVER_ROLLOUT_WAVES=10%,100%" \
                UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=3600
            "$bin/fleet-sim" --agents "$held" --agent-version 1.0.0+1 --heartbeat 30s --ramp 60s \
                --download head --install-time 600s --long-poll --progress 30s \
                --server "http://127.0.0.1:$port" --duration 240s >/dev/null 2>"$work/lh-$round.err" &
            local sim_pid=$!
            sleep 100
            local c0 c1
            c0=$(cpu_secs "$server_pid")
            sleep 60
            c1=$(cpu_secs "$server_pid")
            cpu+=("$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.1f", (b - a) / 60 * 100 }')")
            rest+=("$(rss_mib "$server_pid")")
            serve_bundle "$work/lh" "$port" "$b2"
            sleep 20
            rss+=("$(hwm_mib "$server_pid")")
            curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/rollout" >"$work/lh-rollout-$round.json"
            curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/agents" >"$work/lh-agents-$round.json"
            kill "$sim_pid" 2>/dev/null || true
            wait "$sim_pid" 2>/dev/null || true
            stop_server
            lag+=("$(jq -r --slurpfile r "$work/lh-rollout-$round.json" \
                '($r[0].waves[0].opened_at) as $o | [.[] | select(.wave == 1 and .told_at != null) | (.told_at - $o)] | sort | .[(length * 0.99 | floor)] * 1000' \
                "$work/lh-agents-$round.json")")
            note "round $round, $variant: RSS ${rest[-1]} MiB holding, ${rss[-1]} MiB peak after the wave, CPU at rest ${cpu[-1]} %, wave 1 told p99 ${lag[-1]} ms after it opened"
            if [[ $variant == baseline ]]; then
                brest+=("${rest[-1]}") brss+=("${rss[-1]}") bcpu+=("${cpu[-1]}") blag+=("${lag[-1]}")
                unset 'rest[-1]' 'rss[-1]' 'cpu[-1]' 'lag[-1]'
            fi
        done
    done
    server_bin=$bin
    if [[ -n $only ]]; then
        echo "longpoll: LONGPOLL_ONLY=$only, BENCHMARKS.md left as it was" >&2
        return
    fi

    write_section longpoll <<EOF2
## Long polls: a rollout at the speed of installs, and 20,000 held agents

\`scripts/bench.sh longpoll\` on $(machine). \`fleet-sim\` on loopback against one release
update-server on SQLite, everything on the machine's two cores.

**A staged rollout both ways.** $n agents (heartbeat 30 s, started over 30 s, \`--download
head\`), 2.0.0 dropped in 45 s after the start and rolled out in waves \`["1%", "10%", "100%"]\`
(\`max-failures = "5%"\`, no soak), installs of 10 s of which 2 % fail; time from the
rollout's start to its end as the server recorded it. Rounds alternate
heartbeats (fleet-sim without \`--long-poll\`: an agent learns its wave opened at its next
heartbeat) and long polls (\`--long-poll\`: held connects answered when the wave opens).
${LONGPOLL_ROUNDS:-3} rounds of each; median (min–max).

| agents | heartbeats | long polls | ratio |
|---|---|---|---|
| $n | $(spread <"$work/lp-heartbeat") | $(spread <"$work/lp-longpoll") | $(ratio "$(median_of <"$work/lp-heartbeat")" "$(median_of <"$work/lp-longpoll")")× faster |

Target: under 40 s with long polls (from about 134 s).

**One server holding $held agents.** $( ((held < asked)) && printf '%s' "(Not $asked: this machine's file limit, $(ulimit -n), cannot be raised here, and one process holds one descriptor per connection.) ")Long-polling agents, heartbeat 30 s (each re-holds its
connect every 30 s; its contact is written with the next batch, once a second), started over 60 s; CPU of the server process
over 60 s once all are held (100 % is one core) and its RSS then (holding); then a
bundle whose first wave is 10 % of the fleet, and the peak RSS (VmHWM) 20 s after it
opened (the wave's agents keep their connections, now also used for a download, which
hyper then serves with its own buffers); for each agent of that wave, the time from
the wave's opening to the server telling it (\`told_at\` in \`/admin/agents\` minus the
wave's \`opened_at\`), p99 over the wave. ${LONGPOLL_HELD_ROUNDS:-2} round(s)$( [[ -n $baseline ]] && printf '%s' ", alternating with the baseline's server"); each figure median (min–max).

| server | held agents | RSS holding | peak RSS after the wave | CPU at rest | wave opened → agent told, p99 |
|---|---|---|---|---|---|
| this tree | $held | $(printf '%s\n' "${rest[@]}" | spread_as %s " MiB") | $(printf '%s\n' "${rss[@]}" | spread_as %s " MiB") | $(printf '%s\n' "${cpu[@]}" | spread_as %s " %%") | $(printf '%s\n' "${lag[@]}" | spread_as %.0f " ms") |
$( ((${#brss[@]})) && printf '| baseline %s | %s | %s | %s | %s | %s |\n' "$(git -C "$baseline" rev-parse --short HEAD)" "$held" "$(printf '%s\n' "${brest[@]}" | spread_as %s " MiB")" "$(printf '%s\n' "${brss[@]}" | spread_as %s " MiB")" "$(printf '%s\n' "${bcpu[@]}" | spread_as %s " %%")" "$(printf '%s\n' "${blag[@]}" | spread_as %.0f " ms")")

Targets: under 256 MiB, under 5 % of a core, under 1 s.
EOF2
}

bench_opamp() {
    local n=${OPAMP_AGENTS:-10000} rounds=${OPAMP_ROUNDS:-3}
    echo "opamp: $n agents over OpAMP (HTTP, WebSocket) vs native; a config push to $n WebSocket agents" >&2
    # fleet-sim and the server each need a descriptor per WebSocket agent.
    ulimit -Hn $((n * 2 + 4096)) 2>/dev/null || true
    ulimit -n "$(ulimit -Hn)"
    keys
    make_dist "$work/od" 0
    local b1
    b1=$(pack 1.0.0 "$work/od" "$work/ob1")
    local sim=("$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --ramp 30s
        --download head --progress 30s)
    # endpoint_of MODE: the fleet-sim endpoint whose latency is the mode's heartbeat.
    endpoint_of() {
        case $1 in native) echo connect ;; http) echo "opamp (http)" ;; ws) echo "opamp (ws)" ;; esac
    }

    # Heartbeats of the whole fleet every 30 s (± 20 %), the served bundle the one they
    # run; the last 60 s of each run measured, server CPU over the same span. Modes
    # alternate within each round.
    local round mode port c0 c1
    for round in $(seq "$rounds"); do
        for mode in native http ws; do
            port=$(free_port)
            sim_server "$work/os" "$port" "$b1"
            local flag=()
            [[ $mode != native ]] && flag=(--protocol opamp --transport "$mode")
            "${sim[@]}" "${flag[@]}" --server "http://127.0.0.1:$port" --warmup 45s --duration 105s \
                --json "$work/op-$mode-$round.json" >/dev/null 2>"$work/op-$mode-$round.err" &
            local sim_pid=$!
            sleep 45
            c0=$(cpu_secs "$server_pid")
            sleep 60
            c1=$(cpu_secs "$server_pid")
            wait "$sim_pid" || true
            { hwm_mib "$server_pid"; echo; } >>"$work/op-rss-$mode"
            stop_server
            awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.1f\n", (b - a) / 60 * 100 }' >>"$work/op-cpu-$mode"
            local json=$work/op-$mode-$round.json ep
            ep=$(endpoint_of "$mode")
            note "round $round, $mode: $(jq '[.endpoints[].per_second] | add | round' "$json") calls/s, p50 $(jq --arg e "$ep" '.endpoints[$e].p50_ms' "$json") ms p99 $(jq --arg e "$ep" '.endpoints[$e].p99_ms' "$json") ms, errors $(jq '[.errors[]] | add // 0' "$json"), server CPU $(tail -1 "$work/op-cpu-$mode") %, peak RSS $(tail -1 "$work/op-rss-$mode") MiB"
        done
    done

    # A configuration set pushed to the group of $n WebSocket agents (waves ["100%"]):
    # from the PUT to every agent APPLIED, as the config rollout recorded it (its start
    # to its completion) and as seen by polling /admin/config every 0.2 s.
    local push=() seen=()
    for round in $(seq "$rounds"); do
        port=$(free_port)
        sim_server "$work/oc" "$port" "$b1"
        "${sim[@]}" --protocol opamp --transport ws --group edge=1 --server "http://127.0.0.1:$port" \
            --duration 200s >/dev/null 2>"$work/oc-$round.err" &
        local sim_pid=$!
        # Every agent connected and reporting before the push.
        local deadline=$((SECONDS + 120))
        until [[ $(curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/agents" | jq '[.[] | select(.protocol == "opamp" and .online)] | length') -ge $n ]]; do
            ((SECONDS < deadline)) || { note "config push: not all $n agents connected"; break; }
            sleep 2
        done
        sleep 5
        local t0 t1 applied
        t0=$(date +%s.%N)
        curl -fsS -X PUT -H "Authorization: Bearer bench" -H "Content-Type: application/json" \
            --data '{"files": {"collector.yaml": "receivers:\n  otlp: {}\n"}}' \
            "http://127.0.0.1:$port/admin/config/edge" >/dev/null
        deadline=$((SECONDS + 120))
        while :; do
            applied=$(curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/config" | jq '[.sets[] | select(.group == "edge") | .applied] | add // 0')
            [[ $applied -ge $n ]] && break
            ((SECONDS < deadline)) || { note "config push: $applied of $n APPLIED after 120 s"; break; }
            sleep 0.2
        done
        t1=$(date +%s.%N)
        seen+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')")
        push+=("$(curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/config" |
            jq '[.sets[] | select(.group == "edge") | .rollout | (.completed_at // empty) - .started_at] | first // empty')")
        kill "$sim_pid" 2>/dev/null || true
        wait "$sim_pid" 2>/dev/null || true
        stop_server
        note "config push round $round: $applied APPLIED; rollout start → complete ${push[-1]:-?} s, PUT → all APPLIED seen ${seen[-1]} s"
    done

    row() { # row MODE NAME
        local f=("$work"/op-"$1"-*.json) ep x
        ep=$(endpoint_of "$1")
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$2" \
            "$(for x in "${f[@]}"; do jq '[.endpoints[].per_second] | add' "$x"; done | awk '{ printf "%.0f\n", $1 }' | spread_as %s)" \
            "$(for x in "${f[@]}"; do jq --arg e "$ep" '.endpoints[$e].p50_ms // empty' "$x"; done | spread_ms)" \
            "$(for x in "${f[@]}"; do jq --arg e "$ep" '.endpoints[$e].p99_ms // empty' "$x"; done | spread_ms)" \
            "$(cat "${f[@]}" | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')" \
            "$(spread_as %s " %%" <"$work/op-cpu-$1")" \
            "$(spread_as %s " MiB" <"$work/op-rss-$1")"
    }
    write_section opamp <<EOF2
## OpAMP: 10,000 agents over HTTP and WebSocket beside the native protocol

\`scripts/bench.sh opamp\` on $(machine). \`fleet-sim\` with $n agents on loopback
against one release update-server on SQLite, everything on the machine's two cores
(fleet-sim's $n agents included). Each agent heartbeats every 30 s (± 20 %), started over
30 s; the served bundle is the version they run (so each was offered it once, as
installed already). Native: \`POST /agent/connect\` per heartbeat. OpAMP over HTTP
(\`--protocol opamp --transport http\`): a \`POST /v1/opamp\` per heartbeat, as
opamp-go's HTTP client polls. OpAMP over WebSocket (\`--transport ws\`): one socket per
agent held open, a heartbeat \`AgentToServer\` per 30 s answered on it. $rounds rounds,
the three modes alternating in each; 60 s measured after 45 s of warm-up; median
(min–max). Latency is fleet-sim's clock from sending a heartbeat to its answer; server
CPU is the update-server process's user and system time over the same 60 s (100 % is one
core); RSS its peak (VmHWM).

| protocol | calls/s | p50 | p99 | errors | server CPU | peak RSS |
|---|---|---|---|---|---|---|
$(row native "native (connect)")
$(row http "OpAMP over HTTP")
$(row ws "OpAMP over WebSocket")

**A configuration push to $n WebSocket agents.** The same fleet, all in group \`edge\`
(waves \`["100%"]\`), connected and quiet; a set is \`PUT\` to \`/admin/config/edge\`,
the server pushes it on every socket at once, each agent applies it and answers
\`RemoteConfigStatus\` \`APPLIED\`. The config rollout's own record (start to
completion) and the time from the \`PUT\` until \`/admin/config\` counted all $n applied
(polled every 0.2 s); $rounds rounds, median (min–max).

| agents | rollout start → complete | PUT → all APPLIED seen |
|---|---|---|
| $n | $(printf '%s\n' "${push[@]}" | grep . | spread) | $(printf '%s\n' "${seen[@]}" | spread) |
EOF2
}

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

# peak_kib CMD...: runs CMD and prints its peak resident memory in KiB (GNU time).
peak_kib() {
    /usr/bin/time -f '%M' -o "$work/time.out" "$@" >/dev/null 2>&1 || true
    tail -1 "$work/time.out"
}

# hostile_tarball FILE MIB: a .tar.gz whose first entry is a GNU long name of MIB MiB.
hostile_tarball() {
    python3 - "$1" "$2" <<'PY'
import gzip, sys
path, mib = sys.argv[1], int(sys.argv[2])
size = mib << 20
def header(name, kind, size):
    h = bytearray(512)
    h[0:len(name)] = name.encode()
    h[100:108] = b"0000755\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = ("%011o\0" % size).encode()
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:265] = b"ustar  \0"
    h[148:156] = b" " * 8
    h[148:156] = ("%06o\0 " % sum(h)).encode()
    return bytes(h)
with gzip.open(path, "wb", compresslevel=1) as gz:
    gz.write(header("././@LongLink", b"L", size))
    chunk = b"a" * (1 << 20)
    for _ in range(mib):
        gz.write(chunk)
    gz.write(header("agent/x", b"0", 0))
    gz.write(b"\0" * 1024)
PY
}

# wrap_bundle OUT VERSION TARBALL KEY: a bundle of VERSION around TARBALL (stub in front,
# then a zip), signed with the minisign KEY so that --trust-key lets it through.
wrap_bundle() {
    local out=$1 version=$2 tarball=$3 key=$4
    mkdir -p "$out"
    local bundle=$out/agent-bundle-$version
    printf 'agent.latest.version=%s\nagent.latest.build-number=1\nagent.latest.platform=x86_64-unknown-linux-gnu\n' "$version" >"$out/props"
    cp "$bin/agent-bundle" "$bundle"
    python3 - "$bundle" "$version" "$out/props" "$tarball" <<'PY'
import sys, zipfile
bundle, version, props, tarball = sys.argv[1:5]
with open(bundle, "ab") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
    z.write(props, "agent-update-version.properties")
    z.write(tarball, "agent-%s.tar.gz" % version)
    z.writestr("README.txt", "hostile\n")
    z.writestr("LICENSE", "none\n")
PY
    chmod 755 "$bundle"
    local sha
    sha=$(sha256sum "$bundle" | cut -d' ' -f1)
    minisign -S -s "$key" -m "$bundle" -x "$bundle.minisig" \
        -t "version=$version build=1 platform=x86_64-unknown-linux-gnu sha256=$sha signed-at=$(date +%s)" >/dev/null
    echo "$bundle"
}

bench_hostile() {
    echo "hostile: peak memory on hostile archives, server memory under slow clients" >&2
    use_variant ours
    # A minisign key (-W: no password) that agent-bundle pack also reads.
    [[ -f $work/mkeys/k.key ]] || { mkdir -p "$work/mkeys" && minisign -G -W -p "$work/mkeys/k.pub" -s "$work/mkeys/k.key" >/dev/null; }
    local key=$work/mkeys/k.key pub=$work/mkeys/k.pub mib=256
    make_dist "$work/hd" "$mib" 0
    "$bin/agent-bundle" pack --dist "$work/hd" --version 2.0.0 --build 1 --key "$key" --out "$work/hnormal" >/dev/null
    local normal=$work/hnormal/agent-bundle-2.0.0
    hostile_tarball "$work/hostile.tar.gz" "$mib"
    local hostile
    hostile=$(wrap_bundle "$work/hhostile" 2.0.0 "$work/hostile.tar.gz" "$key")
    make_dist "$work/hd0" 0
    "$bin/agent-bundle" pack --dist "$work/hd0" --version 1.0.0 --build 1 --key "$key" --out "$work/hbase" >/dev/null
    local i p
    for i in 1 2 3; do
        rm -rf "$work/hi-n" "$work/hi-h"
        peak_kib "$normal" --install="$work/hi-n" --trust-key "$pub" >>"$work/install-normal"
        peak_kib "$hostile" --install="$work/hi-h" --trust-key "$pub" >>"$work/install-hostile"
        # The updater: a manual --update of an installed 1.0.0 (which it does not start).
        for p in n h; do
            rm -rf "$work/hu-$p"
            "$work/hbase/agent-bundle-1.0.0" --install="$work/hu-$p" --trust-key "$pub" >/dev/null
            printf 'export AGENT_UPDATE_STABILITY_WINDOW=1s\nexport AGENT_UPDATE_HEALTH_TIMEOUT=20s\n' >"$work/hu-$p/agent/conf/agent-env.sh"
            printf '[server]\nurls = ["http://127.0.0.1:1"]\n' >"$work/hu-$p/agent/conf/agent.toml"
        done
        peak_kib env AGENT_UPDATE_STABILITY_WINDOW=1s "$normal" --update="$work/hu-n/agent" >>"$work/update-normal"
        peak_kib "$hostile" --update="$work/hu-h/agent" >>"$work/update-hostile"
        stop_home "$work/hu-n/agent"
        note "round $i: install $(tail -1 "$work/install-normal") vs $(tail -1 "$work/install-hostile") KiB, update $(tail -1 "$work/update-normal") vs $(tail -1 "$work/update-hostile") KiB"
    done
    kib() { awk '{ print $1 / 1024 }' "$1" | spread_as %.1f " MiB"; }

    # The server under 300 clients each sending a 400 KB head slowly, against idle.
    local home=$work/hserver port
    mkdir -p "$home/downloads/agent"
    cp "$work/hbase/agent-bundle-1.0.0" "$work/hbase/agent-bundle-1.0.0.minisig" "$home/downloads/agent/"
    port=$(free_port)
    start_server "$home" "$port" RUST_LOG=warn
    sleep 2
    local idle
    idle=$(awk '/RssAnon/ { print $2 }' "/proc/$server_pid/status")
    sample_anon "$server_pid" "$work/slow-peak" &
    local sampler=$!
    python3 - "$port" <<'PY'
import socket, sys, time
port = int(sys.argv[1])
clients = []
for _ in range(300):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /agentupdate/version HTTP/1.1\r\nHost: x\r\n")
    clients.append(s)
line = b"X-Pad: " + b"a" * 1014 + b"\r\n"
open_ = list(clients)
for _ in range(400):
    still = []
    for s in open_:
        try:
            s.sendall(line)
            still.append(s)
        except OSError:
            pass
    open_ = still
    if not open_:
        break
    time.sleep(0.01)
PY
    sleep 1
    kill "$sampler" 2>/dev/null || true
    local slow
    slow=$(cat "$work/slow-peak")
    note "server anonymous memory: idle $idle KiB, peak under slow heads $slow KiB"
    write_section hostile <<EOF2
## Hostile input: memory

\`scripts/bench.sh hostile\` on $(machine). Peak resident memory (GNU \`time\`), median
(min–max) of 3 rounds, alternating: \`--install\` and a manual \`--update\` of a normal
bundle whose distribution is $mib MiB, against a signed bundle whose tarball opens with a
GNU long-name header of $mib MiB (the largest hostile case; the tar crate alone would read
it whole). The hostile bundle is refused at its header; the normal one is installed.

| | normal ($mib MiB distribution) | hostile ($mib MiB long name) |
|---|---|---|
| \`--install\` | $(kib "$work/install-normal") | $(kib "$work/install-hostile") |
| \`--update\` (the updater) | $(kib "$work/update-normal") | $(kib "$work/update-hostile") |

The server's anonymous memory (heap and stacks) while 300 clients each send a 400 KB
request head a kilobyte at a time (each is cut off with \`431\` at 16 KiB), against the same
server idle: **$(awk -v k="$idle" 'BEGIN { printf "%.1f MiB", k / 1024 }')** idle, **$(awk -v k="$slow" 'BEGIN { printf "%.1f MiB", k / 1024 }')** at the peak (target < 64 MiB).
EOF2
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

# total_of LINES PATTERN: the "total Ns" of the first update.log line matching PATTERN.
total_of() { grep -m1 "$2" <<<"$1" | grep -o 'total [0-9.]*s' | grep -o '[0-9.]*'; }

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

# One update round of the current variant against the server at $1 (home $2): an update
# to $3, a plain wrapper restart, then the broken bundle $4 rolled back with the default
# timings. Appends "update restart rollback" seconds to $5 and the update's step
# breakdown to $5.steps.
update_round() {
    local port=$1 home=$2 good=$3 bad=$4 out=$5 p
    p=$work/up-$vname-$RANDOM
    serve_bundle "$home" "$port" "$good"
    install_agent "$p" "http://127.0.0.1:$port" "export AGENT_UPDATE_STABILITY_WINDOW=1s"
    "$p/agent/current/bin/agent-wrapper.sh" start >/dev/null
    local ul=$p/agent/logs/update.log
    wait_file 120 "$ul" "committed"
    local lines up
    lines=$(cat "$ul")
    up=$(awk -v a="$(total_of "$lines" 'is up')" -v b="$(total_of "$lines" 'old agent')" 'BEGIN { print a - b }')
    for what in "old agent" "configuration" "current ->" "through its wrapper" "is up"; do
        printf '%s %ss; ' "$what" "$(grep -m1 "$what" <<<"$lines" | grep -o 'step [0-9.]*s' | grep -o '[0-9.]*')"
    done >"$out.steps"
    # A plain restart of the same agent, to the same "up" condition.
    local before t0 t1 restart
    before=$(cat "$p/agent/run/agent.pid")
    t0=$(date +%s.%N)
    "$p/agent/current/bin/agent-wrapper.sh" restart >/dev/null
    until [[ -f $p/agent/run/health.json ]] && grep -q '"components_started": true' "$p/agent/run/health.json" &&
        ! grep -q "\"pid\": $before," "$p/agent/run/health.json"; do sleep 0.01; done
    t1=$(date +%s.%N)
    restart=$(awk -v a="$t1" -v b="$t0" 'BEGIN { print a - b }')
    # Then a broken bundle (its agent exits at once), rolled back with every update
    # timing at its default: what a user gets.
    printf '\n' >"$p/agent/conf/agent-env.sh"
    serve_bundle "$home" "$port" "$bad"
    wait_file 180 "$ul" "rolled back to"
    lines=$(grep -F -- '-> 3.0.0+1]' "$ul")
    local back
    back=$(awk -v a="$(total_of "$lines" 'started 2.0.0+1 again')" -v b="$(total_of "$lines" 'old agent')" 'BEGIN { print a - b }')
    echo "$up $restart $back" >>"$out"
    stop_home "$p/agent"
}

bench_update() {
    echo "update: downtime of an update and of a rollback vs a wrapper restart" >&2
    keys
    local home=$work/update-server port
    mkdir -p "$home/downloads/agent"
    port=$(free_port)
    start_server "$home" "$port" RUST_LOG=warn
    local variants=(ours) v
    [[ -n $baseline ]] && variants+=(baseline)
    declare -A good bad
    for v in "${variants[@]}"; do
        use_variant "$v"
        base_bundle >/dev/null
        make_dist "$work/ud-$v" 20
        good[$v]=$(pack 2.0.0 "$work/ud-$v" "$work/ub-$v")
        cp -a "$work/ud-$v" "$work/ubad-dist-$v"
        printf '#!/bin/sh\nexit 1\n' >"$work/ubad-dist-$v/bin/agent"
        bad[$v]=$(pack 3.0.0 "$work/ubad-dist-$v" "$work/ubad-$v")
    done
    # Rounds alternate between the variants; a baseline rollback waits out its whole
    # health timeout (60 s), so it gets three rounds to our five.
    local i
    for i in 1 2 3 4 5; do
        for v in "${variants[@]}"; do
            [[ $v == baseline && $i -gt 3 ]] && continue
            use_variant "$v"
            note "round $i, $v"
            update_round "$port" "$home" "${good[$v]}" "${bad[$v]}" "$work/update-$v.txt"
        done
    done
    use_variant ours
    local names=("update (old agent's exit to new agent up)"
        "\`agent-wrapper.sh restart\` (the peer)"
        "rollback of a version that exits at once (old agent's exit to old agent up)")
    local rows="" col
    for col in 1 2 3; do
        local row
        row="| ${names[$((col - 1))]} | $(awk -v c="$col" '{ print $c }' "$work/update-ours.txt" | spread)"
        if [[ -n $baseline ]]; then
            row+=" | $(awk -v c="$col" '{ print $c }' "$work/update-baseline.txt" | spread)"
        fi
        rows+="$row |"$'\n'
    done
    local mu mr mb
    mu=$(awk '{ print $1 }' "$work/update-ours.txt" | median_of)
    mr=$(awk '{ print $2 }' "$work/update-ours.txt" | median_of)
    mb=$(awk '{ print $3 }' "$work/update-ours.txt" | median_of)
    local head="| | this tree |" rule="|---|---|"
    if [[ -n $baseline ]]; then
        head="| | this tree | baseline $(git -C "$baseline" rev-parse --short HEAD) |"
        rule="|---|---|---|"
    fi
    note "downtime: update $mu s, rollback $mb s, wrapper restart $mr s"
    write_section update <<EOF
## Updater: downtime

\`$(bench_command update)\` on $(machine). A release agent with a 20 MiB
distribution and a release update-server on loopback; median (min–max) of 5 rounds
(3 for the baseline), alternating between the trees. Update downtime: from the old agent's
exit (as the updater sees it) to the new agent up (alive, right version, components
started; the stability window, 1 s here, follows and the agent already serves during it).
Rollback: a bundle whose agent exits at once, with the default \`update.health-timeout\`
(60 s) and \`update.stability-window\` (10 s), from the old agent's exit to the old version
started again. The peer is \`agent-wrapper.sh restart\` of the same agent to the same
condition.

$head
$rule
${rows}
Ratios to a wrapper restart (this tree, medians): update $(ratio "$mu" "$mr") (target ≤ 2),
rollback $(ratio "$mb" "$mr").

Where an update's downtime goes (steps of the last run's \`logs/update.log\`): $(sed 's/; $//' "$work/update-ours.txt.steps").
The unpack (with an fsync of every file) happens before the old agent stops: the agent
keeps serving until the journal shows the new version on disk, so the downtime is the
stop, the configuration merge, the switch and the start. A rollback is the crash
detection (the wrapper sees the new agent exit before it reports itself), the stop of its
supervisor, the switch back and the old agent's start.
EOF
}

# gap_poller PORT DIR: polls http://127.0.0.1:PORT/ every 2 ms in the background until
# DIR/stop exists, then writes the longest gap between two answers (ms) to DIR/gap;
# DIR/ready appears once it has seen a first answer.
gap_poller() {
    python3 - "$1" "$2" <<'PY' &
import http.client, os, sys, time
port, out = int(sys.argv[1]), sys.argv[2]
last, gap = None, 0.0
while not os.path.exists(out + "/stop"):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        c.request("GET", "/")
        ok = c.getresponse().status == 200
        c.close()
    except OSError:
        ok = False
    if ok:
        now = time.monotonic()
        if last is None:
            open(out + "/ready", "w").close()
        else:
            gap = max(gap, now - last)
        last = now
    time.sleep(0.002)
open(out + "/gap", "w").write("%.1f\n" % (gap * 1000))
PY
    pids+=($!)
}

# gap_of DIR: stops the poller writing to DIR and prints its longest gap (ms).
gap_of() {
    touch "$1/stop"
    until [[ -s $1/gap ]]; do sleep 0.01; done
    cat "$1/gap"
}

# exporter_dist DIR PORT: a distribution carrying the node exporter as its workload.
exporter_dist() {
    make_dist "$1" 0
    cp "$(command -v prometheus-node-exporter)" "$1/bin/node_exporter"
}

exporter_args() {
    printf '"--web.listen-address=127.0.0.1:%s", "--collector.disable-defaults", "--collector.loadavg"' "$1"
}

# One update of an agent running the exporter on a free port: its workload's longest
# silence through the update (appended to $1), then through `agent-wrapper.sh restart`
# (appended to $1.agent). Leaves the agent running, its home in $work/wl-last.
workload_update_round() {
    local out=$1 port eport home p
    port=$(free_port)
    eport=$(free_port)
    home=$work/wl-server-$RANDOM
    p=$work/wl-agent-$RANDOM
    mkdir -p "$home/downloads/agent"
    start_server "$home" "$port" RUST_LOG=warn
    serve_bundle "$home" "$port" "$work/wl1/agent-bundle-1.0.0"
    "$work/wl1/agent-bundle-1.0.0" --install="$p" >/dev/null
    cat >"$p/agent/conf/agent.toml" <<EOF
[server]
urls = ["http://127.0.0.1:$port"]
[workload]
command = ["bin/node_exporter", $(exporter_args "$eport")]
health-url = "http://127.0.0.1:$eport/metrics"
EOF
    printf 'export AGENT_UPDATE_STABILITY_WINDOW=1s\n' >"$p/agent/conf/agent-env.sh"
    "$p/agent/current/bin/agent-wrapper.sh" start >/dev/null
    until [[ -f $p/agent/run/health.json ]] && jq -e '.workload.healthy' "$p/agent/run/health.json" >/dev/null 2>&1; do
        sleep 0.05
    done
    local d=$work/gap-$RANDOM
    mkdir -p "$d"
    gap_poller "$eport" "$d"
    until [[ -f $d/ready ]]; do sleep 0.01; done
    serve_bundle "$home" "$port" "$work/wl2/agent-bundle-2.0.0"
    wait_file 120 "$p/agent/logs/update.log" "committed"
    local gap found started
    gap=$(gap_of "$d")
    echo "$gap" >>"$out"
    found=$(log_secs "$(grep -m1 'found the workload' "$p/agent/logs/agent.log")")
    started=$(log_secs "$(grep 'started the workload' "$p/agent/logs/agent.log" | tail -n 1)")
    note "update: workload silent $gap ms; the new agent took $(awk -v a="$started" -v b="$found" 'BEGIN { printf "%.1f", (a - b) * 1000 }') ms from finding the old workload to starting its own"
    # The same agent restarted by its operator: the workload stops with it.
    d=$work/gap-$RANDOM
    mkdir -p "$d"
    gap_poller "$eport" "$d"
    until [[ -f $d/ready ]]; do sleep 0.01; done
    "$p/agent/current/bin/agent-wrapper.sh" restart >/dev/null
    until jq -e '.workload.healthy' "$p/agent/run/health.json" >/dev/null 2>&1 &&
        curl -fs -o /dev/null "http://127.0.0.1:$eport/"; do sleep 0.01; done
    sleep 0.2
    gap=$(gap_of "$d")
    echo "$gap" >>"$out.agent"
    note "agent restart: workload silent $gap ms"
    stop_server
    [[ -n ${wl_last:-} ]] && stop_home "$wl_last"
    wl_last=$p/agent
}

# A plain restart of the same program on its own (what a process manager does): TERM,
# wait for it to end, start it again. Appends its longest silence (ms) to $1.
workload_restart_round() {
    local out=$1 eport d epid gap
    eport=$(free_port)
    d=$work/gap-$RANDOM
    mkdir -p "$d"
    local args=(--web.listen-address="127.0.0.1:$eport" --collector.disable-defaults --collector.loadavg)
    prometheus-node-exporter "${args[@]}" >/dev/null 2>&1 &
    epid=$!
    gap_poller "$eport" "$d"
    until [[ -f $d/ready ]]; do sleep 0.01; done
    sleep 0.2
    kill -TERM "$epid"
    wait "$epid" 2>/dev/null || true
    prometheus-node-exporter "${args[@]}" >/dev/null 2>&1 &
    epid=$!
    until curl -fs -o /dev/null "http://127.0.0.1:$eport/"; do sleep 0.01; done
    sleep 0.2
    gap=$(gap_of "$d")
    echo "$gap" >>"$out"
    note "plain restart: workload silent $gap ms"
    kill -TERM "$epid"
    wait "$epid" 2>/dev/null || true
}

bench_workload() {
    echo "workload: the node exporter's downtime in an update vs a plain restart; agent overhead" >&2
    if ! command -v prometheus-node-exporter >/dev/null; then
        apt-get install -y -qq prometheus-node-exporter >/dev/null
    fi
    keys
    exporter_dist "$work/wld1"
    pack 1.0.0 "$work/wld1" "$work/wl1" >/dev/null
    sleep 1 # signed-at has one-second resolution
    exporter_dist "$work/wld2"
    pack 2.0.0 "$work/wld2" "$work/wl2" >/dev/null
    local rounds=${WORKLOAD_ROUNDS:-5} i
    rm -f "$work/wl-update.txt" "$work/wl-update.txt.agent" "$work/wl-restart.txt"
    for ((i = 1; i <= rounds; i++)); do
        note "round $i of $rounds: update, agent restart, plain restart"
        workload_update_round "$work/wl-update.txt"
        workload_restart_round "$work/wl-restart.txt"
    done
    # Overhead: the last round's agent (2.0.0, long-polling its server... which is gone:
    # a failed connect every heartbeat), supervising its healthy exporter, idle for 60 s.
    local apid c0 c1 secs=${WORKLOAD_IDLE_SECS:-60}
    apid=$(cat "$wl_last/run/agent.pid")
    sleep 5
    c0=$(cpu_secs "$apid")
    sleep "$secs"
    c1=$(cpu_secs "$apid")
    local cpu rss
    cpu=$(awk -v a="$c1" -v b="$c0" -v s="$secs" 'BEGIN { printf "%.2f", (a - b) * 100 / s }')
    rss=$(awk '/VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$apid/status")
    stop_home "$wl_last"
    local mu mr ma
    mu=$(median_of <"$work/wl-update.txt")
    mr=$(median_of <"$work/wl-restart.txt")
    ma=$(median_of <"$work/wl-update.txt.agent")
    note "downtime: update $mu ms, plain restart $mr ms, agent restart $ma ms; agent CPU $cpu %, RSS $rss MiB"
    write_section workload <<EOF
## Workload: its downtime in an update, and the agent's overhead

\`$(bench_command workload)\` on $(machine). Release binaries. The workload is Debian's
node exporter (\`--collector.disable-defaults --collector.loadavg\`, health at
\`/metrics\`); a poller asks its \`/\` every 2 ms and reports the longest gap between two
answers. $rounds rounds, alternating; median (min–max).

| | workload's longest silence |
|---|---|
| agent update 1.0.0 → 2.0.0 carrying it | $(spread_ms <"$work/wl-update.txt") |
| plain restart of the same program (TERM, wait, start: the peer) | $(spread_ms <"$work/wl-restart.txt") |
| \`agent-wrapper.sh restart\` of the agent supervising it | $(spread_ms <"$work/wl-update.txt.agent") |

Ratio of an update to a plain restart (medians): **$(ratio "$mu" "$mr")** (target ≤ 1.2).
The old agent hands over to the updater with its workload still serving; the new
version's agent stops it just before it starts its own, so the workload is down only
for its own stop and start, as in a plain restart. The unpack, the switch and the new
agent's start happen while the old workload answers. An operator's restart of the agent
stops the workload with the agent and starts it with the new one.

Agent overhead while it supervises (the last round's agent, 2.0.0, idle for ${secs} s
after the update, a health check of \`/metrics\` every 5 s, its server gone):

| | \`agent run\` | target |
|---|---|---|
| CPU (utime + stime from \`/proc/<pid>/stat\`, in 10 ms ticks) | $cpu % of a core | < 1 % |
| RSS (\`VmRSS\`) | $rss MiB | < 16 MiB |
EOF
}

# The command line that made a section, as it was run.
bench_command() {
    if [[ -n $baseline && $1 != rollout ]]; then
        echo "BENCH_BASELINE=<checkout of $(git -C "$baseline" rev-parse --short HEAD)> scripts/bench.sh $1"
    else
        echo "scripts/bench.sh $1"
    fi
}

# One fleet round of the current variant serving bundle $2: 30 agents at once through
# the limit; appends "wall 503s-median slot-use peak" to $1.
fleet_round() {
    local out=$1 n=30 limit=5 home port
    home=$work/fleet-server-$vname-$RANDOM
    mkdir -p "$home/downloads/agent"
    port=$(free_port)
    start_server "$home" "$port" RUST_LOG=warn UPDATE_SERVER_DOWNLOADS_LIMIT=$limit \
        UPDATE_SERVER_DOWNLOADS_RETRY_AFTER=1 UPDATE_SERVER_ADMIN_TOKEN=bench
    serve_bundle "$home" "$port" "$2"
    local i env="export AGENT_UPDATE_STABILITY_WINDOW=1s
export AGENT_UPDATE_HEALTH_TIMEOUT=120s"
    local prefix=$work/fleet-$vname-$RANDOM
    for i in $(seq 1 "$n"); do install_agent "$prefix-$i" "http://127.0.0.1:$port" "$env"; done
    local t0
    t0=$(date +%s.%N)
    local starters=()
    for i in $(seq 1 "$n"); do
        "$prefix-$i/agent/current/bin/agent-wrapper.sh" start >/dev/null &
        starters+=($!)
    done
    wait "${starters[@]}" || note "a wrapper start reported failure; its supervisor keeps trying"
    # Sample the slots while any agent still waits for its download.
    local sum=0 samples=0 done_dl installed inflight
    while :; do
        done_dl=$({ grep -l "downloaded" "$prefix"-*/agent/logs/agent.log 2>/dev/null || true; } | wc -l)
        ((done_dl >= n)) && break
        inflight=$(curl -fsS "http://127.0.0.1:$port/metrics" | awk '$1 == "agentupdate_downloads_in_flight" { print $2 }' || echo 0)
        sum=$(awk -v s="$sum" -v v="${inflight:-0}" 'BEGIN { print s + v }')
        samples=$((samples + 1))
        sleep 0.1
    done
    until installed=$(curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$port/admin/agents" |
        jq '[.[] | select(.update_status == "INSTALLED" and .version == "2.0.0+1")] | length') && ((installed >= n)); do
        sleep 0.1
    done
    local wall busy use peak
    wall=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')
    busy=$(for i in $(seq 1 "$n"); do grep -c "server busy (503" "$prefix-$i/agent/logs/agent.log" || true; done | median_of)
    use=$(awk -v s="$sum" -v k="$samples" -v l="$limit" 'BEGIN { if (k == 0) print "0"; else printf "%.2f", s / k / l }')
    peak=$(curl -fsS "http://127.0.0.1:$port/metrics" | awk '$1 == "agentupdate_downloads_in_flight_peak" { print $2 }')
    note "fleet ($vname): $n INSTALLED in $wall s; median 503s per agent $busy; slot use $use; peak $peak"
    echo "$wall $busy $use $peak" >>"$out"
    for i in $(seq 1 "$n"); do stop_home "$prefix-$i/agent"; done
}

bench_fleet() {
    local pad=${FLEET_PAD_MIB:-0}
    echo "fleet: 30 agents, limit 5, Retry-After 1, distribution padded by $pad MiB" >&2
    keys
    local variants=(ours) v
    [[ -n $baseline ]] && variants+=(baseline)
    declare -A bundle size
    for v in "${variants[@]}"; do
        use_variant "$v"
        base_bundle >/dev/null
        make_dist "$work/fd-$v" "$pad"
        bundle[$v]=$(pack 2.0.0 "$work/fd-$v" "$work/fb-$v")
        size[$v]=$(awk -v b="$(stat -c %s "${bundle[$v]}")" 'BEGIN { printf "%.1f", b / 1048576 }')
    done
    local i
    for i in 1 2 3; do
        for v in "${variants[@]}"; do
            use_variant "$v"
            fleet_round "$work/fleet-$v.txt" "${bundle[$v]}"
        done
    done
    use_variant ours
    local head="| measure | this tree |" rule="|---|---|"
    local r1="| bundle size | ${size[ours]} MiB" r2 r3 r4 r5
    r2="| wall time, start to the 30th \`INSTALLED\` | $(awk '{ print $1 }' "$work/fleet-ours.txt" | spread)"
    r3="| \`503\`s per agent (median over agents, median of rounds) | $(awk '{ print $2 }' "$work/fleet-ours.txt" | median_of)"
    r4="| slot use while any agent waits (mean in flight / limit) | $(awk '{ print $3 }' "$work/fleet-ours.txt" | median_of)"
    r5="| peak downloads in flight (server, most of any round) | $(awk '{ print $4 }' "$work/fleet-ours.txt" | sort -n | tail -1)"
    if [[ -n $baseline ]]; then
        head+=" baseline $(git -C "$baseline" rev-parse --short HEAD) |"
        rule+="---|"
        r1+=" | ${size[baseline]} MiB"
        r2+=" | $(awk '{ print $1 }' "$work/fleet-baseline.txt" | spread)"
        r3+=" | $(awk '{ print $2 }' "$work/fleet-baseline.txt" | median_of)"
        r4+=" | $(awk '{ print $3 }' "$work/fleet-baseline.txt" | median_of)"
        r5+=" | $(awk '{ print $4 }' "$work/fleet-baseline.txt" | sort -n | tail -1)"
    fi
    write_section fleet <<EOF
## Fleet: 30 agents through a download limit of 5

\`$(bench_command fleet)\` on $(machine). 30 release agents (1.0.0), each in its own
home, started at once through their wrappers against a release update-server serving
2.0.0 (the real distribution: the agent and its wrapper, padded by $pad MiB) with
\`downloads.limit = 5\` and \`Retry-After: 1\`, all on loopback on one machine (agents,
updaters and server share its cores). Median (min–max) of 3 rounds per tree, alternating.

$head
$rule
$r1 |
$r2 |
$r3 |
$r4 |
$r5 |
EOF
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

bench_rollout() {
    local n=${ROLLOUT_AGENTS:-1000}
    echo "rollout: $n simulated agents, connect latency with and without a rollout, wave times" >&2
    keys
    use_variant ours
    make_dist "$work/rd" 0
    local b1 b2
    b1=$(pack 1.0.0 "$work/rd" "$work/rb1")
    sleep 1
    b2=$(pack 2.0.0 "$work/rd" "$work/rb2")
    local sim=("$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 2s --ramp 5s
        --download head --install-time 2s --token bench --progress 10s)
    local i port
    # Connect latency: a fleet at rest (its rollout completed) against the same fleet with
    # a rollout under way (the first 1 % updated, the rest waiting in a second wave that
    # soaks an hour), alternating.
    for i in 1 2 3; do
        port=$(free_port)
        sim_server "$work/rs-idle" "$port" "$b1"
        "${sim[@]}" --server "http://127.0.0.1:$port" --warmup 15s --duration 45s \
            --json "$work/idle-$i.json" >/dev/null 2>"$work/idle-$i.err"
        stop_server
        port=$(free_port)
        sim_server "$work/rs-busy" "$port" "$b1" UPDATE_SERVER_ROLLOUT_WAVES=1%,100% UPDATE_SERVER_ROLLOUT_WAVE_WAIT=3600
        "${sim[@]}" --server "http://127.0.0.1:$port" --warmup 25s --duration 55s \
            --json "$work/busy-$i.json" >/dev/null 2>"$work/busy-$i.err" &
        local sim_pid=$!
        sleep 8
        serve_bundle "$work/rs-busy" "$port" "$b2"
        wait "$sim_pid"
        stop_server
        note "round $i: connect p50 $(jq .endpoints.connect.p50_ms "$work/idle-$i.json") ms at rest, $(jq .endpoints.connect.p50_ms "$work/busy-$i.json") ms during a rollout ($(jq -r '.rollout.state' "$work/busy-$i.json"))"
    done
    # Wave time: from a wave opening to its completion, with a plan (the 90 % wave of
    # 10%,100%) and without (the one wave of 100%), alternating.
    for i in 1 2 3; do
        local plan
        for plan in "10%,100%" "100%"; do
            port=$(free_port)
            sim_server "$work/rs-wave" "$port" "$b1" "UPDATE_SERVER_ROLLOUT_WAVES=$plan"
            "${sim[@]}" --server "http://127.0.0.1:$port" --until-rollout-end --duration 300s \
                --json "$work/wave-$plan-$i.json" >/dev/null 2>"$work/wave-$plan-$i.err" &
            local sim_pid=$!
            sleep 8
            serve_bundle "$work/rs-wave" "$port" "$b2"
            wait "$sim_pid"
            stop_server
            note "round $i, plan $plan: last wave $(jq '.rollout.waves[-1] | .completed_at - .opened_at' "$work/wave-$plan-$i.json") s, rollout $(jq .rollout.seconds "$work/wave-$plan-$i.json") s"
        done
    done
    local idle50 idle99 busy50 busy99 planned unplanned whole_planned whole_unplanned errors
    idle50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/idle-$i.json"; done | spread_ms)
    idle99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/idle-$i.json"; done | spread_ms)
    busy50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/busy-$i.json"; done | spread_ms)
    busy99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/busy-$i.json"; done | spread_ms)
    local m_idle50 m_busy50 m_idle99 m_busy99
    m_idle50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/idle-$i.json"; done | median_of)
    m_busy50=$(for i in 1 2 3; do jq .endpoints.connect.p50_ms "$work/busy-$i.json"; done | median_of)
    m_idle99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/idle-$i.json"; done | median_of)
    m_busy99=$(for i in 1 2 3; do jq .endpoints.connect.p99_ms "$work/busy-$i.json"; done | median_of)
    planned=$(for i in 1 2 3; do jq '.rollout.waves[-1] | .completed_at - .opened_at' "$work/wave-10%,100%-$i.json"; done | spread)
    unplanned=$(for i in 1 2 3; do jq '.rollout.waves[-1] | .completed_at - .opened_at' "$work/wave-100%-$i.json"; done | spread)
    whole_planned=$(for i in 1 2 3; do jq '.rollout.seconds' "$work/wave-10%,100%-$i.json"; done | spread)
    whole_unplanned=$(for i in 1 2 3; do jq '.rollout.seconds' "$work/wave-100%-$i.json"; done | spread)
    errors=$(cat "$work"/idle-*.json "$work"/busy-*.json "$work"/wave-*.json | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')
    write_section rollout <<EOF2
## Rollouts: the directive's cost and the time a wave takes

\`$(bench_command rollout)\` on $(machine). A release update-server (SQLite) and
\`fleet-sim\` with $n simulated agents on loopback, heartbeating every 2 s (± 20 %),
fetching \`HEAD\` and the first 64 KiB of the bundle when told, installing in 2 s.
Three rounds of each case, alternating; median (min–max) over the rounds.

Latency of \`POST /agent/connect\` as the agents see it (fleet-sim's own clock, so it
includes its client's share of the two cores), at rest (the fleet on the served version,
its rollout completed) against a rollout under way (\`waves = ["1%", "100%"]\`, the first
wave updated and the second soaking for an hour: every call is answered from the agent's
wave):

| | at rest | rollout under way | added (medians) | target |
|---|---|---|---|---|
| connect p50 | $idle50 | $busy50 | $(awk -v a="$m_busy50" -v b="$m_idle50" 'BEGIN { printf "%+.0f %%", (a / b - 1) * 100 }') | < 10 % |
| connect p99 | $idle99 | $busy99 | $(awk -v a="$m_busy99" -v b="$m_idle99" 'BEGIN { printf "%+.0f %%", (a / b - 1) * 100 }') | |

From a wave opening to its completion (the server's own record), for the last wave of
\`["10%", "100%"]\` (90 % of the fleet) against the single wave of \`["100%"]\` (the same
fleet with no plan); and the whole rollout, from start to completion:

| | with a plan (last wave) | no plan (the one wave) |
|---|---|---|
| wave open → complete | $planned | $unplanned |
| whole rollout | $whole_planned | $whole_unplanned |

A wave's time is the agents' heartbeat (they learn of the open wave at their next
contact), the fetch and the install; the plan adds its earlier waves in front, not time
within a wave. Errors seen by the agents over all runs: **$errors**.
EOF2
}

# put_set PORT NAME: stores a two-file set for group default; prints the server's answer.
put_set() {
    curl -fsS -X PUT -H "Authorization: Bearer bench" -H "Content-Type: application/json" \
        --data "{\"files\": {\"web-config.yml\": \"basic_auth_users:\\n  prometheus: $2\\n\", \"site.prom\": \"fleet_site{site=\\\"lab\\\"} 1\\n\"}}" \
        "http://127.0.0.1:$1/admin/config/default"
}

# admin_json PORT PATH: an admin GET.
admin_json() { curl -fsS -H "Authorization: Bearer bench" "http://127.0.0.1:$1$2"; }

bench_config() {
    local sizes rounds=${CONFIG_ROUNDS:-3} cost_rounds=${CONFIG_COST_ROUNDS:-3}
    read -r -a sizes <<<"${CONFIG_SIZES:-1000 10000}"
    echo "config: a set to ${sizes[*]} agents, heartbeats vs long polls; connect latency with a config rollout vs none" >&2
    local most=0 n
    for n in "${sizes[@]}"; do ((n > most)) && most=$n; done
    ulimit -Hn $((most * 2 + 4096)) 2>/dev/null || true
    ulimit -n "$(ulimit -Hn)"
    keys
    use_variant ours
    make_dist "$work/cd" 0
    local b1
    b1=$(pack 1.0.0 "$work/cd" "$work/cb1")

    # Reach: the fleet at the default heartbeat (30 s), all registered; then a set for
    # default (waves ["100%"]): time from its creation to the last agent's APPLIED, as the
    # server recorded them (the config rollout's completed_at minus the set's created_at).
    local round mode port
    for round in $(seq "$rounds"); do
        for n in "${sizes[@]}"; do
            for mode in heartbeat longpoll; do
                port=$(free_port)
                sim_server "$work/cs" "$port" "$b1"
                local flag=()
                [[ $mode == longpoll ]] && flag=(--long-poll)
                "$bin/fleet-sim" --agents "$n" --agent-version 1.0.0+1 --heartbeat 30s --ramp 30s \
                    --download head --token bench --progress 30s "${flag[@]}" \
                    --server "http://127.0.0.1:$port" --duration 600s \
                    --json "$work/reach-$n-$mode-$round.json" >/dev/null 2>"$work/reach-$n-$mode-$round.err" &
                local sim_pid=$!
                local end=$((SECONDS + 300))
                until [[ $(admin_json "$port" /admin/agents 2>/dev/null | jq length) == "$n" ]]; do
                    ((SECONDS < end)) || { echo "bench.sh: $n agents never registered" >&2; return 1; }
                    sleep 2
                done
                # A heartbeat more: each agent has had its first answer and sits in its rhythm.
                sleep 30
                put_set "$port" "round-$round-$mode" >"$work/reach-$n-$mode-$round.put"
                end=$((SECONDS + 400))
                until admin_json "$port" /admin/config | jq -e '.sets[0].rollout.state == "completed"' >/dev/null 2>&1; do
                    ((SECONDS < end)) || { echo "bench.sh: the set never reached $n agents" >&2; break; }
                    sleep 0.2
                done
                admin_json "$port" /admin/config >"$work/reach-$n-$mode-$round.config"
                kill "$sim_pid" 2>/dev/null || true
                wait "$sim_pid" 2>/dev/null || true
                stop_server
                jq '.sets[0] | select(.rollout.completed_at != null) | .rollout.completed_at - .created_at' \
                    "$work/reach-$n-$mode-$round.config" >>"$work/reach-$n-$mode"
                note "round $round, $n agents, $mode: $(jq -r '.sets[0] | "\(.applied) APPLIED, \(.rollout.state) after \((.rollout.completed_at // 0) - .created_at) s"' "$work/reach-$n-$mode-$round.config")"
            done
        done
    done

    # Cost per connect: 1,000 agents heartbeating every 2 s against a server whose config
    # rollout is under way (waves ["1%", "100%"], the first wave APPLIED, the second
    # soaking for an hour: every connect is decided against the set and its waves) and
    # against the same server with no set at all, alternating. The bundle's plan is the
    # same in both (the fleet is on it already).
    local cn=${CONFIG_COST_AGENTS:-1000} i case
    local sim=("$bin/fleet-sim" --agents "$cn" --agent-version 1.0.0+1 --heartbeat 2s --ramp 5s
        --download head --token bench --progress 10s)
    for i in $(seq "$cost_rounds"); do
        for case in none rollout; do
            port=$(free_port)
            sim_server "$work/cc-$case" "$port" "$b1" "UPDATE_SERVER_ROLLOUT_WAVES=1%,100%" \
                UPDATE_SERVER_ROLLOUT_WAVE_WAIT=3600
            "${sim[@]}" --server "http://127.0.0.1:$port" --warmup 25s --duration 55s \
                --json "$work/cost-$case-$i.json" >/dev/null 2>"$work/cost-$case-$i.err" &
            local sim_pid=$!
            sleep 8
            [[ $case == rollout ]] && put_set "$port" "cost-$i" >/dev/null
            wait "$sim_pid"
            [[ $case == rollout ]] && admin_json "$port" /admin/config >"$work/cost-$i.config"
            stop_server
            note "round $i, $case: connect p50 $(jq .endpoints.connect.p50_ms "$work/cost-$case-$i.json") ms, p99 $(jq .endpoints.connect.p99_ms "$work/cost-$case-$i.json") ms$([[ $case == rollout ]] && jq -r '.sets[0] | " (set \(.rollout.state), \(.applied) APPLIED)"' "$work/cost-$i.config")"
        done
    done

    local rows="" m_hb m_lp
    for n in "${sizes[@]}"; do
        m_hb=$(median_of <"$work/reach-$n-heartbeat")
        m_lp=$(median_of <"$work/reach-$n-longpoll")
        rows+="| $n | $(spread <"$work/reach-$n-heartbeat") | $(spread <"$work/reach-$n-longpoll") | $(ratio "${m_hb:-0}" "${m_lp:-0}")× |"$'\n'
    done
    pick() { for i in $(seq "$cost_rounds"); do jq ".endpoints.connect.$2" "$work/cost-$1-$i.json"; done; }
    local n50 n99 r50 r99 m_n50 m_n99 m_r50 m_r99 errors
    n50=$(pick none p50_ms | spread_ms)
    n99=$(pick none p99_ms | spread_ms)
    r50=$(pick rollout p50_ms | spread_ms)
    r99=$(pick rollout p99_ms | spread_ms)
    m_n50=$(pick none p50_ms | median_of)
    m_n99=$(pick none p99_ms | median_of)
    m_r50=$(pick rollout p50_ms | median_of)
    m_r99=$(pick rollout p99_ms | median_of)
    # The reach runs' fleet-sim is stopped once the set is everywhere, before it writes
    # its summary: errors are counted over the connect runs.
    errors=$(cat "$work"/cost-*.json | jq -s 'map(.errors | to_entries | map(.value) | add // 0) | add')
    write_section config <<EOF2
## Remote configuration: a set to the fleet, and what a config rollout costs a connect

\`scripts/bench.sh config\` on $(machine). A release update-server (SQLite) and
\`fleet-sim\` on loopback; a simulated agent applies a set the moment it is sent one and
reports \`APPLIED\` (\`POST /agent/config-status\`), so what is measured is the server and
the protocol, not a workload's restart.

**A set to the fleet.** N agents at the default heartbeat (30 s ± 20 %), started over
30 s, all registered and a heartbeat more; then a two-file set is pushed for \`default\`
(waves \`["100%"]\`). Time from the set's \`created_at\` to its config rollout's
\`completed_at\` (every agent \`APPLIED\`), both from the server's clock. Heartbeats
(fleet-sim without \`--long-poll\`: an agent hears of the set at its next heartbeat)
against long polls (\`--long-poll\`: held connects answered when the set is stored).
$rounds round(s) of each, alternating; median (min–max).

| agents | heartbeats | long polls | ratio |
|---|---|---|---|
${rows%$'\n'}

**Cost per connect.** $cn agents heartbeating every 2 s (± 20 %), latency of
\`POST /agent/connect\` as they see it (fleet-sim's clock, so it includes its client's share
of the two cores), counted after a 25 s warm-up over 30 s: no configuration set at all,
against a config rollout under way (waves \`["1%", "100%"]\`, the first wave \`APPLIED\`
and the second soaking for an hour, so every connect is decided against the set and its
waves). The bundle's plan is the same in both. $cost_rounds round(s) of each, alternating;
median (min–max).

| | no set | config rollout under way | added (medians) |
|---|---|---|---|
| connect p50 | $n50 | $r50 | $(awk -v a="$m_r50" -v b="$m_n50" 'BEGIN { printf "%+.2f ms (%+.0f %%)", a - b, (a / b - 1) * 100 }') |
| connect p99 | $n99 | $r99 | $(awk -v a="$m_r99" -v b="$m_n99" 'BEGIN { printf "%+.2f ms (%+.0f %%)", a - b, (a / b - 1) * 100 }') |

Errors seen by the agents over the connect runs: **$errors**.
EOF2
}

for section in "${sections[@]}"; do
    "bench_$section"
done
echo "wrote BENCHMARKS.md" >&2
