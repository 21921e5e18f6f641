#!/usr/bin/env bash
# sweep.sh: run one training script over env ids x seeds, locally with parallel workers or as one Slurm
# job array. See usage() below, or run `benchmarks/sweep.sh --help`.
#
# Layout on disk (one directory per run; the training script runs with it as its working directory):
#
#   OUTDIR/SCRIPT/VARIANT/sweep_args          the extra arguments this variant was run with
#   OUTDIR/SCRIPT/VARIANT/sweeps.log          every sweep.sh command line that touched this variant
#   (the layout is written down once, in benchmarks/layout.py, which this script asks for its paths)
#   OUTDIR/SCRIPT/VARIANT/ENV/seedN/log.txt   stdout+stderr of the run; line 1 is the exact command
#   OUTDIR/SCRIPT/VARIANT/ENV/seedN/runs/...  the TensorBoard events the script writes
#   OUTDIR/SCRIPT/VARIANT/ENV/seedN/done      written only after the run exited 0
#
# Every run checkpoints (--save-model --checkpoint-minutes M) into its runs/RUN/checkpoint.pt. When the sweep
# is started again, a run with a `done` marker is skipped; a run without one but with a checkpoint (stopped,
# killed, preempted) continues from it with --resume, appending to its log.txt; a run without either (it never
# reached a checkpoint, or failed) is wiped and starts over. So a sweep stopped by Ctrl-C or SIGTERM (the runs
# checkpoint first), or killed outright with its node, is resumed by starting the same command again.
#
# Slurm mode: each array task is requeued at its time limit (--signal=B:USR1@SECS warns the batch shell, which
# stops the run with a checkpoint and runs `scontrol requeue`, if the run got past the step it started from)
# and on preemption or node failure (--requeue); the requeued task resumes from the checkpoint like a restarted
# local sweep. Each run holds a lock (.seedN.lock beside its folder) while it trains.

set -uo pipefail

ORIG_ARGS=("$@")
SWEEP_SH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
PROG=sweep.sh
LAYOUT="$(dirname "$SWEEP_SH")/layout.py"

