#!/bin/sh
# agent-wrapper.sh start|stop|restart|status|kill
#
# The one supported way to run the agent in production (the systemd unit calls it, and
# so does the updater after an update). It keeps run/agent.pid, finishes or rolls back
# an interrupted update before starting, restarts a crashed agent with backoff (but not
# one that refuses its configuration), and reads conf/agent-env.sh for environment
# settings. Every wait is measured on the clock, not counted in loop turns.
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
# "<pid> <exit code> <unix seconds>" of the agent's last exit, written by the supervisor;
# `start` and the updater read it to tell a crash from a slow start.
EXIT_FILE="$RUN/agent.exit"
HEALTH_FILE="$RUN/health.json"
# "<unix seconds> <who asked>": a stop that was asked for, written by `stop` before it
# signals anything and removed by every `start`. An updater judging a new version reads
# it: a version stopped on request is not a failed one (its next start judges it).
STOP_REQUEST_FILE="$RUN/stop-requested"
# An flock(2) the updater holds for the whole update; the kernel drops it when it dies.
LOCK_FILE="$RUN/update.lock"
# The workload the agent runs in its own process group, and that process's start time
# ("<pid> <clock ticks>"), so that a recycled pid is never signalled.
WORKLOAD_PID_FILE="$RUN/workload.pid"
WORKLOAD_START_FILE="$RUN/workload.starttime"

if [ -f "$AGENT_HOME/conf/agent-env.sh" ]; then
    # shellcheck disable=SC1091
    . "$AGENT_HOME/conf/agent-env.sh"
fi

STOP_TIMEOUT=${AGENT_STOP_TIMEOUT:-20}
# Seconds `start` waits for the agent to report itself (a loaded machine is slow to fork).
START_TIMEOUT=${AGENT_START_TIMEOUT:-15}
BACKOFF_MAX=${AGENT_RESTART_BACKOFF_MAX:-60}
# Seconds `start` waits for the agent's first contact with a server, so that it says at
# once when there is none and why (the agent keeps trying either way).
CONTACT_WAIT=${AGENT_START_CONTACT_WAIT:-5}
# The last error of each kind, written by the agent (`agent status` shows them).
ERRORS_FILE="$DATA/last-errors.json"
# Exit codes of `agent run` after which the agent is not restarted:
# 0 while an updater holds run/update.lock (handed over to it; 0 without one is
# restarted: nobody else would start it), 3 (refused, updates disabled) and
# 78 (EX_CONFIG: the configuration is wrong; restarting cannot fix it).
EXIT_CONFIG=78

log() {
    mkdir -p "$LOGS" 2>/dev/null
    printf '%s agent-wrapper: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >>"$LOGS/wrapper.log"
}

now() {
    date +%s
}

read_pid() {
    [ -f "$1" ] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    case "$pid" in '' | *[!0-9]*) return 1 ;; esac
    echo "$pid"
}

# The command line of a live process, or nothing (the process may end while we look).
cmdline_of() {
    { tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null
}

# True if $1 is alive and is this installation's agent (not a recycled pid).
is_agent() {
    [ -d "/proc/$1" ] || return 1
    case "$(cmdline_of "$1")" in *"/bin/agent run"*) return 0 ;; esac
    return 1
}

is_supervisor() {
    [ -d "/proc/$1" ] || return 1
    case "$(cmdline_of "$1")" in *"agent-wrapper.sh __supervise"*) return 0 ;; esac
    return 1
}

