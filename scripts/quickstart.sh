#!/usr/bin/env bash
# Builds release binaries, makes a throw-away dev key, packs the current agent version,
# and runs update-server on 127.0.0.1:7080 with its embedded defaults (home ./server-home)
# in the foreground. Ctrl-C stops it.
# usage: scripts/quickstart.sh
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/.."

bundle=$(scripts/build-dist.sh)
name=$(basename "$bundle")
downloads=server-home/downloads/agent
mkdir -p "$downloads"
# The server serves exactly one bundle: replace whatever an earlier run left.
rm -f "$downloads"/agent-bundle-*
cp "$bundle" "$bundle.minisig" "$downloads/"

cat <<NEXT

update-server is starting on http://127.0.0.1:7080 serving $name.
In another terminal, provision an agent as a new machine would:

    wget --content-disposition http://127.0.0.1:7080/agentupdate/download
    chmod +x $name && ./$name --install=/tmp/agent-demo
    /tmp/agent-demo/agent/current/bin/agent-wrapper.sh start

NEXT
exec target/release/update-server
