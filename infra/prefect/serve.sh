#!/usr/bin/env bash
# Local Prefect server + verl-grpo deployments + a process worker, all in the background.
# PIDs and logs in $PREFECT_HOME (default .state/prefect); infra/prefect/stop.sh stops them by PID.
# The MLflow UI of the local tracking store runs beside it (mlflow.pid, mlflow.log).
#   PREFECT_SERVER_PORT (4200)   MLFLOW_UI_PORT (5000)   VERL_GRPO_HOME (.state)   VENV (.venv)
#   PREFECT_READY_TIMEOUT (180 s)   VERL_GRPO_ZOMBIE_AFTER_S (90 s without a heartbeat marks a flow run Crashed)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
VENV="${VENV:-$REPO/.venv}"
PORT="${PREFECT_SERVER_PORT:-4200}"
MLFLOW_PORT="${MLFLOW_UI_PORT:-5000}"
# The worker's flow runs use this state dir (store, MLflow, model cache) whatever shell later starts a run.
export VERL_GRPO_HOME="${VERL_GRPO_HOME:-$REPO/.state}"
export PREFECT_HOME="${PREFECT_HOME:-$VERL_GRPO_HOME/prefect}"
export PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_API_DATABASE_CONNECTION_URL="sqlite+aiosqlite:///$PREFECT_HOME/prefect.db"
# Telemetry and error reporting of every library off for the server, the MLflow UI, the worker and its flow runs
# (verl_grpo/privacy.py; a variable already set wins).
eval "$("$VENV/bin/python" -m verl_grpo.privacy)"
# Flow runs link their MLflow run to this UI (tasks/reporting.py).
export VERL_GRPO_MLFLOW_UI="http://127.0.0.1:$MLFLOW_PORT"
# Flow-run processes send heartbeats, so the zombie-run automation can tell a dead run from a long one.
export PREFECT_FLOWS_HEARTBEAT_FREQUENCY="${PREFECT_FLOWS_HEARTBEAT_FREQUENCY:-30}"
# Every directory a library expects, before any of them starts (one line and exit 2 when one cannot be made).
"$VENV/bin/verl-grpo" home >/dev/null

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

if alive "$PREFECT_HOME/server.pid"; then
  echo "Prefect server already running (pid $(cat "$PREFECT_HOME/server.pid")); make stop first" >&2
  exit 1
fi

start=$(date +%s.%N)
setsid "$VENV/bin/prefect" server start --host 127.0.0.1 --port "$PORT" \
  >"$PREFECT_HOME/server.log" 2>&1 < /dev/null &
echo $! >"$PREFECT_HOME/server.pid"

deadline=$(( $(date +%s) + ${PREFECT_READY_TIMEOUT:-180} ))
until curl -sf "$PREFECT_API_URL/health" >/dev/null; do
  if ! alive "$PREFECT_HOME/server.pid"; then
    echo "Prefect server exited; last lines of $PREFECT_HOME/server.log:" >&2; tail -20 "$PREFECT_HOME/server.log" >&2
    exit 1
  fi
  if (( $(date +%s) > deadline )); then
    echo "Prefect server not healthy at $PREFECT_API_URL after ${PREFECT_READY_TIMEOUT:-180} s; see $PREFECT_HOME/server.log" >&2
    exit 1
  fi
  sleep 0.5
done
ready=$(date +%s.%N)
printf 'Prefect server healthy at %s in %.1f s (pid %s)\n' "$PREFECT_API_URL" "$(echo "$ready - $start" | bc)" \
  "$(cat "$PREFECT_HOME/server.pid")"

# The MLflow UI over the same tracking store the worker's runs write (the config's default, in the state dir).
export VERL_GRPO_MLFLOW_UI_STORE="$("$VENV/bin/verl-grpo" home | awk '$1 == "MLflow" {print $2}')"
# Job execution serves MLflow's GenAI features (judges, scorers) through helper processes we do not need; one
# worker process serves one user's UI (MLflow starts 4 by default, each importing MLflow: CPU a trainer wants).
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid "$VENV/bin/mlflow" server --backend-store-uri "$VERL_GRPO_MLFLOW_UI_STORE" --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 \
  >"$PREFECT_HOME/mlflow.log" 2>&1 < /dev/null &
echo $! >"$PREFECT_HOME/mlflow.pid"
until curl -sf "$VERL_GRPO_MLFLOW_UI/health" >/dev/null; do
  if ! alive "$PREFECT_HOME/mlflow.pid"; then
    echo "MLflow UI exited; last lines of $PREFECT_HOME/mlflow.log:" >&2; tail -20 "$PREFECT_HOME/mlflow.log" >&2
    exit 1
  fi
  if (( $(date +%s) > deadline )); then
    echo "MLflow UI not healthy at $VERL_GRPO_MLFLOW_UI; see $PREFECT_HOME/mlflow.log" >&2; exit 1
  fi
  sleep 0.5
done
echo "MLflow UI at $VERL_GRPO_MLFLOW_UI ($VERL_GRPO_MLFLOW_UI_STORE)"

"$VENV/bin/python" infra/prefect/setup_server.py
"$VENV/bin/prefect" --no-prompt deploy --all >"$PREFECT_HOME/deploy.log" 2>&1 \
  || { echo "prefect deploy failed:" >&2; tail -30 "$PREFECT_HOME/deploy.log" >&2; exit 1; }
echo "deployed: $(grep -o "verl-grpo/[a-z0-9-]*" "$PREFECT_HOME/deploy.log" | sort -u | tr '\n' ' ')"

setsid "$VENV/bin/prefect" worker start --pool verl-grpo-local --type process \
  >"$PREFECT_HOME/worker.log" 2>&1 < /dev/null &
echo $! >"$PREFECT_HOME/worker.pid"

# The scheduler reports failures only in server.log: make them fail `make serve` instead of every night.
"$VENV/bin/python" infra/prefect/check_server.py --log "$PREFECT_HOME/server.log" \
  || { echo "the Prefect server is up but failing (above); inspect it, then: make stop" >&2; exit 1; }

cat >"$PREFECT_HOME/env" <<ENV
export VERL_GRPO_HOME=$VERL_GRPO_HOME
export PREFECT_HOME=$PREFECT_HOME
export PREFECT_API_URL=$PREFECT_API_URL
export VERL_GRPO_MLFLOW_UI=$VERL_GRPO_MLFLOW_UI
export VERL_GRPO_MLFLOW_UI_STORE=$VERL_GRPO_MLFLOW_UI_STORE
ENV
cat <<MSG
worker started (pid $(cat "$PREFECT_HOME/worker.pid")); logs in $PREFECT_HOME/{server,deploy,worker}.log
UI:  http://127.0.0.1:$PORT (Prefect)   $VERL_GRPO_MLFLOW_UI/#/experiments?workflowType=machine_learning (MLflow)
Leaderboard (after a run): http://127.0.0.1:$PORT/artifacts/key/leaderboard-gsm8k (its first line opens MLflow's view)
Run: source $PREFECT_HOME/env && $VENV/bin/prefect deployment run verl-grpo/gsm8k --watch
Stop: make stop
MSG
