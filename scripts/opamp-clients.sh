#!/usr/bin/env bash
# Installs the two registry OpAMP clients the end-to-end tests run, into DIR:
#   DIR/venv       python3 -m venv, with opentelemetry-opamp-client 0.5b0
#   DIR/npm        npm install @elastic/opamp-client-node 0.5.0
# Reused when already there (a marker file is written once each install succeeded).
# usage: scripts/opamp-clients.sh DIR
set -euo pipefail
dir=${1:?usage: $0 DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

if [[ ! -f "$dir/venv/.installed-0.5b0" ]]; then
    rm -rf "$dir/venv"
    python3 -m venv "$dir/venv" || {
        echo "opamp-clients.sh: python3 -m venv failed; install python3-venv (apt-get install python3-venv) and run again" >&2
        exit 1
    }
    "$dir/venv/bin/pip" install -q --disable-pip-version-check opentelemetry-opamp-client==0.5b0
    touch "$dir/venv/.installed-0.5b0"
fi

if [[ ! -f "$dir/npm/.installed-0.5.0" ]]; then
    rm -rf "$dir/npm"
    mkdir -p "$dir/npm"
    (cd "$dir/npm" && npm init -y >/dev/null && npm install --no-audit --no-fund --silent @elastic/opamp-client-node@0.5.0)
    touch "$dir/npm/.installed-0.5.0"
fi