# True while $1 runs (a zombie waiting for its parent counts as gone).
alive() {
    [ -d "/proc/$1" ] || return 1
    state=$({ sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status"; } 2>/dev/null)
    [ -n "$state" ] && [ "$state" != "Z" ]
}

# True while an updater holds run/update.lock: the pid it wrote there is listed in
# /proc/locks with an exclusive flock on that very file (looking never takes the lock,
# which could turn a starting updater away). Sets $holder.
updater_running() {
    holder=$(read_pid "$LOCK_FILE") || return 1
    alive "$holder" || return 1
    inode=$(stat -c %i "$LOCK_FILE" 2>/dev/null) || return 1
    grep -Eq "^[0-9]+: +FLOCK +[A-Z]+ +WRITE +$holder +[0-9a-f]+:[0-9a-f]+:$inode " /proc/locks 2>/dev/null
}

# The workload's pid if the agent left it running (it was killed before it could stop
# it) and the record still names that very process.
leftover_workload() {
    wpid=$(read_pid "$WORKLOAD_PID_FILE") || return 1
    { read -r rpid rticks <"$WORKLOAD_START_FILE"; } 2>/dev/null || return 1
    [ "$rpid" = "$wpid" ] || return 1
    ticks=$({ sed 's/^.*) //' "/proc/$wpid/stat" | cut -d' ' -f20; } 2>/dev/null)
    [ -n "$ticks" ] && [ "$ticks" = "$rticks" ] || return 1
    echo "$wpid"
}

# Stops the whole process group of a workload its agent left behind: TERM, then KILL.
stop_leftover_workload() {
    wpid=$(leftover_workload) || return 0
    log "the agent left its workload (pid $wpid) running; stopping its process group"
    kill -TERM "-$wpid" 2>/dev/null
    deadline=$(($(now) + 10))
    while alive "$wpid" && [ "$(now)" -lt "$deadline" ]; do
        sleep 0.05
    done
    kill -KILL "-$wpid" 2>/dev/null
    rm -f "$WORKLOAD_PID_FILE" "$WORKLOAD_START_FILE"
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
    # Started by an updater or not, a later crash must run recovery (an updater that
    # still holds run/update.lock makes that a no-op).
    unset AGENT_UPDATER_ACTIVE
    stopping=0
    child=
    sleeper=
    trap 'stopping=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null; [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null' TERM INT
    backoff=1
    while [ "$stopping" -eq 0 ]; do
        started=$(now)
        "$AGENT_HOME/current/bin/agent" run >>"$LOGS/agent.out" 2>&1 &
        child=$!
        echo "$child" >"$PID_FILE"
        wait "$child"
        rc=$?
        # `wait` returns early when a trapped signal arrives; wait for the agent itself.
        while kill -0 "$child" 2>/dev/null; do
            wait "$child"
            rc=$?
        done
        echo "$child $rc $(now)" >"$EXIT_FILE"
        child=
        [ "$stopping" -eq 1 ] && break
        case "$rc" in
        0)
            if updater_running; then
                log "agent exited normally; the updater (pid $holder) takes over"
                break
            fi
            log "agent exited with code 0 but no updater holds run/update.lock; starting it again"
            ;;
        3) log "agent refused by the server and updates are disabled; not restarting"; break ;;
        "$EXIT_CONFIG")
            log "agent refused its configuration (exit $rc); not restarting: fix conf/agent.toml or conf/agent-env.sh (see logs/agent.out), then start it again"
            break
            ;;
        esac
        ran=$(($(now) - started))
        [ "$ran" -gt 60 ] && backoff=1
        log "agent exited with code $rc after ${ran}s; restarting in ${backoff}s"
        # In the background, so that TERM ends the wait at once.
        sleep "$backoff" &
        sleeper=$!
        wait "$sleeper"
        sleeper=
        [ "$stopping" -eq 1 ] && break
        backoff=$((backoff * 2))
        [ "$backoff" -gt "$BACKOFF_MAX" ] && backoff=$BACKOFF_MAX
        # While recovery runs this supervisor steps aside: the updater starts agents
        # through `start`, which must not take it for a supervisor between restarts (and
        # leave the start to it, while it waits for the updater).
        rm -f "$SUPERVISOR_PID_FILE"
        recover
        # Recovery may have started (or rolled back to) an agent with its own supervisor.
        if pid=$(read_pid "$PID_FILE") && is_agent "$pid"; then
            log "an agent (pid $pid) was started by recovery; this supervisor ends"
            break
        fi
        if sup=$(read_pid "$SUPERVISOR_PID_FILE") && [ "$sup" != $$ ] && is_supervisor "$sup"; then
            log "recovery started a supervisor (pid $sup); this one ends"
            break
        fi
        echo $$ >"$SUPERVISOR_PID_FILE"
    done
    [ "$(cat "$SUPERVISOR_PID_FILE" 2>/dev/null)" = "$$" ] && rm -f "$SUPERVISOR_PID_FILE"
}

