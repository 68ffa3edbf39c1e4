#!/usr/bin/env bash
# scripts/bench.sh networks: an update over HTTPS through squid (CONNECT, basic auth) vs direct, alternating rounds; the bytes a server sends in a fleet-sim rollout with a download source (nginx) vs without
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh networks.
# NETWORKS_ROUNDS (3) rounds of each; NETWORKS_MIB (50) the bundle's size; NETWORKS_AGENTS
# (10000) simulated agents.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, root, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" networks "$@"

# networks_squid DIR PORT CONNECT_PORT: Debian's squid on PORT asking alice for her
# password, allowing CONNECT to CONNECT_PORT only; sets squid_pid.
networks_squid() {
    local dir=$1 port=$2 allowed=$3
    mkdir -p "$dir"
    printf 'alice:%s\n' "$(openssl passwd -apr1 bench-password)" >"$dir/passwd"
    cat >"$dir/squid.conf" <<EOF
http_port 127.0.0.1:$port
pid_filename $dir/squid.pid
access_log stdio:$dir/access.log
cache_log $dir/cache.log
cache_store_log none
cache deny all
coredump_dir $dir
pinger_enable off
netdb_filename none
shutdown_lifetime 0 seconds
auth_param basic program /usr/lib/squid/basic_ncsa_auth $dir/passwd
auth_param basic realm bench
acl authed proxy_auth REQUIRED
acl CONNECT method CONNECT
acl server_port port $allowed
http_access deny CONNECT !server_port
http_access allow authed
http_access deny all
EOF
    if [[ $(id -u) -eq 0 ]]; then
        # Squid will not run as root: it becomes proxy, who must reach its files.
        echo "cache_effective_user proxy" >>"$dir/squid.conf"
        chmod 711 "$work"
        chown -R proxy "$dir"
    fi
    squid -N -n "bench$port" -f "$dir/squid.conf" >"$dir/squid.out" 2>&1 &
    pids+=($!)
    squid_pid=$!
    local _
    for _ in $(seq 1 200); do
        grep -q "Accepting HTTP Socket connections" "$dir/cache.log" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "bench.sh networks: squid did not start:" >&2
    tail -n 20 "$dir/cache.log" "$dir/squid.out" >&2 || true
    return 1
}

# networks_round MODE PORT: one update of a fresh agent 1.0.0 to the served bundle over
# HTTPS, direct or through squid; appends "total-seconds download-seconds" to
# $work/net-MODE.
networks_round() {
    local mode=$1 port=$2 p proxy=none
    p=$work/net-$mode-$RANDOM
    [[ $mode == squid ]] && proxy="http://alice:bench-password@127.0.0.1:$squid_port"
    install_agent "$p" "https://127.0.0.1:$port" "export AGENT_UPDATE_STABILITY_WINDOW=1s"
    printf '[server]\nurls = ["https://127.0.0.1:%s"]\nca-file = "%s"\nproxy = "%s"\n[agent]\nheartbeat = "1s"\n[update]\ndeltas = false\n' \
        "$port" "$work/npki/ca.pem" "$proxy" >"$p/agent/conf/agent.toml"
    local t0 t1 took
    t0=$(date +%s.%N)
    "$p/agent/current/bin/agent-wrapper.sh" start >/dev/null
    wait_file 300 "$p/agent/logs/update.log" "committed"
    t1=$(date +%s.%N)
    took=$(grep -m1 -o 'downloaded [0-9]* bytes in [0-9.]*s' "$p/agent/logs/agent.log" | grep -o '[0-9.]*s$' | tr -d s)
    echo "$(awk -v a="$t1" -v b="$t0" 'BEGIN { print a - b }') ${took:-0}" >>"$work/net-$mode"
    stop_home "$p/agent"
}

# networks_fleet SOURCE JSON: a fleet-sim rollout of the served bundle to NETWORKS_AGENTS
# agents, the server naming the nginx download source (SOURCE=nginx) or none; appends
# "bundle-bytes-sent from-source fell-back" (the server's /metrics) to JSON.bytes.
networks_fleet() {
    local source=$1 json=$2 port env=()
    port=$(free_port)
    [[ $source == nginx ]] && env=("UPDATE_SERVER_DOWNLOADS_PUBLIC_URL=http://127.0.0.1:$nginx_port/agent")
    sim_server "$work/net-srv" "$port" "$(base_bundle)" UPDATE_SERVER_ROLLOUT_WAVES=1%,10%,100% \
        UPDATE_SERVER_ROLLOUT_WAVE_WAIT=0 UPDATE_SERVER_ROLLOUT_AGENT_DEADLINE=600 "${env[@]}"
    "$bin/fleet-sim" --server "http://127.0.0.1:$port" --agents "${NETWORKS_AGENTS:-10000}" \
        --agent-version 1.0.0+1 --heartbeat 30s --long-poll --ramp 20s --install-time 2s \
        --download full --download-source --until-rollout-end --duration 600s --token bench \
        --progress 30s --json "$json" >/dev/null 2>"$json.err" &
    local sim_pid=$!
    # Every agent has registered on 1.0.0 first.
    sleep 25
    serve_bundle "$work/net-srv" "$port" "$net_small"
    wait "$sim_pid"
    curl -fsS "http://127.0.0.1:$port/metrics" | awk '
        /^agentupdate_bytes_sent_total\{kind="bundle"\}/ { b = $2 }
        /^agentupdate_source_downloads_total\{from="source"\}/ { s = $2 }
        /^agentupdate_source_downloads_total\{from="server"\}/ { f = $2 }
        END { printf "%.0f %.0f %.0f\n", b, s, f }' >"$json.bytes"
    stop_server
}

