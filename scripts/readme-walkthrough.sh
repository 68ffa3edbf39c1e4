#!/usr/bin/env bash
# Runs the README's "Your first release" walkthrough as written: its shell blocks, in
# order, in one bash, in a throw-away directory that holds the repository's installer/,
# LICENSE and target/release (linked), so that the README's words stay true.
# usage: scripts/readme-walkthrough.sh
# Environment: AGENT_BIN_DIR (binaries already built, linked as target/release; default
# the repository's target/release), WALKTHROUGH_SERVER (HOST:PORT for the walkthrough's
# server instead of 127.0.0.1:7080), WALKTHROUGH_DIR (where to run it; default a new
# temporary directory, removed afterwards).
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
repo=$(cd "$(dirname "$0")/.." && pwd -P)
bin=${AGENT_BIN_DIR:-$repo/target/release}
bin=$(cd "$bin" && pwd -P)

# The section's ```sh blocks, in order.
commands=$(awk '
    /^## / { inside = ($0 == "## Your first release") }
    inside && /^```sh$/ { block = 1; next }
    block && /^```$/ { block = 0; next }
    block { print }
' "$repo/README.md")
if [[ -z "$commands" ]]; then
    echo "readme-walkthrough.sh: README.md has no \"## Your first release\" section with sh blocks" >&2
    exit 1
fi
if [[ -n "${WALKTHROUGH_SERVER:-}" ]]; then
    commands=$(printf '%s\n' "$commands" |
        sed "s|^export SERVER=127.0.0.1:7080 |export SERVER=$WALKTHROUGH_SERVER |")
fi

if [[ -n "${WALKTHROUGH_DIR:-}" ]]; then
    dir=$WALKTHROUGH_DIR
    mkdir -p "$dir"
else
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
fi
mkdir -p "$dir/target"
ln -sfn "$bin" "$dir/target/release"
ln -sfn "$repo/installer" "$dir/installer"
ln -sfn "$repo/LICENSE" "$dir/LICENSE"

cd "$dir"
# Whatever it started in the background (the server) ends with it, even on a failure.
bash -euo pipefail -x -c "trap 'kill \$(jobs -p) 2>/dev/null || true' EXIT
$commands"
echo "readme-walkthrough.sh: every command of \"Your first release\" ran"
