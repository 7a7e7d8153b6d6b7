#!/usr/bin/env bash
# Start / stop / inspect a Ray node for rlinf_like on this machine.
#
#   ./ray_launch.sh start head   [--port 6379] [--num-cpus N] [--num-gpus N] [--expect-nodes N] [--timeout 300]
#                                [--node-ip IP]
#   ./ray_launch.sh start worker --address HEAD_IP:PORT [--num-cpus N] [--num-gpus N] [--timeout 300]
#   ./ray_launch.sh start slurm  [--port 6379] [--timeout 300] [--block]   (one srun task per node)
#   ./ray_launch.sh wait --address HEAD_IP:PORT --expect-nodes N [--timeout 300]
#   ./ray_launch.sh status
#   ./ray_launch.sh stop
#
# `start slurm` reads the allocation (SLURM_JOB_NODELIST, SLURM_NODEID, SLURM_JOB_NUM_NODES,
# SLURM_CPUS_ON_NODE, SLURM_GPUS_ON_NODE): the first node starts the head and waits until every
# node has joined; the others wait for the head's port, then join. --block keeps the srun task
# alive until the node stops (a TERM from scancel stops it cleanly). CPU/GPU counts come from SLURM.
#
# `stop` stops only the Ray node this script started (it runs `ray start --block` in the background
# and signals that process), never every Ray process on the machine as `ray stop` would.
# State (pid, address) lives in $RLINF_RAY_STATE_DIR (default /tmp/rlinf_like-ray-$USER).
# Environment forwarded to every worker process: OMP_NUM_THREADS (default 1), and anything you export.
# Token auth: RAY_AUTH_MODE defaults to "disabled" here, so `ray status` and drivers on a private
# cluster connect without a token file; export RAY_AUTH_MODE=token to keep Ray's default.
set -euo pipefail

STATE_DIR="${RLINF_RAY_STATE_DIR:-/tmp/rlinf_like-ray-${USER:-$(id -un)}}"
HERE="$(cd "$(dirname "$0")" && pwd)"
if [[ -x "$HERE/.venv/bin/python" ]]; then VENV_BIN="$HERE/.venv/bin/"; else VENV_BIN=""; fi
PYTHON="${PYTHON:-${VENV_BIN}python}"
RAY="${RAY:-${VENV_BIN}ray}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"

die() { echo "ray_launch.sh: $*" >&2; exit 1; }
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

running_pid() {
  [[ -f "$STATE_DIR/ray.pid" ]] || return 1
  local pid; pid=$(cat "$STATE_DIR/ray.pid")
  kill -0 "$pid" 2>/dev/null && echo "$pid"
}

wait_for_nodes() {  # address expected timeout
  "$PYTHON" - "$1" "$2" "$3" <<'PY'
import sys, time, ray
address, expected, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= expected:
        print(f"{len(alive)} node(s) up: " + ", ".join(n["NodeManagerAddress"] for n in alive))
        break
    if time.monotonic() > deadline:
        sys.exit(f"only {len(alive)} of {expected} node(s) joined within {timeout:g}s")
    time.sleep(1)
PY
}

cmd_start() {
  local role="${1:-}"; shift || true
  [[ "$role" == head || "$role" == worker ]] || die "start needs 'head' or 'worker' (got '${role}')"
  local port=6379 address="" expect=1 timeout=300 node_ip="" extra=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --port) port="$2"; shift 2 ;;
      --node-ip) node_ip="$2"; shift 2 ;;
      --address) address="$2"; shift 2 ;;
      --num-cpus|--num-gpus) extra+=("$1" "$2"); shift 2 ;;
      --expect-nodes) expect="$2"; shift 2 ;;
      --timeout) timeout="$2"; shift 2 ;;
      -h|--help) usage ;;
      *) die "unknown option '$1' for start $role" ;;
    esac
  done
  if pid=$(running_pid); then die "a Ray node started by this script is already running (pid $pid); run stop first"; fi
  mkdir -p "$STATE_DIR"
  local args=(start --block --disable-usage-stats "${extra[@]}")
  if [[ "$role" == head ]]; then
    args+=(--head --port "$port" --include-dashboard=false)
    address="${node_ip:-127.0.0.1}:$port"
    [[ -n "$node_ip" ]] && args+=(--node-ip-address "$node_ip")
  else
    [[ -n "$address" ]] || die "start worker needs --address HEAD_IP:PORT"
    args+=(--address "$address")
  fi
  setsid "$RAY" "${args[@]}" >"$STATE_DIR/ray.log" 2>&1 < /dev/null &
  echo $! > "$STATE_DIR/ray.pid"
  echo "$address" > "$STATE_DIR/address"
  local deadline=$((SECONDS + timeout))
  until RAY_ADDRESS="$address" "$RAY" status >/dev/null 2>&1; do
    kill -0 "$(cat "$STATE_DIR/ray.pid")" 2>/dev/null || { tail -20 "$STATE_DIR/ray.log" >&2; die "ray start exited; log: $STATE_DIR/ray.log"; }
    (( SECONDS < deadline )) || die "Ray at $address did not come up within ${timeout}s; log: $STATE_DIR/ray.log"
    sleep 1
  done
  [[ "$role" == head ]] && wait_for_nodes "$address" "$expect" "$timeout"
  echo "Ray $role up at $address (pid $(cat "$STATE_DIR/ray.pid")); drivers: export RAY_ADDRESS=$address"
}