bench_networks() {
    echo "networks: an update through squid vs direct; a rollout's server bytes with a download source vs without" >&2
    local need=()
    command -v squid >/dev/null || [[ -x /usr/sbin/squid ]] || need+=(squid)
    if ((${#need[@]})); then apt-get install -y -qq "${need[@]}" >/dev/null; fi
    PATH=$PATH:/usr/sbin
    keys
    make_pki "$work/npki"
    base_bundle >/dev/null
    local mib=${NETWORKS_MIB:-50}
    make_dist "$work/net-dist" "$mib"
    net_bundle=$(pack 2.0.0 "$work/net-dist" "$work/net-out")
    local size
    size=$(stat -c %s "$net_bundle")
    # The fleet's bundle: the binaries alone, so that every agent can take a whole one.
    make_dist "$work/net-small-dist" 0
    net_small=$(pack 2.0.0 "$work/net-small-dist" "$work/net-small")
    local small
    small=$(stat -c %s "$net_small")

    # Part 1: one HTTPS server, squid in front of it; rounds alternate.
    local home=$work/net-tls port
    mkdir -p "$home/downloads/agent"
    port=$(free_port)
    cp "$net_bundle" "$net_bundle.minisig" "$home/downloads/agent/"
    health_url="https://127.0.0.1:$port/healthz" CURL_CA_BUNDLE=$work/npki/ca.pem \
        start_server "$home" "$port" RUST_LOG=warn \
        "UPDATE_SERVER_TLS_CERT=$work/npki/server.pem" "UPDATE_SERVER_TLS_KEY=$work/npki/server.key"
    local tls_pid=$server_pid
    squid_port=$(free_port)
    networks_squid "$work/squid" "$squid_port" "$port"
    local rounds=${NETWORKS_ROUNDS:-3} r mode
    rm -f "$work/net-direct" "$work/net-squid"
    for ((r = 1; r <= rounds; r++)); do
        for mode in direct squid; do
            networks_round "$mode" "$port"
            note "round $r $mode: $(tail -1 "$work/net-$mode")"
        done
    done
    local tunnels
    tunnels=$(grep -c "TCP_TUNNEL/200 .* CONNECT 127.0.0.1:$port " "$work/squid/access.log" || true)
    kill "$squid_pid" "$tls_pid" 2>/dev/null || true
    wait "$squid_pid" "$tls_pid" 2>/dev/null || true

    # Part 2: nginx holding the release's file; fleet-sim rollouts with and without it.
    nginx_port=$(free_port)
    local ndir=$work/net-nginx
    mkdir -p "$ndir/www/agent" "$ndir/logs"
    cp "$net_small" "$ndir/www/agent/"
    cat >"$ndir/nginx.conf" <<EOF
worker_processes 2;
error_log $ndir/logs/error.log;
pid $ndir/nginx.pid;
$([[ $(id -u) -eq 0 ]] && echo "user root;")
events { worker_connections 16384; }
http {
    access_log off;
    sendfile on;
    keepalive_requests 100000;
    server { listen 127.0.0.1:$nginx_port; root $ndir/www; }
}
EOF
    nginx -p "$ndir" -c "$ndir/nginx.conf" -e "$ndir/logs/error.log" -g 'daemon off;' &
    pids+=($!)
    local nginx_pid=$!
    wait_http "http://127.0.0.1:$nginx_port/agent/$(basename "$net_small")"
    local agents=${NETWORKS_AGENTS:-10000}
    networks_fleet none "$work/net-none.json"
    networks_fleet nginx "$work/net-nginx.json"
    kill "$nginx_pid" 2>/dev/null || true

    local direct squid
    direct=$(awk '{ print $1 }' "$work/net-direct" | spread)
    squid=$(awk '{ print $1 }' "$work/net-squid" | spread)
    local d_dl s_dl
    d_dl=$(awk '{ print $2 }' "$work/net-direct" | spread)
    s_dl=$(awk '{ print $2 }' "$work/net-squid" | spread)
    local ratio_total
    ratio_total=$(ratio "$(awk '{ print $1 }' "$work/net-squid" | median_of)" "$(awk '{ print $1 }' "$work/net-direct" | median_of)")
    local none_b nginx_b nginx_s nginx_f
    read -r none_b _ _ <"$work/net-none.json.bytes"
    read -r nginx_b nginx_s nginx_f <"$work/net-nginx.json.bytes"
    # shellcheck disable=SC2016 # an awk program
    local mib_of='{ printf "%.1f MiB", $1 / 1048576 }'
    write_section networks <<EOF
### Networks: through squid, and bytes from a download source

\`$(bench_command networks)\` on $(machine). Bundle $(awk -v b="$size" 'BEGIN { printf "%.1f MiB", b / 1048576 }') over HTTPS with a pinned CA, $rounds rounds of each, alternating; squid 5.7 (Debian) with basic authentication, the agent through its CONNECT tunnel (\`server.proxy\`); deltas off. Median (min–max).

| | update (agent start to committed) | download (the agent's own count) |
|---|---|---|
| direct | $direct | $d_dl |
| through squid | $squid | $s_dl |

Through squid / direct (update): $ratio_total. Squid logged $tunnels CONNECT tunnels to the server.

A fleet-sim rollout (waves 1 %, 10 %, 100 %, long polls, \`--download full --download-source\`) of a $(awk -v b="$small" 'BEGIN { printf "%.1f MiB", b / 1048576 }') bundle to $agents agents; bytes of bundles the server sent (its \`/metrics\`):

| | server sent | agents reporting the source / a fallback |
|---|---|---|
| no download source | $(awk "BEGIN { print $none_b }" | awk "$mib_of") | – |
| nginx as \`downloads.public-url\` | $(awk "BEGIN { print $nginx_b }" | awk "$mib_of") | $nginx_s / $nginx_f |
EOF
}
