
# What follows is the same for every server; the lines above are this server's.
#
# usage: sh install.sh [--prefix DIR] [--enroll-token TOKEN] [--group NAME] [--label KEY=VALUE]... [--proxy URL] [--no-systemd]
#
# Joins this machine to the fleet: finds its platform, downloads the bundle for it
# from the server, checks its sha256 against the value above, installs the agent as
# PREFIX/agent and starts it (under systemd where systemd runs, else through
# agent-wrapper.sh). A machine that has an agent at PREFIX/agent is left as it is.
# Every failed step says what and what to do, exits 1, and leaves nothing installed.
# It needs a POSIX shell and what busybox has: uname, mktemp, sha256sum, and curl or wget.
# Behind an HTTP proxy, --proxy http://[user:password@]host:port is used for its own
# downloads and written to the agent's server.proxy; without it, curl and wget read
# https_proxy and no_proxy from the environment as always. Each --label KEY=VALUE
# (repeatable) goes to the agent's agent.labels.
set -eu

# All of it is one function, read whole before it runs: a command below that reads
# its standard input cannot eat the rest of a script piped into sh.
main() {

PREFIX=/opt
ENROLL_TOKEN=
GROUP=
LABELS=
PROXY=
NO_SYSTEMD=
UNIT_NAME=agent.service
UNIT_FILE=/etc/systemd/system/$UNIT_NAME

say() { printf 'install.sh: %s\n' "$*"; }
fail() {
    printf 'install.sh: %s\n' "$*" >&2
    exit 1
}
usage() {
    echo "usage: sh install.sh [--prefix DIR] [--enroll-token TOKEN] [--group NAME] [--label KEY=VALUE]... [--proxy URL] [--no-systemd]"
    echo "  e.g. curl -fsSL $SERVER_URL/install.sh | sh -s -- --enroll-token TOKEN"
}
# A label is checked in full by the installer; here only that it is one plain word.
add_label() {
    case "$1" in
    *=*) ;;
    *) fail "--label $1: give KEY=VALUE, e.g. --label env=prod" ;;
    esac
    case "$1" in
    *[!A-Za-z0-9._/=-]*) fail "--label $1: a label is KEY=VALUE of letters, digits, '-', '_' and '.' (and one prefix/ in the key)" ;;
    esac
    LABELS="$LABELS $1"
}

while [ $# -gt 0 ]; do
    case "$1" in
    --prefix) [ $# -ge 2 ] || fail "--prefix needs a directory"; PREFIX=$2; shift 2 ;;
    --prefix=*) PREFIX=${1#--prefix=}; shift ;;
    --enroll-token) [ $# -ge 2 ] || fail "--enroll-token needs the token"; ENROLL_TOKEN=$2; shift 2 ;;
    --enroll-token=*) ENROLL_TOKEN=${1#--enroll-token=}; shift ;;
    --group) [ $# -ge 2 ] || fail "--group needs a name"; GROUP=$2; shift 2 ;;
    --group=*) GROUP=${1#--group=}; shift ;;
    --label) [ $# -ge 2 ] || fail "--label needs KEY=VALUE, e.g. --label env=prod"; add_label "$2"; shift 2 ;;
    --label=*) add_label "${1#--label=}"; shift ;;
    --proxy) [ $# -ge 2 ] || fail "--proxy needs a URL such as http://proxy.example:3128"; PROXY=$2; shift 2 ;;
    --proxy=*) PROXY=${1#--proxy=}; shift ;;
    --no-systemd) NO_SYSTEMD=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

