#!/usr/bin/env bash
# scripts/bench.sh server: download throughput and /version rate vs nginx (with /healthz
# beside it); 2000 attempts at limit 45. SERVER_ROUNDS (5) rounds; SERVER_ONLY=version
# measures /version and /healthz alone and prints them, BENCHMARKS.md untouched.
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh server.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" server "$@"

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

bench_server() {
    echo "server: download throughput, /version rate, 2000 attempts at limit 45" >&2
    keys
    local dist=$work/sdist only=${SERVER_ONLY:-}
    # The version alone needs no large bundle.
    make_dist "$dist" "$([[ $only == version ]] && echo 1 || echo 100)"
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
    # falls on both alike. /version is measured against nginx and against the server's
    # own /healthz (a trivial route) in the same round: the ratio of each round is what
    # is compared, since the load of other work on the machine changes between rounds.
    local i bytes secs req rounds=${SERVER_ROUNDS:-5}
    for ((i = 1; i <= rounds; i++)); do
        if [[ $only != version ]]; then
            read -r _ bytes secs _ _ < <(wrk_run 16 8 "http://127.0.0.1:$sport/agentupdate/download")
            awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.0f\n", b / s / 1048576 }' >>"$work/dl-ours"
            read -r _ bytes secs _ _ < <(wrk_run 16 8 "http://127.0.0.1:$nport/agentupdate/download")
            awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.0f\n", b / s / 1048576 }' >>"$work/dl-nginx"
        fi
        read -r req _ secs _ _ < <(wrk_run 64 5 "http://127.0.0.1:$sport/agentupdate/version")
        awk -v r="$req" -v s="$secs" 'BEGIN { printf "%.0f\n", r / s }' >>"$work/v-ours"
        read -r req _ secs _ _ < <(wrk_run 64 5 "http://127.0.0.1:$nport/agentupdate/version")
        awk -v r="$req" -v s="$secs" 'BEGIN { printf "%.0f\n", r / s }' >>"$work/v-nginx"
        read -r req _ secs _ _ < <(wrk_run 64 5 "http://127.0.0.1:$sport/healthz")
        awk -v r="$req" -v s="$secs" 'BEGIN { printf "%.0f\n", r / s }' >>"$work/h-ours"
        ratio "$(tail -1 "$work/v-ours")" "$(tail -1 "$work/v-nginx")" >>"$work/v-ratio"
        echo >>"$work/v-ratio"
        ratio "$(tail -1 "$work/v-ours")" "$(tail -1 "$work/h-ours")" >>"$work/vh-ratio"
        echo >>"$work/vh-ratio"
        if [[ $only != version ]]; then
            note "round $i: download $(tail -1 "$work/dl-ours") vs $(tail -1 "$work/dl-nginx") MiB/s"
        fi
        note "round $i: /version $(tail -1 "$work/v-ours") vs nginx $(tail -1 "$work/v-nginx") req/s ($(tail -1 "$work/v-ratio")x); /healthz $(tail -1 "$work/h-ours") req/s"
    done
    range() { spread_as %s <"$1"; }
    if [[ $only == version ]]; then
        echo "/agentupdate/version: ours $(range "$work/v-ours"), nginx $(range "$work/v-nginx") req/s; per-round ratio $(spread_as %s <"$work/v-ratio"); /healthz $(range "$work/h-ours") req/s, /version / /healthz $(spread_as %s <"$work/vh-ratio")"
        echo "server: SERVER_ONLY=version, BENCHMARKS.md left as it was" >&2
        return 0
    fi
    local dl_ours dl_nginx
    dl_ours=$(median_of <"$work/dl-ours")
    dl_nginx=$(median_of <"$work/dl-nginx")

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
Both servers and wrk share the machine's cores. $rounds rounds, alternating between the two
servers; median (min–max). The download's ratio is that of the medians; the
\`/agentupdate/version\` ratio is each round's (the two ran back to back), median (min–max).

| measure | update-server | nginx | ratio | target |
|---|---|---|---|---|
| download, 16 parallel clients, 8 s (MiB/s) | $(range "$work/dl-ours") | $(range "$work/dl-nginx") | $(ratio "$dl_ours" "$dl_nginx") | ≥ 0.9 |
| \`/agentupdate/version\`, 64 connections, 5 s (req/s) | $(range "$work/v-ours") | $(range "$work/v-nginx") | $(spread_as %s <"$work/v-ratio") | ≥ 1.2 |
| \`/healthz\` (a trivial route, beside it in each round), 64 connections, 5 s (req/s) | $(range "$work/h-ours") | – | /version ÷ /healthz: $(spread_as %s <"$work/vh-ratio") | |

2,000 concurrent download attempts for 8 s at \`downloads.limit = 45\` (fresh server):
$storm_req answers, of them $storm_503 \`503\`; socket errors (connect, read, write, timeout): **$storm_err**
(target 0); server's peak downloads in flight: **$peak** (target ≤ 45)${served:+; downloads answered 200: $served};
server peak anonymous RSS (heap and stacks, sampled every 50 ms): **$anon MiB** (target < 64 MiB).
Peak total RSS (VmHWM) was $rss MiB: it also counts the pages of the memory-mapped bundle
that were touched, which are the kernel's page cache of that file, shared and reclaimable,
not memory the server allocated.
EOF2
}
