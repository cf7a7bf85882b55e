# shellcheck shell=bash
# Sourced by lab-up.sh, lab-down.sh, stock-host-up.sh and stock-host-down.sh: the logging and the PID
# bookkeeping both lab profiles share. A recorded PID counts only while its command name still matches,
# so a PID reused by another process is never signalled. The sourcing script sets:
#   LOG_TAG : the prefix of every line it logs (e.g. lab-up)
#   PIDS    : its "NAME PID" file
#   LOGS    : the directory a failure of wait_for points to (up scripts only)

log() { echo "[$LOG_TAG] $*"; }
fail() { echo "[$LOG_TAG] FAILED: $*" >&2; exit 1; }

pid_of() { [ -f "$PIDS" ] && awk -v n="$1" '$1==n {p=$2} END {print p}' "$PIDS"; }
alive() { # alive NAME COMM: the process recorded as NAME runs and is still COMM
  local p
  p=$(pid_of "$1")
  [ -n "$p" ] && [ -d "/proc/$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ]
}
record() { # record NAME PID
  grep -v "^$1 " "$PIDS" >"$PIDS.tmp" || true
  echo "$1 $2" >>"$PIDS.tmp"
  mv "$PIDS.tmp" "$PIDS"
}
wait_for() { # wait_for TENTHS DESCRIPTION COMMAND...
  local tenths=$1 what=$2
  shift 2
  for _ in $(seq "$tenths"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  fail "$what did not come up within $((tenths / 10)) s; see $LOGS"
}

# Stops every recorded process, newest first, by PID (TERM, then KILL after 5 s), and empties $PIDS.
stop_recorded() {
  [ -f "$PIDS" ] || return 0
  tac "$PIDS" | while read -r name pid; do
    [ -n "$pid" ] || continue
    if [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
      kill -TERM "$pid"
      for _ in $(seq 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
      if [ -d "/proc/$pid" ]; then
        kill -KILL "$pid"
        log "killed -9 $name ($pid)"
      else
        log "stopped $name ($pid)"
      fi
    fi
  done
  : >"$PIDS"
}

has_netns() { case " $(ip netns list | awk '{print $1}' | tr '\n' ' ') " in *" $1 "*) return 0 ;; esac; return 1; }