# The prefix goes into a unit file and a sed expression: a plain absolute path only.
case "$PREFIX" in
/*) ;;
*) fail "--prefix $PREFIX: give an absolute path, e.g. --prefix /opt" ;;
esac
case "$PREFIX" in
*[!A-Za-z0-9/._-]*) fail "--prefix $PREFIX: use letters, digits, '/', '.', '_' and '-' only" ;;
esac
PREFIX=${PREFIX%/}
[ -n "$PREFIX" ] || PREFIX=/
HOME_DIR=${PREFIX%/}/agent

# Run twice, change nothing; but only a running agent counts as joined (automation
# reads the exit status). What `agent uninstall` leaves (conf/, data/, logs/) is no
# installed agent: the agent is installed again over it, keeping conf/.
LEFTOVERS=
if [ -e "$HOME_DIR/current" ] || [ -L "$HOME_DIR/current" ]; then
    if [ -d /run/systemd/system ] && systemctl is-active --quiet "$UNIT_NAME" 2>/dev/null; then
        running=1
    elif "$HOME_DIR/current/bin/agent-wrapper.sh" status >/dev/null 2>&1; then
        running=1
    else
        running=
    fi
    if [ -n "$running" ]; then
        say "an agent is already installed and running at $HOME_DIR; nothing was changed."
        say "See it with: $HOME_DIR/current/bin/agent status"
        exit 0
    fi
    fail "an agent is installed at $HOME_DIR but is not running; nothing was changed. Start it (systemctl start $UNIT_NAME, or $HOME_DIR/current/bin/agent-wrapper.sh start), or remove it first ($HOME_DIR/current/bin/agent uninstall --yes) and run this again"
elif [ -e "$HOME_DIR" ] || [ -L "$HOME_DIR" ]; then
    LEFTOVERS=1
    say "$HOME_DIR holds what an uninstalled agent left (conf/, data/, logs/): installing again over it, keeping conf/ (the machine joins with a new identity)"
fi

# The proxy goes into curl's and wget's environment (busybox's wget reads only that)
# and into the agent's conf/agent.toml; it is never printed with its password.
case "$PROXY" in
'' | none) ;;
http://*:*) ;;
*) fail "--proxy: give http://host:port or http://user:password@host:port (or none)" ;;
esac
case "$PROXY" in
*[[:space:]\"\\]*) fail "--proxy: a URL has no spaces, quotes or backslashes" ;;
esac
if [ "$PROXY" = none ]; then
    unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY
elif [ -n "$PROXY" ]; then
    http_proxy=$PROXY
    https_proxy=$PROXY
    export http_proxy https_proxy
    unset HTTP_PROXY HTTPS_PROXY
fi

# --- the tools ----------------------------------------------------------------------
if command -v curl >/dev/null 2>&1; then
    FETCH=curl
elif command -v wget >/dev/null 2>&1; then
    FETCH=wget
    # Busybox's wget verifies no certificates and knows no CA options; the sha256 above
    # is what vouches for the bundle there.
    if wget --help 2>&1 | grep -q BusyBox; then FETCH=busybox-wget; fi
else
    fail "neither curl nor wget is installed; install one of them (apt-get install curl) and run this again"
fi
if command -v sha256sum >/dev/null 2>&1; then
    sha256_of() { sha256sum "$1" | cut -d ' ' -f 1; }
elif command -v shasum >/dev/null 2>&1; then
    sha256_of() { shasum -a 256 "$1" | cut -d ' ' -f 1; }
else
    fail "no sha256sum on this machine (coreutils or busybox have it); install it and run this again"
fi

USE_SYSTEMD=
if [ -z "$NO_SYSTEMD" ] && [ -d /run/systemd/system ]; then
    command -v systemctl >/dev/null 2>&1 || fail "systemd runs but systemctl is missing; run this again with --no-systemd"
    USE_SYSTEMD=1
    [ "$(id -u)" = 0 ] || fail "installing a systemd unit needs root: run it with sudo (curl ... | sudo sh -s -- ...), or pass --no-systemd"
    if [ -e "$UNIT_FILE" ]; then
        fail "$UNIT_FILE exists (an agent installed elsewhere?); nothing was changed. Remove that agent first, or pass --no-systemd"
    fi
fi

# --- from here on, a failure undoes everything ----------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/agent-install.XXXXXX") || fail "cannot make a temporary directory in ${TMPDIR:-/tmp}; free some space or set TMPDIR"
INSTALLED=
UNIT_WRITTEN=
cleanup() {
    status=$?
    trap - EXIT INT TERM
    if [ "$status" -ne 0 ]; then
        if [ -n "$UNIT_WRITTEN" ]; then
            systemctl disable --now "$UNIT_NAME" >/dev/null 2>&1 || true
            rm -f "$UNIT_FILE"
            systemctl daemon-reload >/dev/null 2>&1 || true
        fi
        if [ -n "$INSTALLED" ]; then
            "$HOME_DIR/current/bin/agent-wrapper.sh" kill >/dev/null 2>&1 || true
            if [ -n "$LEFTOVERS" ]; then
                # What was there before this run (conf/, data/, logs/) is the operator's.
                rm -rf "$HOME_DIR/current" "$HOME_DIR/versions" "$HOME_DIR/run"
            else
                rm -rf "$HOME_DIR"
            fi
        fi
        if [ -n "$INSTALLED$UNIT_WRITTEN" ]; then
            printf 'install.sh: %s\n' "removed what this run had installed; nothing is left of it" >&2
        fi
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# fetch URL FILE [HEADER]: the body into FILE; fails on any HTTP error.
fetch() {
    case "$FETCH" in
    curl) curl -fsS -o "$2" ${3:+-H "$3"} ${CA_PEM:+--cacert "$WORK/ca.pem"} "$1" ;;
    wget) wget -q -O "$2" ${3:+--header="$3"} ${CA_PEM:+--ca-certificate="$WORK/ca.pem"} "$1" ;;
    busybox-wget) wget -q -O "$2" ${3:+--header "$3"} "$1" ;;
    esac
}

if [ -n "$CA_PEM" ]; then
    printf '%s\n' "$CA_PEM" >"$WORK/ca.pem"
fi

# --- the platform -------------------------------------------------------------------
[ "$(uname -s)" = Linux ] || fail "this machine runs $(uname -s); the agent runs on Linux only"
case "$(uname -m)" in
x86_64 | amd64) ARCH=x86_64; LOADER=/lib64/ld-linux-x86-64.so.2 ;;
aarch64 | arm64) ARCH=aarch64; LOADER=/lib/ld-linux-aarch64.so.1 ;;
*) fail "this machine's architecture $(uname -m) has no agent; the agent is built for x86_64 and aarch64" ;;
esac
# A glibc system has glibc's dynamic loader; anything else (musl, busybox, a distroless
# container) runs only static musl builds.
if [ -e "$LOADER" ]; then LIBC=gnu; else LIBC=musl; fi
TARGET=$ARCH-unknown-linux-$LIBC
STATIC=$ARCH-unknown-linux-musl

# A machine given labels or a group installs the release of the deployment they select
# (the one it would follow once joined), not necessarily default's.
if [ -n "$LABELS$GROUP" ]; then
    selection="platform=$TARGET&group=$GROUP&labels=$(printf '%s' "$LABELS" | tr ' ' ',')"
    fetch "$SERVER_URL/install/bundles?$selection" "$WORK/bundles" ||
        fail "cannot ask $SERVER_URL which release these labels select; check the network and run this again"
    if [ "$(head -n 1 "$WORK/bundles")" = refused ]; then
        fail "the server refused these labels: $(sed -n 2p "$WORK/bundles"); nothing was installed"
    fi
    read -r _ DEPLOYMENT RELEASE <"$WORK/bundles"
    say "these labels select deployment $DEPLOYMENT: installing its release $RELEASE"
    BUNDLES=$(sed 1d "$WORK/bundles")
fi

# The release's bundle for this machine: its own platform's, else the static musl one of
# its architecture (which runs on any Linux of that architecture).
pick() {
    printf '%s\n' "$BUNDLES" | while read -r platform sha path sig name; do
        if [ "$platform" = "$1" ]; then
            printf '%s %s %s %s\n' "$sha" "$path" "$sig" "$name"
        fi
    done
}
CHOSEN=$(pick "$TARGET")
[ -n "$CHOSEN" ] || CHOSEN=$(pick "$STATIC")
if [ -z "$CHOSEN" ]; then
    offered=$(printf '%s\n' "$BUNDLES" | while read -r platform _; do
        [ -z "$platform" ] || printf '%s ' "$platform"
    done)
    if [ -z "$offered" ]; then
        fail "the server $SERVER_URL serves no agent bundle right now; ask its operator to put one in its download directory, then run this again"
    fi
    fail "this machine is $TARGET, but the server's release has agents only for: ${offered% }; ask its operator for a $TARGET or $STATIC bundle"
fi
read -r BUNDLE_SHA BUNDLE_PATH SIGNATURE_PATH BUNDLE_NAME <<EOF
$CHOSEN
EOF

# The enrollment token is checked before anything is installed, so that a wrong one
# fails here with the server's words rather than later in the agent's log. The answer
# is 200 either way (busybox's wget shows no body of an error): "ok", or "refused" and
# the reason on the next line.
if [ -n "$ENROLL_TOKEN" ] || [ "$ENROLLMENT_REQUIRED" = yes ]; then
    [ -n "$ENROLL_TOKEN" ] || fail "the server $SERVER_URL enrolls new agents only with its enrollment token: run this again with --enroll-token TOKEN (ask the server's operator for it)"
    fetch "$SERVER_URL/install/check-enrollment" "$WORK/enrollment" "Enrollment-Token: $ENROLL_TOKEN" ||
        fail "cannot reach $SERVER_URL/install/check-enrollment to check the enrollment token; check the network and run this again"
    answer=$(head -n 1 "$WORK/enrollment")
    if [ "$answer" != ok ]; then
        fail "the server refused the enrollment token: $(sed -n 2p "$WORK/enrollment"); nothing was installed"
    fi
fi

BUNDLE=$WORK/$BUNDLE_NAME
say "downloading $BUNDLE_NAME for $TARGET from $SERVER_URL"
fetch "$SERVER_URL$BUNDLE_PATH" "$BUNDLE" ||
    fail "cannot download $SERVER_URL$BUNDLE_PATH; check that this machine reaches the server, then run this again"
got=$(sha256_of "$BUNDLE")
if [ "$got" != "$BUNDLE_SHA" ]; then
    fail "the downloaded bundle's sha256 is $got, not the $BUNDLE_SHA this script names: the server's release changed since this script was fetched, or the download was altered. Nothing was installed; fetch install.sh again and run it"
fi
if [ "$SIGNATURE_PATH" != - ]; then
    # The signature makes the new agent remember when its bundle was signed, so an older
    # one cannot be replayed to it later.
    fetch "$SERVER_URL$SIGNATURE_PATH" "$BUNDLE.minisig" ||
        fail "cannot download the bundle's signature $SERVER_URL$SIGNATURE_PATH; run this again"
fi
chmod +x "$BUNDLE"

set -- --install="$PREFIX" --server-url "$SERVER_URL"
[ -z "$ENROLL_TOKEN" ] || set -- "$@" --enroll-token "$ENROLL_TOKEN"
[ -z "$GROUP" ] || set -- "$@" --group "$GROUP"
# Plain words (add_label), so splitting $LABELS at spaces is safe.
for label in $LABELS; do
    set -- "$@" --label "$label"
done
[ -z "$PROXY" ] || set -- "$@" --proxy "$PROXY"
[ -z "$CA_PEM" ] || set -- "$@" --ca-file "$WORK/ca.pem"
# agent-bundle --install builds the tree beside it and renames it into place: it leaves
# nothing when it fails.
if ! "$BUNDLE" "$@" </dev/null >"$WORK/install.out" 2>&1; then
    sed 's/^/    /' "$WORK/install.out" >&2
    fail "the bundle's installer failed (above); nothing was installed"
fi
INSTALLED=1
# (Its "Start it with" line is what this script does next.)
sed '/^Start it with:/d; s/^/    /' "$WORK/install.out"

if [ -n "$USE_SYSTEMD" ]; then
    UNIT_WRITTEN=1
    sed "s|/opt/agent|$HOME_DIR|g" >"$UNIT_FILE" <<'UNIT'
@UNIT@
UNIT
    systemctl daemon-reload || fail "systemctl daemon-reload failed; see journalctl -xe"
    if ! systemctl enable --now "$UNIT_NAME" </dev/null; then
        tail -n 5 "$HOME_DIR/logs/agent.out" 2>/dev/null | sed 's/^/    /' >&2
        fail "the agent's service did not start (above, and: systemctl status $UNIT_NAME)"
    fi
    say "the agent runs as the systemd service $UNIT_NAME, started at every boot"
else
    if ! "$HOME_DIR/current/bin/agent-wrapper.sh" start </dev/null; then
        fail "the agent did not start (above); see $HOME_DIR/logs/"
    fi
    say "the agent runs under $HOME_DIR/current/bin/agent-wrapper.sh; nothing starts it at boot (add that to your init system)"
fi
say "installed in $HOME_DIR. See it with: $HOME_DIR/current/bin/agent status"
}

main "$@"
