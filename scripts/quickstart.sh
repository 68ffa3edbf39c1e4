#!/usr/bin/env bash
# Builds release binaries, makes a throw-away dev key, packs the current agent version,
# and runs update-server with its embedded defaults (home ./server-home) in the
# foreground, its page and admin API on. Ctrl-C stops it.
# usage: scripts/quickstart.sh [--listen ADDR] [--public-url URL]
#   --listen ADDR      where the server listens (default 127.0.0.1:7080: this machine only;
#                      0.0.0.0:7080 for other machines too)
#   --public-url URL   how other machines reach it (default: http://<listen address>, or
#                      this machine's address when it listens on all of them); agents,
#                      install.sh and the printed commands use it
# Environment: UPDATE_SERVER_SERVER_LISTEN and UPDATE_SERVER_SERVER_PUBLIC_URL (the same),
# UPDATE_SERVER_ADMIN_TOKEN (use this admin token instead of making one), QUICKSTART_HOME
# (server home), QUICKSTART_PREFIX (where the printed --install puts the agent),
# AGENT_BIN_DIR (binaries already built, skips the release build), AGENT_DEV_KEYS (dev
# key directory).
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
listen=${UPDATE_SERVER_SERVER_LISTEN:-127.0.0.1:7080}
public_url=${UPDATE_SERVER_SERVER_PUBLIC_URL:-}
while (($#)); do
    case "$1" in
    --listen) listen=${2:?--listen needs an address such as 0.0.0.0:7080}; shift 2 ;;
    --public-url) public_url=${2:?--public-url needs a URL such as http://updates.example:7080}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "quickstart.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."

home=${QUICKSTART_HOME:-server-home}
prefix=${QUICKSTART_PREFIX:-/tmp/agent-demo}
bin=${AGENT_BIN_DIR:-target/release}
host=${listen%:*}
port=${listen##*:}
host=${host#[}
host=${host%]}

case "$host" in
127.* | localhost | ::1) reach=loopback ;;
0.0.0.0 | :: | "") reach=all ;;
*) reach=address ;;
esac
if [[ -z "$public_url" ]]; then
    if [[ $reach == all ]]; then
        # Agents need an address they can dial, not the wildcard.
        me=$(hostname -I 2>/dev/null | awk '{print $1}')
        public_url="http://${me:-$(hostname)}:$port"
    else
        public_url="http://$listen"
    fi
fi
case "$public_url" in
http://* | https://*) ;;
*) echo "quickstart.sh: --public-url $public_url: write http://HOST:PORT or https://HOST:PORT" >&2; exit 2 ;;
esac
url=${public_url%/}

# A second quickstart must not touch a running server: replacing its bundle would make
# its agents "update" to whatever this run packs. So check first, change nothing if busy.
probe=$host
[[ $reach == all ]] && probe=127.0.0.1
if (exec 3<>"/dev/tcp/$probe/$port") 2>/dev/null; then
    echo "quickstart.sh: something already listens on $listen (an update-server from an earlier quickstart?)." >&2
    echo "  Nothing was changed. Stop it, or run with --listen $host:$((port + 1)) and QUICKSTART_HOME=$home-2" >&2
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
# The server serves exactly one release: replace whatever an earlier run left (an MSI
# of another build beside this bundle would be refused with it).
rm -f "$downloads"/agent-bundle-* "$downloads"/agent-*.msi "$downloads"/agent-*.msi.minisig
cp "$bundle" "$bundle.minisig" "$downloads/"

# The admin token: the page's sign-in and the CLI's --token. Made once, kept in the home
# for its owner alone, shown only when made.
token_file=$home/admin-token
made_token=""
if [[ -n "${UPDATE_SERVER_ADMIN_TOKEN:-}" ]]; then
    token=$UPDATE_SERVER_ADMIN_TOKEN
    token_note="the admin token is UPDATE_SERVER_ADMIN_TOKEN's"
    # shellcheck disable=SC2016 # printed for the reader's shell to expand
    token_arg='--token "$UPDATE_SERVER_ADMIN_TOKEN"'
else
    if [[ ! -s "$token_file" ]]; then
        (
            umask 077
            od -An -tx1 -N24 /dev/urandom | tr -d ' \n' >"$token_file.tmp"
            mv "$token_file.tmp" "$token_file"
        )
        made_token=yes
    fi
    chmod 600 "$token_file"
    token=$(cat "$token_file")
    token_note="the admin token is in $token_file (readable by you alone)"
    token_arg="--token \"\$(cat $token_file)\""
fi

echo
echo "update-server is starting on $listen serving $name; agents reach it at $url."
case "$reach" in
loopback)
    cat <<LOOPBACK
It serves loopback only: no other machine can reach it. For real machines, run
  scripts/quickstart.sh --listen 0.0.0.0:$port --public-url http://THIS-HOST:$port
LOOPBACK
    ;;
all)
    echo "It listens on every address; other machines reach it as $url (--public-url to change that)."
    ;;
esac
echo
echo "The page and the admin API are on: $token_note."
if [[ -n "$made_token" ]]; then
    echo "It was made now and is shown this once:"
    echo
    echo "  token: $token"
    echo
fi
cat <<NEXT
Sign in to the page at $url/ with it. On the command line, pass it with --token:

  $bin/update-server rollout status --server $url $token_arg

In another terminal, join a machine in one command (here: this one, under $prefix,
started without systemd; on a real machine: curl -fsSL $url/install.sh | sudo sh):

    curl -fsSL $url/install.sh | sh -s -- --prefix $prefix --no-systemd

Or by hand, as the script does:

    wget --content-disposition $url/agentupdate/download
    chmod +x $name && ./$name --install=$prefix --server-url $url
    $prefix/agent/current/bin/agent-wrapper.sh start

A Windows machine joins with the release's MSI, as an administrator (this quickstart
packs for this machine only: $url/agentupdate/agent.msi answers 404 until a release
with an MSI is published, e.g. the directory scripts/build-dist.sh --target
x86_64-pc-windows-gnu wrote, with $bin/update-server release publish DIR):

    msiexec /i $url/agentupdate/agent.msi /qn SERVER_URL=$url ENROLL_TOKEN=…

The new agent trusts the update key shipped inside the bundle: the public half of the
throw-away development key that signed it, ${AGENT_DEV_KEYS:-dev-keys}/update.pub.
See it with: $prefix/agent/current/bin/agent status

NEXT
export UPDATE_SERVER_ADMIN_TOKEN=$token
export UPDATE_SERVER_SERVER_PUBLIC_URL=$url
exec "$bin/update-server" --home "$home" --listen "$listen"
