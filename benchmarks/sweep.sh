#!/usr/bin/env bash
# sweep.sh: run one training script over env ids x seeds, locally with parallel workers or as one Slurm
# job array. See usage() below, or run `benchmarks/sweep.sh --help`.
#
# Layout on disk (one directory per run; the training script runs with it as its working directory):
#
#   OUTDIR/SCRIPT/VARIANT/sweep_args          the extra arguments this variant was run with
#   OUTDIR/SCRIPT/VARIANT/sweeps.log          every sweep.sh command line that touched this variant
#   OUTDIR/SCRIPT/VARIANT/ENV/seedN/log.txt   stdout+stderr of the run; line 1 is the exact command
#   OUTDIR/SCRIPT/VARIANT/ENV/seedN/runs/...  the TensorBoard events the script writes
#   OUTDIR/SCRIPT/VARIANT/ENV/seedN/done      written only after the run exited 0
#
# A run with a `done` marker is finished and skipped when the sweep is started again; a run directory
# without one (interrupted, failed) is wiped and the run starts over.

set -uo pipefail

ORIG_ARGS=("$@")
SWEEP_SH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
PROG=sweep.sh

usage() {
    cat <<'EOF'
Usage: benchmarks/sweep.sh -s SCRIPT -e ENV_IDS [options] [-- EXTRA_ARGS...]

Run SCRIPT once per env id and seed:
    python SCRIPT --env-id ENV --seed N --exp-name VARIANT --no-progress EXTRA_ARGS...
with OMP_NUM_THREADS=1, in OUTDIR/SCRIPT/VARIANT/ENV/seedN/ (its log.txt, runs/ and a done marker).
Finished runs (done marker present) are skipped, so an interrupted sweep is resumed by starting it again.

Options:
  -s, --script PATH         training script, e.g. ppo_discrete.py (required)
  -e, --env-ids IDS         env ids, comma- or space-separated; repeatable (required)
      --seeds LIST          explicit seeds, e.g. 1,2,3 (instead of --num-seeds/--seed-start)
  -n, --num-seeds N         number of seeds (default 3) ...
      --seed-start S        ... starting at S (default 1)
  -v, --variant NAME        name of this configuration, passed to the script as --exp-name (default: default);
                            letters, digits, '.', '_', '-', and no '__'. Use a new name for new EXTRA_ARGS.
  -o, --outdir DIR          root of the sweep output (default: benchmarks/sweeps next to this script)
  -j, --jobs N              local mode: runs at once (default: number of cores)
      --python PY           interpreter (default: $PYTHON, else python)
      --dry-run             print the commands (or the Slurm job script) and run nothing
  -h, --help                this text

Slurm mode (one array task per env x seed that is not done yet; prints the job id and returns):
      --slurm               submit to Slurm with sbatch instead of running locally
      --slurm-max-parallel N  at most N tasks at once (--array=...%N; default: no limit)
      --slurm-cpus N        CPUs per task (default 1; OMP_NUM_THREADS is set to it; the scripts still use
                            one torch thread unless given --threads N after --)
      --slurm-time T        time limit per task, e.g. 02:00:00 (default: the partition's)
      --slurm-output PAT    stdout/stderr file of each task (default: OUTDIR/SCRIPT/VARIANT/slurm/%x-%A_%a.out)
      --slurm-partition P   partition to submit to
      --slurm-arg ARG       any other sbatch option, repeatable, e.g. --slurm-arg=--account=myproj
  OUTDIR must be on a file system that the compute nodes share.

Exit status: 0 if every run finished (or was already done), 1 if any failed (listed at the end with its
log), 2 on a usage error, 130 when stopped (Ctrl-C, SIGTERM: the runs are stopped too and start over next
time). Slurm mode: 0 once the array is submitted.

Examples:
  benchmarks/sweep.sh -s ppo_discrete.py -e CartPole-v1,Acrobot-v1,MountainCar-v0 -n 3
  benchmarks/sweep.sh -s ppo_discrete.py -e CartPole-v1 -n 3 -v noclip -- --clip-coef 100
  benchmarks/sweep.sh -s ppo_atari.py -e BreakoutNoFrameskip-v4 --seeds 1,2,3 --slurm \
      --slurm-cpus 8 --slurm-time 08:00:00 --slurm-max-parallel 6 -- --threads 8
  python benchmarks/compare.py benchmarks/sweeps      # tables and plots of what the sweeps wrote
EOF
}

die() { echo "$PROG: error: $*" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------------
# One run: run_one SEED_DIR THREADS CMD...   (also called by Slurm tasks, as `sweep.sh --_run-one ...`)
# ---------------------------------------------------------------------------------------------------
run_one() {
    local dir=$1 threads=$2
    shift 2
    [[ "$dir" =~ ^/.+/seed[0-9]+$ ]] || { echo "$PROG: refusing to use run directory '$dir'" >&2; return 2; }
    # No done marker: whatever is here is from an interrupted or failed run; start over.
    rm -rf -- "$dir"
    mkdir -p -- "$dir" || return 1
    local log="$dir/log.txt" started rc pid stopping
    started=$(date +%s)
    {
        printf 'cd %q && OMP_NUM_THREADS=%s' "$dir" "$threads"
        printf ' %q' "$@"
        printf '\n# started %s on %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(hostname)"
    } >"$log"
    # Pass a stop request on to the training process; the run then has no done marker and starts over.
    pid="" stopping=0
    trap 'stopping=1; [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null' TERM INT
    (cd "$dir" && OMP_NUM_THREADS=$threads exec "$@") >>"$log" 2>&1 </dev/null &
    pid=$!
    [ "$stopping" -eq 0 ] || kill -TERM "$pid" 2>/dev/null
    while true; do
        wait "$pid"
        rc=$?
        kill -0 "$pid" 2>/dev/null || break
    done
    trap - TERM INT
    local finished
    finished=$(date +%s)
    printf '# exit status %s after %s s\n' "$rc" "$((finished - started))" >>"$log"
    if [ "$rc" -eq 0 ]; then
        printf 'started %s\nfinished %s\nhost %s\n' "$started" "$finished" "$(hostname)" >"$dir/done.tmp" &&
            mv -f -- "$dir/done.tmp" "$dir/done"
        echo "$PROG: finished ${dir}  ($((finished - started)) s)"
    elif [ "$stopping" -eq 1 ]; then
        echo "$PROG: stopped  ${dir}  (it will start over next time)"
    else
        echo "$PROG: FAILED   ${dir}  (exit $rc; log: $log)"
    fi
    return "$rc"
}

if [ "${1:-}" = "--_run-one" ]; then
    shift
    run_one "$@"
    exit $?
fi

# ---------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------
script="" env_ids=() seeds=() num_seeds=3 seed_start=1 variant=default outdir="" dry_run=0
jobs=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
python=${PYTHON:-python}
slurm=0 slurm_max="" slurm_cpus=1 slurm_time="" slurm_output="" slurm_partition="" slurm_args=()
extra=()

need() { [ $# -ge 2 ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
    opt=$1
    # --opt=value is the same as --opt value
    if [[ "$opt" == --*=* ]]; then
        set -- "${opt%%=*}" "${opt#*=}" "${@:2}"
        opt=$1
    fi
    case "$opt" in
        -h | --help) usage; exit 0 ;;
        -s | --script) need "$@"; script=$2; shift 2 ;;
        -e | --env-ids | --env-id) need "$@"; read -r -a ids <<<"${2//,/ }"; env_ids+=("${ids[@]}"); shift 2 ;;
        --seeds) need "$@"; read -r -a seeds <<<"${2//,/ }"; shift 2 ;;
        -n | --num-seeds) need "$@"; num_seeds=$2; shift 2 ;;
        --seed-start) need "$@"; seed_start=$2; shift 2 ;;
        -v | --variant) need "$@"; variant=$2; shift 2 ;;
        -o | --outdir) need "$@"; outdir=$2; shift 2 ;;
        -j | --jobs) need "$@"; jobs=$2; shift 2 ;;
        --python) need "$@"; python=$2; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --slurm) slurm=1; shift ;;
        --slurm-max-parallel) need "$@"; slurm_max=$2; shift 2 ;;
        --slurm-cpus) need "$@"; slurm_cpus=$2; shift 2 ;;
        --slurm-time) need "$@"; slurm_time=$2; shift 2 ;;
        --slurm-output) need "$@"; slurm_output=$2; shift 2 ;;
        --slurm-partition) need "$@"; slurm_partition=$2; shift 2 ;;
        --slurm-arg) need "$@"; slurm_args+=("$2"); shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown option '$opt' (arguments for the training script go after --; see --help)" ;;
    esac