# The last lines the agent wrote to its console log, indented, for error messages.
# After a start: waits up to CONTACT_WAIT seconds for the first contact with a server;
# says so when there is none, with the agent's own words for why. $1: the start's time.
await_contact() {
    since=$1
    deadline=$(($(now) + CONTACT_WAIT))
    why=
    while :; do
        if grep -Eq '"last_contact": *[0-9]' "$HEALTH_FILE" 2>/dev/null; then
            return 0
        fi
        changed=$(stat -c %Y "$ERRORS_FILE" 2>/dev/null || echo 0)
        if [ "$changed" -ge "$since" ]; then
            why=$(AGENT_HOME="$AGENT_HOME" "$SELF_DIR/agent" status 2>/dev/null |
                sed -n 's/^last contact error: *[^(]*([^)]*): //p')
            [ -n "$why" ] && break
        fi
        [ "$(now)" -ge "$deadline" ] && break
        sleep 0.1
    done
    [ -n "$why" ] || why="no answer yet from $(servers)"
    echo "no contact with a server yet: $why"
    echo "  the agent keeps trying; check server.urls in $AGENT_HOME/conf/agent.toml, see \`agent status\` and $LOGS/agent.log"
    log "no contact within ${CONTACT_WAIT}s of the start: $why"
}

# The servers conf/agent.toml names, for messages.
servers() {
    urls=$(sed -n 's/^ *urls *= *//p' "$AGENT_HOME/conf/agent.toml" 2>/dev/null | head -n 1)
    echo "${urls:-the servers in conf/agent.toml}"
}

agent_out_tail() {
    tail -n 5 "$LOGS/agent.out" 2>/dev/null | sed 's/^/    /'
}

# Exit code of agent $1 if the supervisor recorded its exit.
exit_code_of() {
    [ -f "$EXIT_FILE" ] || return 1
    { read -r epid ecode _ <"$EXIT_FILE"; } 2>/dev/null || return 1
    [ "$epid" = "$1" ] || return 1
    echo "$ecode"
}

start() {
    mkdir -p "$RUN" "$LOGS"
    # A start ends whatever stop was asked for before it.
    rm -f "$STOP_REQUEST_FILE"
    recover
    if pid=$(read_pid "$PID_FILE") && is_agent "$pid"; then
        echo "agent is already running (pid $pid)"
        return 0
    fi
    if sup=$(read_pid "$SUPERVISOR_PID_FILE") && is_supervisor "$sup"; then
        # Started by an updater, a live supervisor is the old version's, whose agent just
        # exited for this update: it is on its way out (it never restarts an agent while
        # the updater holds the lock). Taking it for a supervisor between restarts would
        # start nothing and leave the updater judging the old agent's exit.
        if [ -n "${AGENT_UPDATER_ACTIVE:-}" ]; then
            deadline=$(($(now) + 10))
            while is_supervisor "$sup" && [ "$(now)" -lt "$deadline" ]; do
                sleep 0.05
            done
        fi
        if is_supervisor "$sup"; then
            echo "the agent is between restarts (supervisor pid $sup retries with backoff; see $LOGS/wrapper.log)"
            return 0
        fi
    fi
    rm -f "$PID_FILE" "$EXIT_FILE"
    started_at=$(now)
    if command -v setsid >/dev/null 2>&1; then
        setsid "$SELF" __supervise </dev/null >/dev/null 2>&1 &
    else
        nohup "$SELF" __supervise </dev/null >/dev/null 2>&1 &
    fi
    # Up means: the agent wrote run/health.json naming its pid. An agent that exits
    # first did not start, whatever the supervisor does next.
    deadline=$(($(now) + START_TIMEOUT))
    while :; do
        if pid=$(read_pid "$PID_FILE"); then
            if ! alive "$pid"; then
                # The supervisor records the exit code right after it reaps the agent.
                settle=$(($(now) + 2))
                while ! code=$(exit_code_of "$pid") && [ "$(now)" -lt "$settle" ]; do
                    sleep 0.05
                done
                [ -n "$code" ] || code="?"
                if [ "$code" = "$EXIT_CONFIG" ]; then
                    echo "agent did not start: it refused its configuration (exit $code); fix it and start again:" >&2
                else
                    echo "agent did not start: it exited at once (exit $code); see $LOGS/agent.out:" >&2
                fi
                agent_out_tail >&2
                log "agent (pid $pid) exited at once with code $code"
                return 1
            fi
            if grep -Eq "\"pid\": *$pid([^0-9]|\$)" "$HEALTH_FILE" 2>/dev/null; then
                echo "agent started (pid $pid)"
                log "started agent (pid $pid)"
                # The updater judges contact itself, on its own clock.
                [ -n "${AGENT_UPDATER_ACTIVE:-}" ] || await_contact "$started_at"
                return 0
            fi
        fi
        if [ "$(now)" -ge "$deadline" ]; then
            if [ -n "${pid:-}" ] && alive "$pid"; then
                echo "agent started (pid $pid); it has not reported itself within ${START_TIMEOUT}s"
                log "started agent (pid $pid); no run/health.json yet"
                return 0
            fi
            echo "agent did not start within ${START_TIMEOUT}s; see $LOGS/agent.out and $LOGS/wrapper.log" >&2
            return 1
        fi
        sleep 0.05
    done
}

