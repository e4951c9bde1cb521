#!/usr/bin/env bash
# Stop what serve.sh started, by the PIDs it recorded: the worker (and the flow runs it started) first,
# then the server. Each was started in its own session, so its process group is signalled.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${VERL_GRPO_HOME:-$REPO/.state}"
PREFECT_HOME="${PREFECT_HOME:-$STATE/prefect}"
GRACE="${PREFECT_STOP_GRACE:-30}"

stop_group() {
  local name=$1 pidfile="$PREFECT_HOME/$1.pid"
  [[ -f "$pidfile" ]] || { echo "$name: not running (no $pidfile)"; return 0; }
  local pid; pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq $((GRACE * 5))); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 -- "-$pid" 2>/dev/null; then
      echo "$name: still running after ${GRACE} s; killing"; kill -KILL -- "-$pid" 2>/dev/null
    fi
    echo "$name: stopped (pid $pid)"
  else
    echo "$name: not running (stale pid $pid)"
  fi
  rm -f "$pidfile"
}

stop_group worker
stop_group server