done

is_int() { [[ "$1" =~ ^[0-9]+$ ]]; }
[ -n "$script" ] || die "--script is required (see --help)"
[ -f "$script" ] || die "no such script: $script"
[ ${#env_ids[@]} -gt 0 ] || die "--env-ids is required (see --help)"
[[ "$variant" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ && "$variant" != *__* ]] ||
    die "bad --variant '$variant': use letters, digits, '.', '_', '-' (no '__', which separates run-name fields)"
is_int "$jobs" && [ "$jobs" -ge 1 ] || die "--jobs must be a positive integer"
is_int "$slurm_cpus" && [ "$slurm_cpus" -ge 1 ] || die "--slurm-cpus must be a positive integer"
[ -z "$slurm_max" ] || { is_int "$slurm_max" && [ "$slurm_max" -ge 1 ]; } ||
    die "--slurm-max-parallel must be a positive integer"
if [ ${#seeds[@]} -eq 0 ]; then
    is_int "$num_seeds" && [ "$num_seeds" -ge 1 ] || die "--num-seeds must be a positive integer"
    is_int "$seed_start" || die "--seed-start must be a non-negative integer"
    for ((i = 0; i < num_seeds; i++)); do seeds+=($((seed_start + i))); done
fi
for s in "${seeds[@]}"; do is_int "$s" || die "bad seed '$s'"; done
# Two runs of the same env and seed would share one directory, each wiping the other's files.
dup=$(printf '%s\n' "${seeds[@]}" | sort | uniq -d | head -n 1)
[ -z "$dup" ] || die "seed $dup is given twice"
dup=$(printf '%s\n' "${env_ids[@]//\//_}" | sort | uniq -d | head -n 1)
[ -z "$dup" ] || die "env id $dup is given twice"
command -v "$python" >/dev/null 2>&1 || die "python interpreter not found: $python (use --python)"

script_abs="$(cd "$(dirname "$script")" && pwd)/$(basename "$script")"
script_name=$(basename "$script" .py)
[ -n "$outdir" ] || outdir="$(dirname "$SWEEP_SH")/sweeps"
mkdir -p -- "$outdir" || die "cannot create $outdir"
outdir="$(cd "$outdir" && pwd)"
vdir="$outdir/$script_name/$variant"
# The interpreter itself (not a pyenv shim or alias), so the logged command and Slurm tasks use exactly it.
python_abs=$("$python" -c 'import sys; print(sys.executable)') || die "cannot run $python"

# A variant is one configuration: refuse to mix runs made with different extra arguments under one name.
extra_quoted=""
[ ${#extra[@]} -eq 0 ] || extra_quoted=$(printf '%q ' "${extra[@]}")
if [ -f "$vdir/sweep_args" ] && [ "$(cat "$vdir/sweep_args")" != "$extra_quoted" ]; then
    die "variant '$variant' of $script_name was run with the extra arguments [$(cat "$vdir/sweep_args")], not" \
        "[$extra_quoted]; use another --variant name (or delete $vdir)"
fi

# ---------------------------------------------------------------------------------------------------
# The plan: every env x seed; the ones with a done marker are skipped
# ---------------------------------------------------------------------------------------------------
todo_dirs=() todo_cmds=() todo_names=() n_skipped=0
for env in "${env_ids[@]}"; do
    for seed in "${seeds[@]}"; do
        dir="$vdir/${env//\//_}/seed$seed"
        if [ -f "$dir/done" ]; then
            n_skipped=$((n_skipped + 1))
            [ "$dry_run" -eq 0 ] || echo "# skip (done): $env seed $seed"
            continue
        fi
        cmd=("$python_abs" "$script_abs" --env-id "$env" --seed "$seed" --exp-name "$variant" --no-progress
            ${extra[@]+"${extra[@]}"})
        todo_dirs+=("$dir")
        quoted=$(printf '%q ' "${cmd[@]}")
        todo_cmds+=("${quoted% }")
        todo_names+=("$env seed $seed")
    done
done
n_total=$((${#env_ids[@]} * ${#seeds[@]}))
n_todo=${#todo_dirs[@]}
echo "$PROG: $script_name / $variant: $n_total runs, $n_skipped already done, $n_todo to run" >&2

record_sweep() {
    mkdir -p -- "$vdir"
    printf '%s' "$extra_quoted" >"$vdir/sweep_args"
    printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(printf '%q ' "$SWEEP_SH" "${ORIG_ARGS[@]}")" \
        >>"$vdir/sweeps.log"
}

# ---------------------------------------------------------------------------------------------------
# Slurm mode: one job array, each task runs `sweep.sh --_run-one DIR THREADS CMD...`
# ---------------------------------------------------------------------------------------------------
if [ "$slurm" -eq 1 ]; then
    if [ "$n_todo" -eq 0 ]; then echo "$PROG: nothing to submit" >&2; exit 0; fi
    [ "$dry_run" -eq 1 ] || command -v sbatch >/dev/null 2>&1 || die "sbatch not found (is Slurm installed here?)"
    job_name="sweep-$script_name-$variant"
    if [ "$dry_run" -eq 0 ]; then
        # Runs of a queued or running array have no done marker yet: submitting them again would run them twice.
        queued=$(squeue -h -u "$(id -un)" -n "$job_name" -o %A 2>/dev/null | sort -u | tr '\n' ' ')
        [ -z "$queued" ] || die "job(s) ${queued}of $job_name are still queued or running; wait for them" \
            "(squeue -n $job_name) or cancel them (scancel -n $job_name) before submitting the sweep again"
    fi
    sdir="$vdir/slurm"
    stamp=$(date +%Y%m%d-%H%M%S)-$$
    job_file="$sdir/array-$stamp.sh"
    [ -n "$slurm_output" ] || slurm_output="$sdir/%x-%A_%a.out"
    array="0-$((n_todo - 1))${slurm_max:+%$slurm_max}"
    sbatch_args=(--parsable --job-name "$job_name" --array "$array"
        --cpus-per-task "$slurm_cpus" --output "$slurm_output" --error "$slurm_output")
    [ -z "$slurm_time" ] || sbatch_args+=(--time "$slurm_time")
    [ -z "$slurm_partition" ] || sbatch_args+=(--partition "$slurm_partition")
    sbatch_args+=(${slurm_args[@]+"${slurm_args[@]}"})
    job_script=$(
        echo "#!/usr/bin/env bash"
        echo "# Written by sweep.sh: $script_name / $variant, one task per env x seed. Submitted with:"
        echo "#   sbatch $(printf '%q ' "${sbatch_args[@]}")$(printf %q "$job_file")"
        echo 'case "$SLURM_ARRAY_TASK_ID" in'
        for ((i = 0; i < n_todo; i++)); do
            echo "  $i)  # ${todo_names[$i]}"
            echo "    exec bash $(printf '%q ' "$SWEEP_SH" --_run-one "${todo_dirs[$i]}" "$slurm_cpus")${todo_cmds[$i]}"
            echo "    ;;"
        done
        echo '  *) echo "no task $SLURM_ARRAY_TASK_ID" >&2; exit 2;;'
        echo 'esac'
    )
    if [ "$dry_run" -eq 1 ]; then
        echo "$job_script"
        echo "# sbatch $(printf '%q ' "${sbatch_args[@]}")$job_file"
        exit 0
    fi
    mkdir -p -- "$sdir" "$(dirname "$slurm_output")" || die "cannot create $sdir"
    printf '%s\n' "$job_script" >"$job_file"
    record_sweep
    job_id=$(sbatch "${sbatch_args[@]}" "$job_file") || { echo "$PROG: sbatch failed" >&2; exit 1; }
    job_id=${job_id%%;*}
    echo "$PROG: submitted job array $job_id ($n_todo tasks); job script $job_file" >&2
    echo "$job_id"
    exit 0
fi

# ---------------------------------------------------------------------------------------------------
# Local mode: a pool of $jobs workers
# ---------------------------------------------------------------------------------------------------
if [ "$dry_run" -eq 1 ]; then
    for ((i = 0; i < n_todo; i++)); do
        printf 'cd %q && OMP_NUM_THREADS=1 %s\n' "${todo_dirs[$i]}" "${todo_cmds[$i]}"
    done
    exit 0
fi
[ "$n_todo" -gt 0 ] || exit 0

# One sweep of a variant at a time, so two sweeps never wipe each other's running runs.
mkdir -p -- "$vdir"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$vdir/.lock"
    flock -n 9 || die "another sweep of $script_name / $variant is running (lock $vdir/.lock)"
fi
record_sweep

pids=()
stop() {
    echo "$PROG: stopping; runs that did not finish will start over next time" >&2
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    wait
    exit 130
}
trap stop INT TERM

for ((i = 0; i < n_todo; i++)); do
    while [ "$(jobs -pr | wc -l)" -ge "$jobs" ]; do wait -n; done
    echo "$PROG: [$((i + 1))/$n_todo] start ${todo_names[$i]}"
    eval "run_one $(printf %q "${todo_dirs[$i]}") 1 ${todo_cmds[$i]}" &
    pids+=($!)
done
wait

# Report: every run without a done marker failed.
n_failed=0
for ((i = 0; i < n_todo; i++)); do
    if [ ! -f "${todo_dirs[$i]}/done" ]; then
        [ "$n_failed" -gt 0 ] || echo "$PROG: failed runs:" >&2
        n_failed=$((n_failed + 1))
        status=$(tail -n 1 "${todo_dirs[$i]}/log.txt" 2>/dev/null)
        echo "  ${todo_names[$i]}: ${status#\# } -- log: ${todo_dirs[$i]}/log.txt" >&2
    fi
done
echo "$PROG: $script_name / $variant: $((n_todo - n_failed)) finished, $n_skipped skipped (done before)," \
    "$n_failed failed" >&2
[ "$n_failed" -eq 0 ]
