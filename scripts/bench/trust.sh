#!/usr/bin/env bash
# scripts/bench.sh trust: HTTPS download and /version rate vs nginx with ssl on the same certificate;
#   the cost of token checks on connect at 1,000 agents vs the server before them
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh trust.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" trust "$@"

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
