#!/usr/bin/env bash
# The whole story in under a minute: a server, an agent installed and stamped older,
# refused, updated and healthy; then a broken bundle and its rollback. Prints a timeline
# and cleans up everything it started.
# usage: scripts/demo.sh        (AGENT_BIN_DIR=DIR uses binaries already built there;
#                               AGENT_DEV_KEYS=DIR keeps the throw-away key there, default dev-keys)
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/.."
root=$(pwd)
keys=${AGENT_DEV_KEYS:-dev-keys}

work=$(mktemp -d "${TMPDIR:-/tmp}/agent-demo.XXXXXX")
server_pid=""
# Runs on every exit: ends what the demo started and removes its work directory. Each
# step may find its target already gone, which is no failure.
cleanup() {
    local status=$?
    set +e
    if [[ -x $work/machine/agent/current/bin/agent-wrapper.sh ]]; then
        "$work/machine/agent/current/bin/agent-wrapper.sh" kill >/dev/null 2>&1
    fi
    pkill -KILL -f "$work" 2>/dev/null
    if [[ -n $server_pid ]]; then
        kill "$server_pid" 2>/dev/null
    fi
    wait 2>/dev/null
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

start=$(date +%s.%N)
last=$start
step() {
    local now
    now=$(date +%s.%N)
    awk -v t="$now" -v s="$start" -v l="$last" -v m="$*" \
        'BEGIN { printf "%7.2fs  (+%5.2fs)  %s\n", t - s, t - l, m }'
    last=$now
}
wait_for() { # wait_for SECONDS FILE TEXT
    local end=$((SECONDS + $1))
    until grep -q "$3" "$2" 2>/dev/null; do
        if ((SECONDS > end)); then
            echo "demo: timed out waiting for '$3' in $2" >&2
            tail -n 20 "$2" >&2 2>/dev/null || true
            exit 1
        fi
        sleep 0.1
    done
}

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 7089)
url="http://127.0.0.1:$port"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
build=$(git rev-list --count HEAD 2>/dev/null || echo 1)

bundle=$(AGENT_DIST_ROOT="$work/dist" scripts/build-dist.sh --server-url "$url" --out "$work/bundle" 2>/dev/null)
bin=${AGENT_BIN_DIR:-$root/target/release}
step "built and signed $(basename "$bundle") ($version+$build)"

mkdir -p "$work/server/downloads/agent"
cp "$bundle" "$bundle.minisig" "$work/server/downloads/agent/"
UPDATE_SERVER_DOWNLOADS_RETRY_AFTER=1 "$bin/update-server" --home "$work/server" --listen "127.0.0.1:$port" \
    >"$work/server.log" 2>&1 &
server_pid=$!
wait_for 20 "$work/server.log" "listening on"
step "update-server up on $url"

"$bundle" --install="$work/machine" >/dev/null
home=$work/machine/agent
cat >"$home/conf/agent-env.sh" <<ENV
export AGENT_AGENT_HEARTBEAT=1s
export AGENT_UPDATE_STABILITY_WINDOW=2s
export AGENT_UPDATE_HEALTH_TIMEOUT=8s
ENV
step "agent installed at $home"

"$bin/stamp" agent --home "$home" --version 0.0.9 --build 1 >/dev/null
step "agent stamped as 0.0.9+1 (the server speaks to $version+$build only)"

"$home/current/bin/agent-wrapper.sh" start >/dev/null
step "agent started through its wrapper"
wait_for 30 "$home/logs/agent.log" "expects $version+$build; updating"
step "refused by the server (409): it expects $version+$build"
wait_for 30 "$home/logs/agent.log" "updater started"
step "bundle downloaded and verified; updater started"
wait_for 60 "$home/logs/update.log" "committed"
step "updated: $("$home/current/bin/agent" --version) healthy, committed"

# A broken release: its agent exits at once.
broken=$work/broken
cp -a "$home/current/." "$broken"
rm -f "$broken/bundle.minisig" "$broken/.complete"
printf '#!/bin/sh\nexit 1\n' >"$broken/bin/agent"
"$bin/agent-bundle" pack --dist "$broken" --version 9.9.9 --build 1 --key "$keys/update.key" \
    --out "$work/broken-out" >/dev/null
rm -f "$work/server/downloads/agent/"agent-bundle-*
cp "$work/broken-out/agent-bundle-9.9.9" "$work/broken-out/agent-bundle-9.9.9.minisig" "$work/server/downloads/agent/"
step "server now offers a broken 9.9.9+1"
wait_for 60 "$home/logs/update.log" "current -> versions/9.9.9+1"
step "agent updating to 9.9.9+1"
wait_for 60 "$home/logs/update.log" "rolled back to"
step "9.9.9+1 never came up: rolled back, $("$home/current/bin/agent" --version) runs again"

echo
echo "logs/update.log of the agent:"
sed 's/^/  /' "$home/logs/update.log"