# A configuration the new agent would refuse (exit 78) must not cost the running one:
# restart checks it first, with the agent's own parser, and keeps the agent if it fails.
check_config() {
    if ! said=$("$AGENT_HOME/current/bin/agent" --home "$AGENT_HOME" config check 2>&1); then
        printf '%s\n' "$said" >&2
        echo "agent-wrapper.sh: the configuration is refused (above); nothing was stopped, the running agent keeps its configuration. Fix it, check it with: $AGENT_HOME/current/bin/agent config check" >&2
        return 78
    fi
}

stop() {
    sup=
    pid=
    # Said before anything is signalled, so that an updater watching a new version sees
    # why it ends. The updater's own stops (a rollback) are not requests: they are not said.
    if [ -z "${AGENT_UPDATER_ACTIVE:-}" ]; then
        mkdir -p "$RUN" 2>/dev/null
        { echo "$(now) agent-wrapper.sh stop" >"$STOP_REQUEST_FILE"; } 2>/dev/null
    fi
    if s=$(read_pid "$SUPERVISOR_PID_FILE") && is_supervisor "$s"; then sup=$s; fi
    if p=$(read_pid "$PID_FILE") && is_agent "$p"; then pid=$p; fi
    if [ -z "$sup" ] && [ -z "$pid" ]; then
        rm -f "$PID_FILE"
        echo "agent is not running"
        return 0
    fi
    # The supervisor forwards TERM to the agent and does not restart it.
    [ -n "$sup" ] && kill -TERM "$sup" 2>/dev/null
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
    deadline=$(($(now) + STOP_TIMEOUT))
    while [ -n "$pid" ] && alive "$pid" && [ "$(now)" -lt "$deadline" ]; do
        sleep 0.05
    done
    if [ -n "$pid" ] && alive "$pid"; then
        log "agent (pid $pid) did not stop within ${STOP_TIMEOUT}s; killing it"
        kill -KILL "$pid" 2>/dev/null
    fi
    deadline=$(($(now) + 5))
    while [ -n "$sup" ] && alive "$sup" && [ "$(now)" -lt "$deadline" ]; do
        sleep 0.05
    done
    rm -f "$PID_FILE"
    # The agent stops its workload first; one it could not (it was killed) goes now.
    stop_leftover_workload
    if [ -n "$pid" ]; then
        log "stopped agent (pid $pid)"
        echo "agent stopped (pid $pid)"
    else
        log "stopped the supervisor (pid $sup) between restarts"
        echo "agent stopped (it was between restarts)"
    fi
}

kill_all() {
    if sup=$(read_pid "$SUPERVISOR_PID_FILE") && is_supervisor "$sup"; then
        kill -KILL "$sup" 2>/dev/null
    fi
    if pid=$(read_pid "$PID_FILE") && is_agent "$pid"; then
        kill -KILL "$pid" 2>/dev/null
        echo "agent killed (pid $pid)"
        log "killed agent (pid $pid)"
    fi
    if wpid=$(leftover_workload); then
        kill -KILL "-$wpid" 2>/dev/null
        log "killed the workload's process group (pid $wpid)"
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
restart) check_config && stop && start ;;
status) status ;;
kill) kill_all ;;
__supervise) supervise ;;
-h | --help) usage ;;
*) usage ;;
esac