port_open() {  # host port
  "$PYTHON" -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()' "$1" "$2" 2>/dev/null
}

cmd_start_slurm() {
  local port=6379 timeout=300 block=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --port) port="$2"; shift 2 ;;
      --timeout) timeout="$2"; shift 2 ;;
      --block) block=1; shift ;;
      -h|--help) usage ;;
      *) die "unknown option '$1' for start slurm" ;;
    esac
  done
  local slurm_env; slurm_env="$("$PYTHON" -m rlinf_like.runtime.slurm env)" || exit 1
  eval "$slurm_env"  # HEAD_HOST NODE_ID NUM_NODES NODE_CPUS NODE_GPUS
  local head_ip extra=()
  head_ip="$("$PYTHON" -c 'import socket, sys; print(socket.gethostbyname(sys.argv[1]))' "$HEAD_HOST")" \
    || die "cannot resolve the head node '$HEAD_HOST'"
  [[ -n "$NODE_CPUS" ]] && extra+=(--num-cpus "$NODE_CPUS")
  [[ -n "$NODE_GPUS" ]] && extra+=(--num-gpus "$NODE_GPUS")
  echo "SLURM node $NODE_ID of $NUM_NODES; head $HEAD_HOST ($head_ip:$port)"
  if [[ "$NODE_ID" == 0 ]]; then
    cmd_start head --port "$port" --node-ip "$head_ip" --expect-nodes "$NUM_NODES" --timeout "$timeout" "${extra[@]}"
  else
    local deadline=$((SECONDS + timeout))
    until port_open "$head_ip" "$port"; do
      (( SECONDS < deadline )) || die "the Ray head at $head_ip:$port did not open within ${timeout}s"
      sleep 2
    done
    cmd_start worker --address "$head_ip:$port" --timeout "$timeout" "${extra[@]}"
  fi
  if (( block )); then
    trap 'cmd_stop; exit 0' TERM INT
    local pid; pid=$(cat "$STATE_DIR/ray.pid")
    while kill -0 "$pid" 2>/dev/null; do sleep 5 & wait $!; done
  fi
}

cmd_wait() {
  local address="" expect=1 timeout=300
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --address) address="$2"; shift 2 ;;
      --expect-nodes) expect="$2"; shift 2 ;;
      --timeout) timeout="$2"; shift 2 ;;
      *) die "unknown option '$1' for wait" ;;
    esac
  done
  [[ -n "$address" ]] || die "wait needs --address HEAD_IP:PORT"
  wait_for_nodes "$address" "$expect" "$timeout"
}

cmd_stop() {
  local pid
  if ! pid=$(running_pid); then echo "no Ray node started by this script is running"; rm -f "$STATE_DIR/ray.pid"; return 0; fi
  kill -TERM "$pid"
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -0 "$pid" 2>/dev/null && die "Ray (pid $pid) did not stop within 60s"
  rm -f "$STATE_DIR/ray.pid" "$STATE_DIR/address"
  echo "Ray node (pid $pid) stopped"
}

cmd_status() {
  local pid address
  pid=$(running_pid) || { echo "no Ray node started by this script is running"; return 1; }
  address="$(cat "$STATE_DIR/address")"
  echo "Ray node started by ray_launch.sh: pid $pid, cluster $address"
  wait_for_nodes "$address" 1 30
  # Ray's own report (its autoscaler publishes it a few seconds after start-up)
  RAY_ADDRESS="$address" "$RAY" status || true
}

case "${1:-}" in
  start) shift; if [[ "${1:-}" == slurm ]]; then shift; cmd_start_slurm "$@"; else cmd_start "$@"; fi ;;
  wait) shift; cmd_wait "$@" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  -h|--help|help) usage ;;
  *) usage 2 ;;
esac
