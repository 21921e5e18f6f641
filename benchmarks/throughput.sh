#!/usr/bin/env bash
# Steps per second of each script on its default settings, one run at a time on an otherwise idle machine.
# Usage: benchmarks/throughput.sh [OUTDIR]      (default: a new temporary directory)
# Each line of the output: the exact command, the SPS it logged at its last iteration (charts/SPS: environment
# steps over wall time since training started, rollouts and updates included; start-up excluded), and the run's
# folder under OUTDIR, whose TensorBoard events hold that figure. One torch thread per run (a sweep's setting),
# except the last line: ppo_atari.py with torch's default threads, which is what a single run uses.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
cd "$out"
export OMP_NUM_THREADS=1

last_sps() {  # last charts/SPS value of a run directory
  python - "$1" <<'EOF'
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(int(acc.Scalars("charts/SPS")[-1].value))
EOF
}

measure() {  # measure [env -u VAR] NAME ARGS...: run one command, print it with its SPS and its run directory
  local prefix=() stderr run
  if [[ $1 == env ]]; then prefix=("$1" "$2" "$3"); shift 3; fi
  local name=$1; shift
  stderr=$(mktemp)
  "${prefix[@]}" python "$repo/$name" --no-progress "$@" >/dev/null 2>"$stderr" || { cat "$stderr"; rm -f "$stderr"; exit 1; }
  rm -f "$stderr"
  run=$(ls -td runs/*/ | head -n 1)
  echo "${prefix[*]}${prefix:+ }python $name $* | SPS $(last_sps "$run") | ${run%/}"
}

measure ppo_discrete.py --env-id CartPole-v1 --exp-name throughput
measure ppo_continuous.py --env-id Hopper-v4 --total-timesteps 204800 --exp-name throughput
measure ppo_atari.py --env-id BreakoutNoFrameskip-v4 --total-timesteps 20480 --exp-name throughput
measure ppo_atari.py --env-id BreakoutNoFrameskip-v4 --total-timesteps 20480 --env-path ale-vector --exp-name throughput_ale
measure env -u OMP_NUM_THREADS ppo_atari.py --env-id BreakoutNoFrameskip-v4 --total-timesteps 20480 --exp-name throughput_all_cores
