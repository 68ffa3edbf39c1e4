#!/usr/bin/env bash
# Builds release binaries, makes a throw-away dev key, packs the current agent version,
# and runs update-server on 127.0.0.1:7080 with its embedded defaults (home ./server-home)
# in the foreground. Ctrl-C stops it.
# usage: scripts/quickstart.sh
# Environment: UPDATE_SERVER_SERVER_LISTEN (another address), QUICKSTART_HOME (server
# home), QUICKSTART_PREFIX (where the printed --install puts the agent), AGENT_BIN_DIR
# (binaries already built, skips the release build).
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
In another terminal, provision an agent as a new machine would:

    wget --content-disposition $url/agentupdate/download
    chmod +x $name && ./$name --install=$prefix
    $prefix/agent/current/bin/agent-wrapper.sh start

NEXT
exec "$bin/update-server" --home "$home" --listen "$listen"
