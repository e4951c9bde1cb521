#!/usr/bin/env bash
# Stop what serve.sh started, by the PIDs it recorded: the worker first, then the server, then the MLflow UI. Each was started
# in its own session, so SIGTERM goes to its whole process group: flow runs the worker started get it too,
# cancel their training job, run their on_crashed hook and end Crashed (re-running resumes them from the
# last checkpoint). A Prefect worker waits for its flow runs on SIGTERM and an idle one may not exit at
# all, so whatever is left after PREFECT_STOP_GRACE seconds is killed.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${VERL_GRPO_HOME:-$REPO/.state}"
PREFECT_HOME="${PREFECT_HOME:-$STATE/prefect}"
GRACE="${PREFECT_STOP_GRACE:-10}"

stop_group() {
  local name=$1 pidfile="$PREFECT_HOME/$1.pid"
  [[ -f "$pidfile" ]] || { echo "$name: not running (no $pidfile)"; return 0; }
  local pid; pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq $((GRACE * 5))); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 -- "-$pid" 2>/dev/null; then
      kill -KILL -- "-$pid" 2>/dev/null
    fi
    echo "$name: stopped (pid $pid)"
  else
    echo "$name: not running (stale pid $pid)"
  fi
  rm -f "$pidfile"
}

stop_group worker
stop_group server
stop_group mlflow
