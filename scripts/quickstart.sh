#!/usr/bin/env bash
# Builds release binaries, makes a throw-away dev key, packs the current agent version,
# and runs update-server on 127.0.0.1:7080 with its embedded defaults (home ./server-home)
# in the foreground. Ctrl-C stops it.
# usage: scripts/quickstart.sh
# Environment: UPDATE_SERVER_SERVER_LISTEN (another address), QUICKSTART_HOME (server
# home), QUICKSTART_PREFIX (where the printed --install puts the agent), AGENT_BIN_DIR
# (binaries already built, skips the release build), AGENT_DEV_KEYS (dev key directory).
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/.."

listen=${UPDATE_SERVER_SERVER_LISTEN:-127.0.0.1:7080}
home=${QUICKSTART_HOME:-server-home}
prefix=${QUICKSTART_PREFIX:-/tmp/agent-demo}
url="http://$listen"
bin=${AGENT_BIN_DIR:-target/release}

# A second quickstart must not touch a running server: replacing its bundle would make
# its agents "update" to whatever this run packs. So check first, change nothing if busy.
host=${listen%:*}
port=${listen##*:}
if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
    echo "quickstart.sh: something already listens on $listen (an update-server from an earlier quickstart?)." >&2
    echo "  Nothing was changed. Stop it, or run with UPDATE_SERVER_SERVER_LISTEN=127.0.0.1:7081 QUICKSTART_HOME=server-home-2" >&2
    exit 1
fi
if [[ -f "$home/update-server.lock" ]] && command -v flock >/dev/null &&
    ! flock -n "$home/update-server.lock" true; then
    echo "quickstart.sh: an update-server is running with its home in $home ($(cat "$home/update-server.lock" 2>/dev/null))." >&2
    echo "  Nothing was changed. Stop it, or run with QUICKSTART_HOME=another-dir" >&2
    exit 1
fi

# Agents from this bundle talk to this server out of the box.
bundle=$(scripts/build-dist.sh --server-url "$url")
name=$(basename "$bundle")
downloads=$home/downloads/agent
mkdir -p "$downloads"
# The server serves exactly one bundle: replace whatever an earlier run left.
rm -f "$downloads"/agent-bundle-*
cp "$bundle" "$bundle.minisig" "$downloads/"

cat <<NEXT

update-server is starting on $url serving $name.
In another terminal, join a machine in one command (here: this one, under $prefix,
started without systemd; on a real machine: curl -fsSL $url/install.sh | sudo sh):

    curl -fsSL $url/install.sh | sh -s -- --prefix $prefix --no-systemd

Or by hand, as the script does:

    wget --content-disposition $url/agentupdate/download
    chmod +x $name && ./$name --install=$prefix --server-url $url
    $prefix/agent/current/bin/agent-wrapper.sh start

The new agent trusts the update key shipped inside the bundle: the public half of the
throw-away development key that signed it, ${AGENT_DEV_KEYS:-dev-keys}/update.pub.
See it with: $prefix/agent/current/bin/agent status

NEXT
exec "$bin/update-server" --home "$home" --listen "$listen"
