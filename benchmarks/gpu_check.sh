#!/usr/bin/env bash
# gpu_check.sh: the GPU checks of the three scripts in one short run, for a machine with a CUDA GPU.
#
#   benchmarks/gpu_check.sh --wheels DIR       on a machine with pip and a network: download into DIR the wheels
#                                              (CPython 3.12, x86-64 Linux) of the packages a GPU machine with
#                                              PyTorch, numpy, OpenCV, TensorBoard and pytest may lack: gymnasium,
#                                              ale-py, tyro and their needs
#   benchmarks/gpu_check.sh OUTDIR [STEPS]     on the GPU machine, from the repository root: installs DIR's wheels
#                                              first if WHEELS=DIR is set, then writes into OUTDIR
#
# On the GPU machine it runs tests/test_cuda.py (the tests that need a GPU), then BreakoutNoFrameskip-v4 with
# --cuda for STEPS steps (default 102400) on each env path, with --bf16 on the wrappers, and under torchrun when
# there are several GPUs. It leaves at most 8 flat files in OUTDIR: env.txt, tests.txt, one log per run,
# summary.txt (each run's closing line, with its steps/s) and runs.tgz (the runs' TensorBoard events, checkpoints
# left out). Each step has a time limit, so a hang cannot eat the machine's time; the exit status is non-zero if
# any step failed.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

if [[ "${1:-}" == "--wheels" ]]; then
    dir=${2:?usage: gpu_check.sh --wheels DIR}
    # The versions of requirements.txt; mujoco is left out (the check's continuous run uses Pendulum-v1).
    pins=$(grep -E '^(gymnasium|ale-py|tyro)' "$repo/requirements.txt" | sed 's/\[.*\]//')
    exec python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$dir" $pins farama-notifications docstring-parser typeguard \
        "typing-extensions>=4.14"
fi

out=${1:?usage: gpu_check.sh OUTDIR [STEPS] (or --wheels DIR)}
steps=${2:-102400}
if [[ -n "${WHEELS:-}" ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-check-site "$WHEELS"/*.whl \
        || { echo "gpu_check.sh: error: could not install the wheels in $WHEELS" >&2; exit 2; }
    export PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}
fi
missing=$(python3 -c "
import importlib.util
print(' '.join(m for m in ('torch', 'numpy', 'gymnasium', 'ale_py', 'tyro', 'cv2', 'tensorboard', 'pytest')
               if importlib.util.find_spec(m) is None))")
if [[ -n "$missing" ]]; then
    echo "gpu_check.sh: error: python3 cannot import: $missing (carry their wheels: see --wheels)" >&2
    exit 2
fi
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())") || exit 2
if [[ "$gpus" -lt 1 ]]; then
    echo "gpu_check.sh: error: torch sees no CUDA GPU here; run this on a machine with one" >&2
    exit 2
fi
mkdir -p "$out" && out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 -c "import torch, gymnasium, ale_py, platform; print('python', platform.python_version(),
'torch', torch.__version__, 'cuda', torch.version.cuda, 'gymnasium', gymnasium.__version__, 'ale-py', ale_py.__version__)"
  echo "CPUs: $(nproc); commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
: > "$out/summary.txt"
failed=0

echo "gpu_check.sh: tests/test_cuda.py"
# One file in one process: `-o addopts=` drops pytest.ini's xdist workers, which this machine may not have.
(cd "$repo" && timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts= tests/test_cuda.py) > "$out/tests.txt" 2>&1 \
    || failed=1
echo "tests: $(tail -n 1 "$out/tests.txt")" | tee -a "$out/summary.txt"

work=$(mktemp -d)
run_limit=${RUN_LIMIT:-240}  # seconds per run; a run stopped by it saves a checkpoint and says so in its log
run() {  # NAME CMD...: one timed Breakout run in its own folder; its closing line goes to summary.txt
    local name=$1; shift
    echo "gpu_check.sh: $name: $*"
    mkdir -p "$work/$name"
    (cd "$work/$name" && timeout -s TERM -k 60 "$run_limit" "$@") > "$out/$name.log" 2>&1
    local status=$?
    [[ $status -eq 0 ]] || failed=1
    echo "$name (exit $status): $(grep -h 'done,' "$out/$name.log" || tail -n 1 "$out/$name.log")" | tee -a "$out/summary.txt"
}
common=(--env-id BreakoutNoFrameskip-v4 --cuda --seed 1 --total-timesteps "$steps" --progress-interval 15)
run wrappers python3 "$repo/ppo_atari.py" "${common[@]}" --env-path wrappers --exp-name gpu-wrappers
run ale-vector python3 "$repo/ppo_atari.py" "${common[@]}" --env-path ale-vector --exp-name gpu-ale-vector
run bf16 python3 "$repo/ppo_atari.py" "${common[@]}" --env-path wrappers --bf16 --exp-name gpu-bf16
if [[ "$gpus" -gt 1 ]]; then
    run torchrun python3 -m torch.distributed.run --standalone --nproc-per-node "$gpus" "$repo/ppo_atari.py" \
        "${common[@]}" --exp-name "gpu-torchrun-$gpus"
fi
tar -czf "$out/runs.tgz" -C "$work" --exclude checkpoint.pt .
rm -rf "$work"
exit $failed