usage() {
    cat <<'EOF'
Usage: benchmarks/sweep.sh -s SCRIPT -e ENV_IDS [options] [-- EXTRA_ARGS...]

Run SCRIPT once per env id and seed:
    python SCRIPT --env-id ENV --seed N --exp-name VARIANT --save-model --checkpoint-minutes M EXTRA_ARGS...
with OMP_NUM_THREADS=1, in OUTDIR/SCRIPT/VARIANT/ENV/seedN/ (its log.txt, runs/ and a done marker).
Start the same command again to resume a sweep that was stopped or killed: finished runs (done marker) are
skipped, unfinished runs with a checkpoint continue from it (--resume, noted in their log.txt), and runs
without a checkpoint start over. (This holds for a failed run too: delete its seedN/ folder to start it over.)

Options:
  -s, --script PATH         training script, e.g. ppo_discrete.py (required)
  -e, --env-ids IDS         env ids, comma- or space-separated; repeatable (required)
      --seeds LIST          explicit seeds, e.g. 1,2,3 (not together with --num-seeds/--seed-start)
  -n, --num-seeds N         number of seeds (default 3) ...
      --seed-start S        ... starting at S (default 1)
  -v, --variant NAME        name of this configuration, passed to the script as --exp-name (default: default);
                            letters, digits, '.', '_', '-', and no '__'. Use a new name for new EXTRA_ARGS.
  -o, --outdir DIR          root of the sweep output (default: benchmarks/sweeps next to this script)
  -j, --jobs N              local mode: runs at once (default: number of cores / --nproc-per-node)
      --python PY           interpreter (default: $PYTHON, else python)
      --nproc-per-node N    train each run on N processes with torchrun (default 1: plain python); for
                            scripts that support it (ppo_atari.py): N GPUs with --cuda, else N CPU processes
                            of one thread each. Locally, -j then counts runs, each of N processes; in Slurm
                            mode give each task the CPUs (--slurm-cpus) and GPUs (--slurm-arg=--gpus-per-task=N)
      --checkpoint-minutes M  each run writes a checkpoint every M minutes of wall time (default 5; 0: only
                            when stopped by a signal and at the end). It bounds what a run killed without
                            warning (SIGKILL, out of memory, a dead node) loses to about M minutes; a run
                            stopped by Ctrl-C or SIGTERM loses only its partial rollout. Writing one takes a
                            fraction of a second for these models.
      --dry-run             print the commands (or the Slurm job script) and run nothing
  -h, --help                this text

Slurm mode (one array task per env x seed that is not done yet; prints the job id and returns):
      --slurm               submit to Slurm with sbatch instead of running locally
      --slurm-max-parallel N  at most N tasks at once (--array=...%N; default: no limit)
      --slurm-cpus N        CPUs per task (default 1; OMP_NUM_THREADS is set to N / --nproc-per-node;
                            ppo_atari.py follows it, the two MLP scripts keep one torch thread unless given
                            --threads after --)
      --slurm-time T        time limit per task, e.g. 02:00:00 (default: the partition's)
      --slurm-signal-secs S Slurm warns each task S seconds before its time limit (default 120); the task
                            stops its run with a checkpoint and requeues itself, and the requeued task resumes
                            from it (not requeued if it finished no whole iteration: give it more time). S must
                            cover finishing an update and writing the checkpoint; Slurm may warn up to 60 s
                            early, so the time limit must exceed S + 60.
      --slurm-output PAT    stdout/stderr file of each task (default: OUTDIR/SCRIPT/VARIANT/slurm/%x-%A_%a.out)
      --slurm-partition P   partition to submit to
      --slurm-arg ARG       any other sbatch option, repeatable, e.g. --slurm-arg=--account=myproj
  OUTDIR must be on a file system that the compute nodes share. Tasks are submitted with --requeue, so a
  preempted task or one whose node fails is requeued by Slurm and resumes from its checkpoint too.

Extra arguments must not set what the sweep sets: --env-id, --seed, --exp-name, --resume, --eval-checkpoint,
--save-model, --checkpoint-minutes (use the sweep's options); --checkpoint-every N is fine.

Exit status: 0 if every run finished (or was already done), 1 if any failed (listed at the end with its
log), 2 on a usage error, 130 when stopped (Ctrl-C, SIGTERM: the signal is passed on to the runs, which write
a checkpoint and resume from it next time). Slurm mode: 0 once the array is submitted.

Examples:
  benchmarks/sweep.sh -s ppo_discrete.py -e CartPole-v1,Acrobot-v1,MountainCar-v0 -n 3
  benchmarks/sweep.sh -s ppo_discrete.py -e CartPole-v1 -n 3 -v noclip -- --no-clip-policy
  benchmarks/sweep.sh -s ppo_atari.py -e BreakoutNoFrameskip-v4 --seeds 1,2,3 --slurm \
      --slurm-cpus 8 --slurm-time 08:00:00 --slurm-max-parallel 6 -- --threads 8
  python benchmarks/compare.py benchmarks/sweeps      # tables and plots of what the sweeps wrote
EOF
}

die() { echo "$PROG: error: $*" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------------
# One run: run_one SEED_DIR THREADS CMD...   (a Slurm task runs it as `sweep.sh --_slurm-task ...`)
# ---------------------------------------------------------------------------------------------------
slurm_task=0
run_one() {
    local dir=$1 threads=$2
    shift 2
    [[ "$dir" =~ ^/.+/seed[0-9]+$ ]] || { echo "$PROG: refusing to use run directory '$dir'" >&2; return 2; }
    local log="$dir/log.txt" started rc pid stopping requeue ckpt="" from="" at="" lock python=$1
    # One process per run, whichever sweep started it (a local one, a Slurm task): a second would wipe the
    # run's folder or write into it. The lock file sits beside seedN/, which a fresh start wipes; the training
    # process inherits it, so it is held until the run has exited. A requeued Slurm task waits up to 2 min for
    # the lock of a node that died to lapse (NFSv4 leases do). Without flock (or one too old for -E), or where
    # the file system cannot lock at all, the run goes ahead unlocked.
    local lock_file="${dir%/*}/.${dir##*/}.lock" wait_lock=(-n)
    [ "$slurm_task" -eq 0 ] || wait_lock=(-w 120)
    if command -v flock >/dev/null 2>&1 && mkdir -p -- "${dir%/*}" && exec {lock}>"$lock_file"; then
        flock "${wait_lock[@]}" -E 75 "$lock" 2>/dev/null
        [ $? -ne 75 ] || { echo "$PROG: ${dir} is being run by another sweep; left to it (if none is, its lock" \
            "$lock_file is held by a node that died: delete that file)" >&2; return 3; }
    fi
    started=$(date +%s)
    # No done marker. A checkpoint means the run got somewhere before it was stopped or killed: continue it
    # (the script resumes in the checkpoint's own run folder). There is only one; the newest if ever more.
    IFS=$'\t' read -r ckpt from < <("$python" "$LAYOUT" checkpoint "$dir")
    if [ -n "$ckpt" ]; then
        set -- "$@" --resume "$ckpt"
        {
            printf '# resuming from %s (step %s)%s; started %s on %s\n' "$ckpt" "${from:-unknown}" \
                "${SLURM_RESTART_COUNT:+ (Slurm restart $SLURM_RESTART_COUNT)}" \
                "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(hostname)"
            printf '# cd %q && OMP_NUM_THREADS=%s' "$dir" "$threads"
            printf ' %q' "$@"
            printf '\n'
        } >>"$log"
    else
        # Whatever is here is from a run that never reached a checkpoint, or failed: start over.
        rm -rf -- "$dir"
        mkdir -p -- "$dir" || return 1
        {
            printf 'cd %q && OMP_NUM_THREADS=%s' "$dir" "$threads"
            printf ' %q' "$@"
            printf '\n# started %s on %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(hostname)"
        } >"$log"
    fi
    # Pass a stop request on to the training process, which then writes a checkpoint and exits. TERM, not
    # INT: after Ctrl-C the run has the terminal's SIGINT already, and a second SIGINT would exit at once.
    # USR1 is Slurm's warning before the time limit (--signal=B:USR1@SECS): stop, and requeue the task below.
    # torchrun passes TERM on to its workers, while USR1 would kill it outright: it gets TERM for both.
    local torchrun=0 warning=USR1 log_start
    if [[ " $* " == *" torch.distributed.run "* ]]; then
        torchrun=1 warning=TERM
    fi
    log_start=$(wc -c <"$log")  # where this process's output starts in the log
    pid="" stopping=0 requeue=0
    trap 'stopping=1; [ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null' TERM INT
    trap 'stopping=1 requeue=1; [ -z "$pid" ] || kill -$warning "$pid" 2>/dev/null' USR1
    (cd "$dir" && OMP_NUM_THREADS=$threads exec "$@") >>"$log" 2>&1 </dev/null &
    pid=$!
    [ "$stopping" -eq 0 ] || kill -TERM "$pid" 2>/dev/null
    while true; do
        wait "$pid"
        rc=$?
        kill -0 "$pid" 2>/dev/null || break
    done
    trap - TERM INT USR1
    local finished
    finished=$(date +%s)
    printf '# exit status %s after %s s\n' "$rc" "$((finished - started))" >>"$log"
    if [ "$rc" -eq 0 ]; then
        printf 'started %s\nfinished %s\nhost %s\n' "$started" "$finished" "$(hostname)" >"$dir/done.tmp" &&
            mv -f -- "$dir/done.tmp" "$dir/done"
        echo "$PROG: finished ${dir}  ($((finished - started)) s)"
    elif [ "$stopping" -eq 1 ]; then
        local next="it starts over next time"
        IFS=$'\t' read -r ckpt at < <("$python" "$LAYOUT" checkpoint "$dir")
        [ -z "$ckpt" ] || next="it resumes from its checkpoint next time"
        echo "$PROG: stopped  ${dir}${at:+ (checkpoint at step $at)}; $next"
        # Say in the log that the non-zero exit above is a stop, not a failure (a Slurm requeue note may follow),
        # and that a traceback of torchrun's own, raised when the stop signal reached it, is not an error.
        printf '# stopped%s; %s\n' "${at:+ with a checkpoint at step $at}" "$next" >>"$log"
        if [ "$torchrun" -eq 1 ] && grep -q 'SignalException: Process' < <(tail -c +$((log_start + 1)) -- "$log"); then
            echo "# (the traceback above is torchrun's answer to the stop signal, not an error)" >>"$log"
        fi
        # ---- Slurm: requeue a task that Slurm warned of its time limit; the requeued task resumes above.
        # (A preempted task is requeued by Slurm itself; a cancelled one, also sent TERM, must stay cancelled.)
        # Only if its checkpoint moved on: a task whose time runs out before one whole iteration would
        # otherwise be requeued for ever.
        if [ "$slurm_task" -eq 1 ] && [ "$requeue" -eq 1 ]; then
            local task="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
            if [ -n "$at" ] && [ "$at" -gt "${from:-0}" ]; then
                echo "$PROG: requeueing Slurm task $task"
                printf '# requeueing Slurm task %s\n' "$task" >>"$log"
                scontrol requeue "$task"
            else
                local why="not requeueing Slurm task $task: its time ran out at step ${from:-0}, where it started,"
                why+=" before one whole iteration; give it a longer --slurm-time"
                echo "$PROG: $why"
                printf '# %s\n' "$why" >>"$log"
            fi
        fi
        # ---- end Slurm
    else
        echo "$PROG: FAILED   ${dir}  (exit $rc; log: $log)"
    fi
    return "$rc"
}

if [ "${1:-}" = "--_slurm-task" ]; then
    shift
    slurm_task=1
    run_one "$@"
    exit $?
fi

# ---------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------
script="" env_ids=() seeds=() num_seeds=3 seed_start=1 variant=default outdir="" dry_run=0
seed_count_given=0 checkpoint_minutes=5
cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) jobs=""
python=${PYTHON:-python}
slurm=0 slurm_max="" slurm_cpus=1 slurm_time="" slurm_output="" slurm_partition="" slurm_args=()
slurm_signal_secs=120 nproc=1
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
        -n | --num-seeds) need "$@"; num_seeds=$2; seed_count_given=1; shift 2 ;;
        --seed-start) need "$@"; seed_start=$2; seed_count_given=1; shift 2 ;;
        -v | --variant) need "$@"; variant=$2; shift 2 ;;
        -o | --outdir) need "$@"; outdir=$2; shift 2 ;;
        -j | --jobs) need "$@"; jobs=$2; shift 2 ;;
        --python) need "$@"; python=$2; shift 2 ;;
        --nproc-per-node) need "$@"; nproc=$2; shift 2 ;;
        --checkpoint-minutes) need "$@"; checkpoint_minutes=$2; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        --slurm) slurm=1; shift ;;
        --slurm-max-parallel) need "$@"; slurm_max=$2; shift 2 ;;
        --slurm-cpus) need "$@"; slurm_cpus=$2; shift 2 ;;
        --slurm-time) need "$@"; slurm_time=$2; shift 2 ;;
        --slurm-signal-secs) need "$@"; slurm_signal_secs=$2; shift 2 ;;
        --slurm-output) need "$@"; slurm_output=$2; shift 2 ;;
        --slurm-partition) need "$@"; slurm_partition=$2; shift 2 ;;
        --slurm-arg) need "$@"; slurm_args+=("$2"); shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown option '$opt' (arguments for the training script go after --; see --help)" ;;
    esac
