#!/bin/sh
# agent-wrapper.sh start|stop|restart|status|kill
#
# The one supported way to run the agent in production (the systemd unit calls it, and
# so does the updater after an update). It keeps run/agent.pid, finishes or rolls back
# an interrupted update before starting, restarts a crashed agent with backoff, and
# reads conf/agent-env.sh for environment settings.
set -u

usage() {
    echo "usage: $0 start|stop|restart|status|kill" >&2
    exit 2
}

SELF_DIR=$(cd "$(dirname "$0")" && pwd -P) || exit 1
SELF="$SELF_DIR/$(basename "$0")"
AGENT_HOME=${AGENT_HOME:-$(cd "$SELF_DIR/../../.." && pwd -P)}
export AGENT_HOME
RUN="$AGENT_HOME/run"
LOGS="$AGENT_HOME/logs"
DATA="$AGENT_HOME/data"
PID_FILE="$RUN/agent.pid"
SUPERVISOR_PID_FILE="$RUN/wrapper.pid"
STOP_TIMEOUT=${AGENT_STOP_TIMEOUT:-20}
# Seconds `start` waits for the agent's pid to appear (a loaded machine is slow to fork).
START_TIMEOUT=${AGENT_START_TIMEOUT:-15}
# Exit codes of `agent run` after which the agent must not be restarted:
# 0 (stopped, or handed over to the updater) and 3 (refused, updates disabled).
BACKOFF_MAX=${AGENT_RESTART_BACKOFF_MAX:-60}

if [ -f "$AGENT_HOME/conf/agent-env.sh" ]; then
    # shellcheck disable=SC1091
    . "$AGENT_HOME/conf/agent-env.sh"
fi

log() {
    printf '%s agent-wrapper: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >>"$LOGS/wrapper.log"
}

read_pid() {
    [ -f "$1" ] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    case "$pid" in '' | *[!0-9]*) return 1 ;; esac
    echo "$pid"
}

# True if $1 is alive and is this installation's agent (not a recycled pid).
is_agent() {
    [ -d "/proc/$1" ] || return 1
    cmdline=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
    case "$cmdline" in *"/bin/agent run"*) return 0 ;; esac
    return 1
}

is_supervisor() {
    [ -d "/proc/$1" ] || return 1
    cmdline=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
    case "$cmdline" in *"agent-wrapper.sh __supervise"*) return 0 ;; esac
    return 1
}

# Finish or roll back an update that was interrupted (the updater died, or the new
# version keeps crashing before it committed). Skipped while an updater runs: it holds
# run/update.lock and is the one starting us.
recover() {
    [ -n "${AGENT_UPDATER_ACTIVE:-}" ] && return 0
    [ -f "$DATA/update-journal.json" ] || return 0
    if [ -x "$DATA/update/updater" ]; then
        log "an update was interrupted; running recovery"
        "$DATA/update/updater" --update="$AGENT_HOME" --recover >>"$LOGS/wrapper.log" 2>&1 ||
            log "recovery did not finish (exit $?); see logs/update.log"
    fi
}

supervise() {
    echo $$ >"$SUPERVISOR_PID_FILE"
    stopping=0
    child=
    trap 'stopping=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
    backoff=1
    while [ "$stopping" -eq 0 ]; do
        started=$(date +%s)
        "$AGENT_HOME/current/bin/agent" run >>"$LOGS/agent.out" 2>&1 &
        child=$!
        echo "$child" >"$PID_FILE"
        wait "$child"
        rc=$?
        # `wait` returns early when a trapped signal arrives; wait for the agent itself.
        while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done
        child=
        [ "$stopping" -eq 1 ] && break
        case "$rc" in
        0) log "agent exited normally"; break ;;
        3) log "agent refused by the server and updates are disabled; not restarting"; break ;;
        esac
        ran=$(($(date +%s) - started))
        [ "$ran" -gt 60 ] && backoff=1
        log "agent exited with code $rc after ${ran}s; restarting in ${backoff}s"
        sleep "$backoff"
        [ "$stopping" -eq 1 ] && break
        backoff=$((backoff * 2))
        [ "$backoff" -gt "$BACKOFF_MAX" ] && backoff=$BACKOFF_MAX
        recover
        # Recovery may have started (or rolled back to) an agent with its own supervisor.
        if pid=$(read_pid "$PID_FILE") && is_agent "$pid"; then
            log "an agent (pid $pid) was started by recovery; this supervisor ends"
            break
        fi
    done
    [ "$(cat "$SUPERVISOR_PID_FILE" 2>/dev/null)" = "$$" ] && rm -f "$SUPERVISOR_PID_FILE"
}

start() {
    mkdir -p "$RUN" "$LOGS"
    recover
    if pid=$(read_pid "$PID_FILE") && is_agent "$pid"; then
        echo "agent is already running (pid $pid)"
        return 0
    fi
    rm -f "$PID_FILE"
    if command -v setsid >/dev/null 2>&1; then
        setsid "$SELF" __supervise </dev/null >/dev/null 2>&1 &
    else
        nohup "$SELF" __supervise </dev/null >/dev/null 2>&1 &
    fi
    # Report the agent's pid once the supervisor has started it.
    i=0
    while [ $i -lt $((START_TIMEOUT * 20)) ]; do
        if pid=$(read_pid "$PID_FILE") && [ -d "/proc/$pid" ]; then
            echo "agent started (pid $pid)"
            log "started agent (pid $pid)"
            return 0
        fi
        sleep 0.05
        i=$((i + 1))
    done
    echo "agent did not start; see $LOGS/agent.out" >&2
    return 1
}

stop() {
    if sup=$(read_pid "$SUPERVISOR_PID_FILE") && is_supervisor "$sup"; then
        kill -TERM "$sup" 2>/dev/null
    fi
    if ! pid=$(read_pid "$PID_FILE") || ! is_agent "$pid"; then
        rm -f "$PID_FILE"
        echo "agent is not running"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null
    i=0
    while [ -d "/proc/$pid" ] && [ $i -lt $((STOP_TIMEOUT * 10)) ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if [ -d "/proc/$pid" ]; then
        log "agent (pid $pid) did not stop within ${STOP_TIMEOUT}s; killing it"
        kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$PID_FILE"
    log "stopped agent (pid $pid)"
    echo "agent stopped"
}

kill_all() {
    if sup=$(read_pid "$SUPERVISOR_PID_FILE") && is_supervisor "$sup"; then
        kill -KILL "$sup" 2>/dev/null
    fi
    if pid=$(read_pid "$PID_FILE") && is_agent "$pid"; then
        kill -KILL "$pid" 2>/dev/null
        echo "agent killed (pid $pid)"
    fi
    rm -f "$PID_FILE" "$SUPERVISOR_PID_FILE"
}

status() {
    if pid=$(read_pid "$PID_FILE") && is_agent "$pid"; then
        echo "agent is running (pid $pid)"
        return 0
    fi
    echo "agent is not running"
    return 1
}

[ $# -eq 1 ] || usage
case "$1" in
start) start ;;
stop) stop ;;
restart) stop && start ;;
status) status ;;
kill) kill_all ;;
__supervise) supervise ;;
-h | --help) usage ;;
*) usage ;;
esac
