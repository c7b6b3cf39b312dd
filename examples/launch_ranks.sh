#!/usr/bin/env bash
# Starts N ranks of a program on this machine, with the variables torchrun
# sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and prefixes
# each rank's output with "[rank R]".
#
#   examples/launch_ranks.sh [--timeout SECONDS] N PROGRAM [ARGS...]
#
# Exit status 0 when every rank exits with 0. When one fails, or the timeout
# (default 600 s) passes, the others are killed and the status is the first
# failure's (124 for the timeout): a rank waiting in a collective for a peer
# that died never hangs the launch. MASTER_ADDR defaults to 127.0.0.1 and
# MASTER_PORT to a free port. On several machines, run the program with the
# same variables as torchrun would set them instead.
set -uo pipefail

timeout_s=600
if [[ ${1:-} == --timeout ]]; then
  timeout_s=$2
  shift 2
fi
if (($# < 2)) || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [--timeout SECONDS] N PROGRAM [ARGS...]" >&2
  exit 2
fi
n=$1
shift

export WORLD_SIZE=$n
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
if [[ -z ${MASTER_PORT:-} ]]; then
  MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  export MASTER_PORT
fi

pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r LOCAL_RANK=$r timeout --kill-after=10 "$timeout_s" "$@" \
    > >(sed -u "s/^/[rank $r] /") 2>&1 &
  pids+=($!)
done

status=0
running=("${pids[@]}")
while ((${#running[@]})); do
  finished=""
  set +u  # wait -p leaves the variable unset when it reports no job
  wait -n -p finished "${running[@]}"
  rc=$?
  set -u
  if [[ -z $finished ]]; then
    break
  fi
  still=()
  for p in "${running[@]}"; do
    [[ $p == "$finished" ]] || still+=("$p")
  done
  running=("${still[@]+"${still[@]}"}")
  if ((rc != 0 && status == 0)); then
    status=$rc
    echo "launch_ranks: a rank exited with status $rc; stopping the others" >&2
    for p in "${running[@]+"${running[@]}"}"; do
      kill -TERM "$p" 2>/dev/null
    done
  fi
done
wait
exit $status