done

is_int() { [[ "$1" =~ ^[0-9]+$ ]]; }
# Seconds in a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); nothing for other forms.
slurm_seconds() {
    local t=$1 days=0 f=()
    if [[ "$t" == *-* ]]; then
        days=${t%%-*}
        IFS=: read -r -a f <<<"${t#*-}:0:0"
    else
        IFS=: read -r -a f <<<"$t"
        case ${#f[@]} in 1) f=(0 "${f[0]}" 0) ;; 2) f=(0 "${f[@]}") ;; esac
    fi
    [ ${#f[@]} -ge 3 ] && is_int "$days" && is_int "${f[0]}" && is_int "${f[1]}" && is_int "${f[2]}" || return 0
    echo $((((10#$days * 24 + 10#${f[0]}) * 60 + 10#${f[1]}) * 60 + 10#${f[2]}))
}
[ -n "$script" ] || die "--script is required (see --help)"
[ -f "$script" ] || die "no such script: $script"
[ ${#env_ids[@]} -gt 0 ] || die "--env-ids is required (see --help)"
[[ "$variant" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ && "$variant" != *__* ]] ||
    die "bad --variant '$variant': use letters, digits, '.', '_', '-' (no '__', which separates run-name fields)"
[ -z "$jobs" ] || { is_int "$jobs" && [ "$jobs" -ge 1 ]; } || die "--jobs must be a positive integer"
is_int "$slurm_cpus" && [ "$slurm_cpus" -ge 1 ] || die "--slurm-cpus must be a positive integer"
is_int "$nproc" && [ "$nproc" -ge 1 ] || die "--nproc-per-node must be a positive integer"
[ -n "$jobs" ] || jobs=$((cores / nproc > 0 ? cores / nproc : 1))  # each run has nproc processes of one thread
task_threads=$((slurm_cpus / nproc > 0 ? slurm_cpus / nproc : 1))  # a Slurm task's CPUs, shared by its processes
[ "$nproc" -eq 1 ] || grep -q WORLD_SIZE "$script" ||
    die "$script does not train under torchrun (only ppo_atari.py does): drop --nproc-per-node"
[[ "$checkpoint_minutes" =~ ^([0-9]+[.]?[0-9]*|[.][0-9]+)$ ]] ||
    die "--checkpoint-minutes must be a number >= 0 (0: checkpoints only when stopped and at the end)"
is_int "$slurm_signal_secs" && [ "$slurm_signal_secs" -ge 1 ] && [ "$slurm_signal_secs" -le 65535 ] ||
    die "--slurm-signal-secs must be an integer from 1 to 65535"
# A warning that comes before the task has started would stop and requeue it forever.
limit=$(slurm_seconds "$slurm_time")
[ -z "$limit" ] || [ "$limit" -gt $((slurm_signal_secs + 60)) ] ||
    die "--slurm-time $slurm_time leaves no time to run: Slurm may warn a task up to $((slurm_signal_secs + 60)) s" \
        "(--slurm-signal-secs $slurm_signal_secs, plus 60) before its time limit; give a longer --slurm-time or a" \
        "smaller --slurm-signal-secs"
[ -z "$slurm_max" ] || { is_int "$slurm_max" && [ "$slurm_max" -ge 1 ]; } ||
    die "--slurm-max-parallel must be a positive integer"
[ ${#seeds[@]} -eq 0 ] || [ "$seed_count_given" -eq 0 ] ||
    die "--seeds lists the seeds: do not also give --num-seeds or --seed-start"
if [ ${#seeds[@]} -eq 0 ]; then
    is_int "$num_seeds" && [ "$num_seeds" -ge 1 ] || die "--num-seeds must be a positive integer"
    is_int "$seed_start" || die "--seed-start must be a non-negative integer"
    for ((i = 0; i < num_seeds; i++)); do seeds+=($((seed_start + i))); done
fi
for s in "${seeds[@]}"; do is_int "$s" || die "bad seed '$s'"; done
for i in "${!seeds[@]}"; do seeds[i]=$((10#${seeds[i]})); done  # 010 is seed 10, not octal 8, nor another 10
# Two runs of the same env and seed would share one directory, each wiping the other's files.
dup=$(printf '%s\n' "${seeds[@]}" | sort | uniq -d | head -n 1)
[ -z "$dup" ] || die "seed $dup is given twice"
dup=$(printf '%s\n' "${env_ids[@]//\//_}" | sort | uniq -d | head -n 1)
[ -z "$dup" ] || die "env id $dup is given twice"
# The sweep sets these for every run (and resumes runs itself): the same flag after -- would fight it.
for arg in ${extra[@]+"${extra[@]}"}; do
    flag=${arg%%=*}
    case "${flag//_/-}" in
        --env-id) why="use -e/--env-ids" ;;
        --seed) why="use --seeds, or --num-seeds and --seed-start" ;;
        --exp-name) why="use -v/--variant" ;;
        --resume) why="the sweep resumes unfinished runs from their checkpoints itself" ;;
        --eval-checkpoint) why="a sweep trains; evaluate a checkpoint with the script itself" ;;
        --save-model | --no-save-model) why="every sweep run saves a checkpoint" ;;
        --checkpoint-minutes) why="use the sweep's own --checkpoint-minutes" ;;
        -h | --help) why="every run would print its help, exit 0 and be marked done" ;;
        *) continue ;;
    esac
    die "'$arg' after -- collides with what the sweep sets for each run: $why"
done
command -v "$python" >/dev/null 2>&1 || die "python interpreter not found: $python (use --python)"

script_abs="$(cd "$(dirname "$script")" && pwd)/$(basename "$script")"
script_name=$(basename "$script" .py)
[ -n "$outdir" ] || outdir="$(dirname "$SWEEP_SH")/sweeps"
mkdir -p -- "$outdir" || die "cannot create $outdir"
outdir="$(cd "$outdir" && pwd)"
# The interpreter itself (not a pyenv shim or alias), so the logged command and Slurm tasks use exactly it.
python_abs=$("$python" -c 'import sys; print(sys.executable)') || die "cannot run $python"
vdir=$("$python_abs" "$LAYOUT" variant-dir "$outdir" "$script_name" "$variant") || die "cannot run $LAYOUT"

# A variant is one configuration: refuse to mix runs made with different extra arguments under one name, unless
# none of its runs got anywhere (all failed before a checkpoint): then nothing of the old arguments is kept.
extra_quoted=""
[ ${#extra[@]} -eq 0 ] || extra_quoted=$(printf '%q ' "${extra[@]}")
if [ -f "$vdir/sweep_args" ] && [ "$(cat "$vdir/sweep_args")" != "$extra_quoted" ]; then
    "$python_abs" "$LAYOUT" has-progress "$vdir" &&
        die "variant '$variant' of $script_name was run with the extra arguments [$(cat "$vdir/sweep_args")], not" \
            "[$extra_quoted]; use another --variant name (or delete $vdir)"
    echo "$PROG: variant '$variant' was started with the extra arguments [$(cat "$vdir/sweep_args")], but none of" \
        "its runs finished or reached a checkpoint: its runs start again with [$extra_quoted]" >&2
fi

# ---------------------------------------------------------------------------------------------------
# The plan: every env x seed; the ones with a done marker are skipped
# ---------------------------------------------------------------------------------------------------
todo_dirs=() todo_cmds=() todo_names=() n_skipped=0 n_resume=0
plan=$("$python_abs" "$LAYOUT" seed-dirs "$outdir" "$script_name" "$variant" "$(IFS=,; echo "${env_ids[*]}")" \
    "$(IFS=,; echo "${seeds[*]}")") || die "cannot run $LAYOUT"
while IFS=$'\t' read -r env seed dir; do
    if [ -f "$dir/done" ]; then
        n_skipped=$((n_skipped + 1))
        [ "$dry_run" -eq 0 ] || echo "# skip (done): $env seed $seed"
        continue
    fi
    if [ -n "$("$python_abs" "$LAYOUT" checkpoint "$dir")" ]; then
        n_resume=$((n_resume + 1))
        [ "$dry_run" -eq 0 ] || echo "# resume from its checkpoint (--resume is added): $env seed $seed"
    fi
    launcher=("$python_abs")  # torchrun is `python -m torch.distributed.run`, of the same interpreter
    # After a stop signal torchrun kills its workers if they have not exited within --shutdown-timeout
    # (default 30 s): give them time to finish the update under way and write their checkpoint.
    [ "$nproc" -eq 1 ] ||
        launcher+=(-m torch.distributed.run --standalone --nproc-per-node "$nproc" --shutdown-timeout 300)
    cmd=("${launcher[@]}" "$script_abs" --env-id "$env" --seed "$seed" --exp-name "$variant"
        --save-model --checkpoint-minutes "$checkpoint_minutes" ${extra[@]+"${extra[@]}"})
    todo_dirs+=("$dir")
    quoted=$(printf '%q ' "${cmd[@]}")
    todo_cmds+=("${quoted% }")
    todo_names+=("$env seed $seed")
done <<<"$plan"
n_total=$((${#env_ids[@]} * ${#seeds[@]}))
n_todo=${#todo_dirs[@]}
echo "$PROG: $script_name / $variant: $n_total runs, $n_skipped already done, $n_todo to run" \
    "($n_resume from a checkpoint)" >&2

# The extra arguments as the script reads them (its own flag, value and range checks), checked once before any
# run and before the variant is recorded: a typo would otherwise fail every run, each with the same log line.
check_extra_args() {
    [ ${#extra[@]} -gt 0 ] && grep -q '^def check_flags' "$script_abs" || return 0  # these scripts, or a copy
    "$python_abs" - "$script_abs" "${extra[@]}" <<'PY' || exit 2
import importlib.util, sys
path, extra = sys.argv[1], sys.argv[2:]
spec = importlib.util.spec_from_file_location("checked_script", path)
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
sys.argv = [path, *extra]
script.check_flags(extra)
script.check_args(script.tyro.cli(script.Args, args=extra))
PY
}

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
        # (%F: the array's own id; %A would give each task that has started an id of its own.)
        queued=$(squeue -h -u "$(id -un)" -n "$job_name" -o %F 2>/dev/null | sort -u | tr '\n' ' ')
        [ -z "$queued" ] || die "job(s) ${queued}of $job_name are still queued or running; wait for them" \
            "(squeue -n $job_name) or cancel them (scancel -n $job_name) before submitting the sweep again"
    fi
    check_extra_args
    sdir="$vdir/slurm"
    stamp=$(date +%Y%m%d-%H%M%S)-$$
    job_file="$sdir/array-$stamp.sh"
    [ -n "$slurm_output" ] || slurm_output="$sdir/%x-%A_%a.out"
    array="0-$((n_todo - 1))${slurm_max:+%$slurm_max}"
    # --requeue: preemption and node failure requeue a task; --signal: warn its batch shell (run_one) before
    # the time limit, so it checkpoints and requeues itself; --open-mode=append: a requeued task adds to its
    # output file instead of truncating it.
    sbatch_args=(--parsable --job-name "$job_name" --array "$array"
        --cpus-per-task "$slurm_cpus" --output "$slurm_output" --error "$slurm_output"
        --requeue --signal "B:USR1@$slurm_signal_secs" --open-mode append)
    [ -z "$slurm_time" ] || sbatch_args+=(--time "$slurm_time")
    [ -z "$slurm_partition" ] || sbatch_args+=(--partition "$slurm_partition")
    sbatch_args+=(${slurm_args[@]+"${slurm_args[@]}"})
    job_script=$(
        echo "#!/usr/bin/env bash"
        echo "# Written by sweep.sh: $script_name / $variant, one task per env x seed; a requeued task resumes"
        echo "# its run from its checkpoint. Submitted with:"
        echo "#   sbatch $(printf '%q ' "${sbatch_args[@]}")$(printf %q "$job_file")"
        echo 'case "$SLURM_ARRAY_TASK_ID" in'
        for ((i = 0; i < n_todo; i++)); do
            echo "  $i)  # ${todo_names[$i]}"
            echo "    exec bash $(printf '%q ' "$SWEEP_SH" --_slurm-task "${todo_dirs[$i]}" "$task_threads")${todo_cmds[$i]}"
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
[ "$n_todo" -eq 0 ] || check_extra_args
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
    echo "$PROG: stopping: the runs are writing checkpoints; start the same sweep again to resume them" >&2
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

# Report: every run without a done marker failed, but for those another sweep is running (it holds their lock).
held_elsewhere() {
    local f="${1%/*}/.${1##*/}.lock" rc
    command -v flock >/dev/null 2>&1 && [ -f "$f" ] || return 1
    flock -n -E 75 "$f" true 2>/dev/null
    rc=$?
    [ "$rc" -eq 75 ]
}
n_failed=0 n_elsewhere=0
for ((i = 0; i < n_todo; i++)); do
    if [ -f "${todo_dirs[$i]}/done" ]; then
        continue
    elif held_elsewhere "${todo_dirs[$i]}"; then
        echo "$PROG: ${todo_names[$i]} is left to the sweep that is running it" >&2
        n_elsewhere=$((n_elsewhere + 1))
    else
        [ "$n_failed" -gt 0 ] || echo "$PROG: failed runs:" >&2
        n_failed=$((n_failed + 1))
        status=$(tail -n 1 "${todo_dirs[$i]}/log.txt" 2>/dev/null)
        echo "  ${todo_names[$i]}: ${status#\# } -- log: ${todo_dirs[$i]}/log.txt" >&2
    fi
done
elsewhere=""
[ "$n_elsewhere" -eq 0 ] || elsewhere=" $n_elsewhere left to another sweep,"
echo "$PROG: $script_name / $variant: $((n_todo - n_failed - n_elsewhere)) finished, $n_skipped skipped (done" \
    "before),$elsewhere $n_failed failed" >&2
[ "$n_failed" -eq 0 ] && [ "$n_elsewhere" -eq 0 ]
