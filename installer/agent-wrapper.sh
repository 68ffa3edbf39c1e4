#!/bin/sh
# agent-wrapper.sh start|stop|restart|status|kill
#
# The one supported way to run the agent in production (the systemd unit calls it, and
# so does the updater after an update). It finds the agent's home from where it lies,
# reads conf/agent-env.sh, and hands the command to bin/agent-service beside it, which
# does the work: it keeps run/agent.pid, finishes or rolls back an interrupted update
# before starting, restarts a crashed agent with backoff (but not one that refuses its
# configuration), checks the configuration before a restart, and stops with TERM, then
# KILL. This script is a shell script only so that conf/agent-env.sh, a shell file, is
# read the way an operator expects.
set -u

usage() {
    echo "usage: $0 start|stop|restart|status|kill" >&2
    exit 2
}

[ $# -eq 1 ] || usage
case "$1" in
start | stop | restart | status | kill) ;;
*) usage ;;
esac

SELF_DIR=$(cd "$(dirname "$0")" && pwd -P) || exit 1
AGENT_HOME=${AGENT_HOME:-$(cd "$SELF_DIR/../../.." && pwd -P)}
export AGENT_HOME

if [ -f "$AGENT_HOME/conf/agent-env.sh" ]; then
    # Every setting it makes is exported, `export` written or not: the supervisor reads
    # its knobs (AGENT_STOP_TIMEOUT, …) from its environment, and the agent and the
    # updater inherit them.
    set -a
    # shellcheck disable=SC1091
    . "$AGENT_HOME/conf/agent-env.sh"
    set +a
fi

if [ ! -x "$SELF_DIR/agent-service" ]; then
    echo "$0: $SELF_DIR/agent-service is missing; this version is incomplete, install the agent again" >&2
    exit 1
fi
exec "$SELF_DIR/agent-service" "$1" --home "$AGENT_HOME"
