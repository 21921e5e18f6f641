"""Tune a PPO script's settings over seeds, on Optuna: trials of the real script, pruned while they train.

    python benchmarks/tune.py -s ppo_discrete.py -e CartPole-v1,Acrobot-v1 --trials 30 \\
        --space learning_rate=log:1e-4:3e-3 --space ent_coef=0:0.05 --space num_minibatches=2,4,8 \\
        -- --total-timesteps 100000
    python benchmarks/tune.py -s ppo_discrete.py -e CartPole-v1,Acrobot-v1 --trials 30 ...   # again: it resumes
    python benchmarks/tune.py --study benchmarks/tunes/NAME --report                        # the report so far

A trial is one draw of the settings in the search space, run through benchmarks/sweep.sh as the variant
`trial-NNNN` of the script, on every env and seed given (default seeds 1,2,3: every trial sees the same seeds,
the unit of replication), with the arguments after `--` added to every run. The script runs unchanged, as a user
runs it. A run's score is the project's figure everywhere: the mean of its last 100 training episodes. Each env's
score is normalised by its bounds, (score - low) / (high - low), so that envs of different scales count alike:
--bounds ENV=LOW:HIGH, or, for an env not given, a random policy's score (100 episodes, measured once) for LOW
and CleanRL's published figure for HIGH where there is one. A trial's value is the mean over envs of the mean
over seeds of the normalised scores (--objective iqm: the interquartile mean over all its runs).

Pruning inside runs. A trial's runs train side by side (-j, default: all of them at once); their events are read
while they train, and at every tenth of the budget (--rungs) that all of them have passed, the trial reports its
value so far (each run's last-100 mean up to that step) to the pruner (median by default: stop a trial worse
than the median of the earlier ones at the same rung, once --startup-trials trials have finished, from rung
--warmup-rungs on). A pruned trial's runs are stopped with a checkpoint; what they reached is kept, and
labelled, in the report. With -j below the runs of a trial, the first rung waits for the last runs to start, so
pruning comes later in the trial. A trial one of whose runs fails is stopped and counted as failed; after
MAX_FAILURES failed trials in a row the worker gives up.

What a study survives. Its storage is a file (Optuna's journal, OUTDIR/NAME/journal.log), its runs are a sweep
(OUTDIR/NAME/sweeps/, which benchmarks/compare.py reads as it is). Several workers, started alike on one machine
or on several that share the folder (--slurm-workers W submits W as a Slurm job array), share one study. A
worker that is stopped (Ctrl-C, SIGTERM, Slurm's warning before its time limit) stops its trial's runs with
checkpoints and leaves the trial running; a worker that is killed leaves it so too. The next worker to start
takes such a trial up (each trial is locked by the worker running it), resumes its runs from their checkpoints,
and finishes it: a cut trial is resumed, not counted as failed.

Written to OUTDIR/NAME/report/ after every trial (and with --report): report.md (the best settings with their
per-seed scores, every trial as a table, the command for a confirmation run on fresh seeds with
benchmarks/sweep.sh), history.png (Optuna's optimisation history) and importances.png (the settings'
importances).

Search space, one --space per setting (or one per line in --space-file; '#' starts a comment):
    name=LOW:HIGH         uniform float          learning_rate=log:1e-4:1e-2    log-uniform float
    name=int:LOW:HIGH     integer                num_minibatches=int:log:2:32   log-uniform integer
    name=A,B,C            one of these values    norm_adv=true,false            a switch
Bad input (an unknown setting, an empty range, a value the script refuses) stops with one line before any
trial starts.
"""

import argparse
import contextlib
import fcntl
import importlib.util
import io
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layout  # noqa: E402  (where benchmarks/sweep.sh puts each run)

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "benchmarks" / "sweep.sh"
WINDOW = 100  # episodes in a run's score
PROG = "tune.py"


class TuneError(Exception):
    """Bad input: main() prints it as one line and stops before any trial."""


def say(msg):
    print(f"{PROG}: {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# The search space
# ----------------------------------------------------------------------------------------------

NUMBER = r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?"


def parse_setting(spec, fields_by_name):
    """'learning_rate=log:1e-4:1e-2' -> {"name", "kind", "low", "high", "log"} or {"name", "kind": "choice",
    "values"}, checked against the script's settings (fields_by_name: name -> bool, int, float or str)."""
    if "=" not in spec:
        raise TuneError(f"--space {spec!r}: expected NAME=RANGE (e.g. learning_rate=log:1e-4:1e-2)")
    name, rng = (part.strip() for part in spec.split("=", 1))
    name = name.lstrip("-").replace("-", "_")
    if name not in fields_by_name:
        raise TuneError(f"--space {spec!r}: the script has no setting {name!r}")
    kind = fields_by_name[name]
    parts = [p.strip() for p in rng.split(":")]
    if len(parts) > 1:  # a range: [int|float:][log:]LOW:HIGH
        words = [p for p in parts[:-2] if p in ("int", "float", "log")]
        number = "int" if "int" in words else "float" if "float" in words else ("int" if kind is int else "float")
        log = "log" in words
        if len(words) != len(parts) - 2 or not all(re.fullmatch(NUMBER, p) for p in parts[-2:]):
            raise TuneError(f"--space {spec!r}: a range is [int:|float:][log:]LOW:HIGH, with numbers")
        if kind not in (int, float) or (number == "int") != (kind is int):
            raise TuneError(f"--space {spec!r}: {name} is a{'n' if kind is int else ''} "
                            f"{kind.__name__} setting" + (": its values are true,false" if kind is bool else ""))
        low, high = float(parts[-2]), float(parts[-1])
        if number == "int" and not (low.is_integer() and high.is_integer()):
            raise TuneError(f"--space {spec!r}: an integer range needs integer bounds")
        if not low < high:
            raise TuneError(f"--space {spec!r}: the range is empty (LOW must be below HIGH)")
        if log and low <= 0:
            raise TuneError(f"--space {spec!r}: a log range must be above 0")
        return {"name": name, "kind": number, "low": int(low) if number == "int" else low,
                "high": int(high) if number == "int" else high, "log": log}
    values = [v.strip() for v in rng.split(",") if v.strip()]
    if len(values) < 2:
        raise TuneError(f"--space {spec!r}: give a range LOW:HIGH or at least two values A,B")
    if kind is bool:
        if not set(v.lower() for v in values) <= {"true", "false"}:
            raise TuneError(f"--space {spec!r}: {name} is a switch: its values are true,false")
        values = [v.lower() == "true" for v in values]
    elif kind in (int, float):
        if not all(re.fullmatch(NUMBER, v) for v in values):
            raise TuneError(f"--space {spec!r}: {name} takes finite numbers")
        values = [float(v) for v in values]
        if kind is int:
            if not all(v.is_integer() for v in values):
                raise TuneError(f"--space {spec!r}: {name} takes integers")
            values = [int(v) for v in values]
    if len(set(values)) != len(values):
        raise TuneError(f"--space {spec!r}: a value is given twice")
    return {"name": name, "kind": "choice", "values": values}


def suggest(trial, setting):
    if setting["kind"] == "int":
        return trial.suggest_int(setting["name"], setting["low"], setting["high"], log=setting["log"])
    if setting["kind"] == "float":
        return trial.suggest_float(setting["name"], setting["low"], setting["high"], log=setting["log"])
    return trial.suggest_categorical(setting["name"], setting["values"])


def to_flags(params):
    """Settings as the script's flags: --name value, and --name / --no-name for a switch."""
    flags = []
    for name, value in params.items():
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            flags += [f"--{flag}", repr(value) if isinstance(value, float) else str(value)]
    return flags


def extremes(space):
    """Settings at the ends of every range (and every listed value): what the script must accept."""
    longest = max((len(s["values"]) for s in space if s["kind"] == "choice"), default=2)
    corners = [{} for _ in range(max(2, longest))]
    for s in space:
        ends = s["values"] if s["kind"] == "choice" else [s["low"], s["high"]]
        for i, corner in enumerate(corners):
            corner[s["name"]] = ends[min(i, len(ends) - 1)]
    return corners


def load_script(path):
    spec = importlib.util.spec_from_file_location("tuned_script", path)
    module = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stderr(io.StringIO()):  # its import-time warnings are not ours to show
        spec.loader.exec_module(module)
    return module


def script_settings(module, argv):
    """The script's own reading of a command line (its flag and range checks); TuneError with its error line."""
    err = io.StringIO()
    saved = sys.argv
    try:
        sys.argv = ["script", *argv]
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if hasattr(module, "check_flags"):
                module.check_flags(argv)
            args = module.tyro.cli(module.Args, args=argv)
            module.check_args(args)
        return args
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        raise TuneError(f"the script refuses `{shlex.join(argv)}`: {lines[-1] if lines else 'it exited'}") from None
    finally:
        sys.argv = saved


# ----------------------------------------------------------------------------------------------
# Scores, read from the runs' events while they train
# ----------------------------------------------------------------------------------------------


def read_returns(run_dir):
    """(steps, returns, last step logged) of a run so far, read as compare.py reads a finished run (a resumed
    run's redone steps count once). A run folder that a restarted sweep wipes while it is read has no returns."""
    from compare import load_events

    try:
        episodes, sps, *_ = load_events(Path(run_dir))
    except OSError:
        episodes, sps = [], []
    steps = np.array([e.step for e in episodes], dtype=np.int64)
    returns = np.array([e.value for e in episodes], dtype=float)
    return steps, returns, max([series[-1].step for series in (episodes, sps) if series], default=0)


def score_at(steps, returns, step):
    """A run's score up to `step`: the mean of its last WINDOW episodes by then (nan before its first)."""
    upto = returns[steps <= step]
    return float(np.mean(upto[-WINDOW:])) if upto.size else math.nan


def iqm(x):
    x = np.sort(np.asarray(x, dtype=float))
    cut = int(np.floor(0.25 * len(x)))
    return float(np.mean(x[cut:len(x) - cut] if len(x) > 2 * cut else x))


class Study:
    """One study: its folder, its definition, its Optuna study."""

    def __init__(self, folder, definition=None, fresh=False):
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.folder = Path(folder)
        self.file = self.folder / "study.json"
        if definition is None:
            if not self.file.is_file():
                raise TuneError(f"{self.folder} is not a study (no study.json in it)")
            definition = json.loads(self.file.read_text())
        self.d = definition
        self.sweeps = self.folder / "sweeps"
        self.script_name = Path(self.d["script"]).stem
        self.runs = [(env, seed) for env in self.d["envs"] for seed in self.d["seeds"]]
        journal = str(self.folder / "journal.log")
        self.storage = JournalStorage(JournalFileBackend(journal, lock_obj=JournalFileOpenLock(journal)))
        pruner = self.d["pruner"]
        if pruner == "median":
            pruner = optuna.pruners.MedianPruner(n_startup_trials=self.d["startup_trials"],
                                                 n_warmup_steps=self.d["warmup_rungs"])
        elif pruner == "none":
            pruner = optuna.pruners.NopPruner()
        else:  # threshold:LOW
            pruner = optuna.pruners.ThresholdPruner(lower=float(pruner.split(":", 1)[1]),
                                                    n_warmup_steps=self.d["warmup_rungs"])
        # The worker that creates the study draws from --sampler-seed, so a study run by one worker reproduces;
        # a worker joining it, or starting it again, draws from a seed of its own (else it would repeat the draws).
        seed = self.d["sampler_seed"]
        if not fresh:
            seed = int(np.random.SeedSequence([seed, os.getpid(), int(time.time() * 1e6)]).generate_state(1)[0])
        sampler = (optuna.samplers.RandomSampler(seed=seed) if self.d["sampler"] == "random" else
                   optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.d["startup_trials"]))
        self.optuna = optuna.create_study(study_name="study", storage=self.storage, direction="maximize",
                                          pruner=pruner, sampler=sampler, load_if_exists=True)

    def variant(self, number):
        return f"trial-{number:04d}"

    def run_dir(self, number, env, seed):
        """The events folder of one run of a trial (None before the run has started)."""
        found = sorted(layout.seed_dir(self.sweeps, self.script_name, self.variant(number), env, seed).glob("runs/*"))
        return found[-1] if found else None

    def normalise(self, env, score):
        low, high = self.d["bounds"][env]
        return (score - low) / (high - low)

    def value(self, scores):
        """A trial's value from {(env, seed): raw score}: the mean over envs of the mean over seeds of the
        normalised scores, or their IQM over all runs."""
        norm = {k: self.normalise(k[0], s) for k, s in scores.items()}
        if self.d["objective"] == "iqm":
            return iqm(list(norm.values()))
        return float(np.mean([np.mean([norm[(env, seed)] for seed in self.d["seeds"]]) for env in self.d["envs"]]))

    def progress(self, number):
        """{(env, seed): (steps, returns, last step)} of a trial's runs so far (runs not started are left out)."""
        out = {}
        for env, seed in self.runs:
            d = self.run_dir(number, env, seed)
            if d is not None:
                out[(env, seed)] = read_returns(d)
        return out


# ----------------------------------------------------------------------------------------------
# A worker: trials one after another, until the study has enough
# ----------------------------------------------------------------------------------------------


class Stop(Exception):
    pass


MAX_FAILURES = 3  # failed trials in a row after which a worker gives up: something fails every configuration


if sys.platform.startswith("linux"):
    import ctypes

    LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: a forked child should not load libraries
else:
    LIBC = None


def die_with_parent(parent=os.getpid()):
    """In the sweep's process, before it starts: be sent SIGTERM when the worker that started it dies (and not
    start at all if it died already)."""
    if LIBC is not None:
        LIBC.prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)


class Worker:
    def __init__(self, study, trials, poll_seconds):
        self.study, self.trials, self.poll = study, trials, poll_seconds
        self.sweep = None
        self.stopping = None  # the signal that asked us to stop
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum, frame):
        self.stopping = signal.Signals(signum).name
        self.stop_sweep()

    def stop_sweep(self):
        """TERM to the sweep, which stops its runs, each with a checkpoint (nothing if it has exited)."""
        if self.sweep is not None and self.sweep.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.sweep.pid, signal.SIGTERM)

    def finished_trials(self):
        import optuna

        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        return sum(t.state in done for t in self.study.optuna.get_trials(deepcopy=False))

    def lock(self, number):
        """The trial's lock, or None if another worker holds it. Held until this worker exits or lets it go."""
        f = open(self.study.folder / f".{self.study.variant(number)}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return None
        # Kept on a descriptor above 9: sweep.sh uses 9 for its own lock, and the sweep inherits this one.
        high = os.fdopen(fcntl.fcntl(f.fileno(), fcntl.F_DUPFD, 20), "w")
        f.close()
        return high

    def next_trial(self):
        """(trial, lock): a trial cut short by a stopped or killed worker first, else a new one."""
        import optuna

        for t in self.study.optuna.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            lock = self.lock(t.number)
            if lock is not None:
                say(f"trial {t.number} was cut short; resuming it")
                return optuna.trial.Trial(self.study.optuna, t._trial_id), lock
        while True:
            trial = self.study.optuna.ask()
            lock = self.lock(trial.number)
            if lock is not None:
                return trial, lock

    def run(self):
        failures = 0
        while self.stopping is None and self.finished_trials() < self.trials:
            trial, lock = self.next_trial()
            try:
                failures = 0 if self.run_trial(trial, lock) else failures + 1
            except Stop:
                say(f"stopped by {self.stopping}: trial {trial.number}'s runs wrote checkpoints; the next worker "
                    "to start resumes it")
                return self.stopped()
            finally:
                lock.close()
            write_report(self.study)
            if failures == MAX_FAILURES:
                say(f"error: {failures} trials in a row failed; stopping (their logs: {self.study.folder / 'logs'})")
                return 1
        if self.stopping:
            say(f"stopped by {self.stopping} between trials")
            return self.stopped()
        say(f"the study has {self.finished_trials()} finished trials (asked for {self.trials}); report in "
            f"{self.study.folder / 'report' / 'report.md'}")
        return 0

    def stopped(self):
        if self.stopping == "SIGUSR1" and "SLURM_ARRAY_JOB_ID" in os.environ:  # Slurm's warning of its time limit
            task = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"
            say(f"requeueing Slurm task {task}")
            subprocess.run(["scontrol", "requeue", task])
        return 130

    def run_trial(self, trial, lock):
        import optuna

        s, d = self.study, self.study.d
        params = {setting["name"]: suggest(trial, setting) for setting in d["space"]}
        flags = to_flags(params)
        trial.set_user_attr("flags", shlex.join(flags))
        variant = s.variant(trial.number)
        say(f"trial {trial.number}: {shlex.join(flags)}")
        log = s.folder / "logs" / f"{variant}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["bash", str(SWEEP), "-s", str(REPO / d["script"]), "-e", ",".join(d["envs"]), "--seeds",
               ",".join(map(str, d["seeds"])), "-v", variant, "-o", str(s.sweeps), "-j", str(d["jobs"]),
               "--python", sys.executable, "--", *d["extra"], *flags]
        # The sweep runs in a session of its own (a Ctrl-C reaches only this worker, which passes on one TERM);
        # it inherits the trial's lock, which its runs hold until they have exited; and if this worker dies
        # (killed outright), the sweep is sent TERM, so its runs stop with a checkpoint rather than run on.
        with open(log, "a") as out:
            self.sweep = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, pass_fds=(lock.fileno(),),
                                          preexec_fn=die_with_parent)
        if self.stopping:
            self.stop_sweep()
        rungs = [round(d["total_timesteps"] * k / d["rungs"]) for k in range(1, d["rungs"] + 1)]
        reported = set(s.optuna.get_trials(deepcopy=False)[trial.number].intermediate_values)  # a resumed trial's
        pruned_at, failed_run = None, None
        while True:
            finished = self.sweep.poll() is not None
            progress = s.progress(trial.number)
            failed_run = failed_run or next((key for key in s.runs if self.run_failed(trial.number, key)), None)
            for k, step in enumerate(rungs, 1):
                if k in reported or len(progress) < len(s.runs) or failed_run:
                    continue
                if not all(last >= step or self.run_done(trial.number, key) for key, (_, _, last) in progress.items()):
                    break
                scores = {key: score_at(st, r, step) for key, (st, r, _) in progress.items()}
                if any(math.isnan(v) for v in scores.values()):
                    continue  # a run without an episode by then: this rung says nothing
                trial.report(s.value(scores), k)
                reported.add(k)
                done = finished or all(self.run_done(trial.number, key) for key in s.runs)
                if k < d["rungs"] and not done and trial.should_prune():
                    pruned_at = k
                    break
            if pruned_at is not None or (failed_run and not self.stopping):
                self.stop_sweep()  # pruned, or a run failed: the trial ends here
                self.sweep.wait()
                break
            if finished:
                break
            time.sleep(self.poll)
        rc, self.sweep = self.sweep.returncode, None
        if rc == 130 and not (self.stopping or pruned_at or failed_run):  # stopped from outside (Slurm signals all)
            self.stopping = "a stop of its sweep"
        progress = s.progress(trial.number)
        runs = {}
        for (env, seed), (st, r, last) in progress.items():
            score = score_at(st, r, last) if r.size else math.nan
            runs[f"{env} seed {seed}"] = {"score": score, "normalised": s.normalise(env, score), "steps": int(last),
                                          "finished": self.run_done(trial.number, (env, seed))}
        trial.set_user_attr("runs", runs)
        if pruned_at is not None:
            trial.set_user_attr("pruned_at", f"rung {pruned_at} of {d['rungs']} (step {rungs[pruned_at - 1]})")
            s.optuna.tell(trial.number, state=optuna.trial.TrialState.PRUNED)
            say(f"trial {trial.number}: pruned at rung {pruned_at} of {d['rungs']}")
            return True
        if self.stopping and not failed_run:
            raise Stop()
        value = (s.value({(env, seed): runs[f"{env} seed {seed}"]["score"] for env, seed in s.runs})
                 if len(runs) == len(s.runs) else math.nan)
        if failed_run or rc != 0 or not all(v["finished"] for v in runs.values()) or not math.isfinite(value):
            why = (f"{failed_run[0]} seed {failed_run[1]} failed" if failed_run else
                   f"sweep exit {rc}" if rc != 0 else "a run logged no episode")
            trial.set_user_attr("failed", f"{why}; the sweep's output: {log}")
            s.optuna.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            say(f"trial {trial.number}: FAILED ({why}; log {log})")
            return False
        s.optuna.tell(trial.number, value)
        say(f"trial {trial.number}: {value:.4f}")
        return True

    def run_failed(self, number, key):
        """Whether a run of the trial exited with an error (not stopped: 130 and 143 are stops), not to be retried."""
        d = layout.seed_dir(self.study.sweeps, self.study.script_name, self.study.variant(number), *key)
        try:
            lines = [line for line in (d / "log.txt").read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return False
        m = re.fullmatch(r"# exit status (\d+) after \d+ s", lines[-1]) if lines else None
        return m is not None and int(m[1]) not in (0, 130, 143) and not layout.is_done(d)

    def run_done(self, number, key):
        env, seed = key
        return layout.is_done(layout.seed_dir(self.study.sweeps, self.study.script_name, self.study.variant(number),
                                              env, seed))


# ----------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------


def fmt(x, digits=2):
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def write_report(study):
    import optuna

    s, d = study, study.d
    out = s.folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    trials = s.optuna.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    lines = ["# Tuning study", "",
             f"`{Path(d['script']).name}` on {', '.join(d['envs'])}; seeds {', '.join(map(str, d['seeds']))} "
             f"(every trial); {d['total_timesteps']} steps a run; extra arguments `{shlex.join(d['extra'])}`.", "",
             f"A run's score: the mean of its last {WINDOW} training episodes; normalised per env as "
             "(score - low) / (high - low) with " + "; ".join(f"{env} [{lo:g}, {hi:g}] ({d['bounds_from'][env]})"
                                                              for env, (lo, hi) in d["bounds"].items()) + ". "
             + ("A trial's value: the IQM of its runs' normalised scores." if d["objective"] == "iqm" else
                "A trial's value: the mean over envs of the mean over seeds of the normalised scores."), "",
             "Search space: " + ", ".join(f"`{spec}`" for spec in d["space_specs"]) + f". Sampler: {d['sampler']} "
             f"(seed {d['sampler_seed']}); pruner: {d['pruner']} (once {d['startup_trials']} trials have finished, "
             f"from rung {d['warmup_rungs']} on; a rung is {1 / d['rungs']:.0%} of the budget).", "",
             f"Trials: {len(trials)} ({len(complete)} complete, "
             f"{sum(t.state == optuna.trial.TrialState.PRUNED for t in trials)} pruned, "
             f"{sum(t.state == optuna.trial.TrialState.FAIL for t in trials)} failed, "
             f"{sum(t.state == optuna.trial.TrialState.RUNNING for t in trials)} running or cut short).", ""]
    if complete:
        best = max(complete, key=lambda t: t.value)
        lines += [f"## Best: trial {best.number}, value {best.value:.4f}", "",
                  f"Settings: `{best.user_attrs.get('flags', '')}`", "",
                  "| env | seed | score | normalised |", "|---|---|---|---|"]
        for key, run in best.user_attrs.get("runs", {}).items():
            env, seed = key.rsplit(" seed ", 1)
            lines.append(f"| {env} | {seed} | {fmt(run['score'])} | {fmt(run['normalised'], 3)} |")
        fresh = ",".join(str(max(d["seeds"]) + i) for i in range(1, 6))
        base = ["benchmarks/sweep.sh", "-s", d["script"], "-e", ",".join(d["envs"]), "--seeds", fresh,
                "-o", "benchmarks/sweeps"]
        lines += ["", "Confirm on fresh seeds against the defaults, then compare:", "", "```bash",
                  shlex.join(base + ["-v", f"tuned-trial-{best.number}", "--", *d["extra"],
                                     *shlex.split(best.user_attrs.get("flags", ""))]),
                  shlex.join(base + ["-v", "default", "--", *d["extra"]]),
                  f"python benchmarks/compare.py benchmarks/sweeps/{Path(d['script']).stem} --baseline default",
                  "```", ""]
    names = [setting["name"] for setting in d["space"]]
    lines += ["## Trials", "", "| trial | state | value | " + " | ".join(names) + " | "
              + " | ".join(f"{env} (mean score)" for env in d["envs"]) + " | note |",
              "|---|---|---|" + "---|" * (len(names) + len(d["envs"]) + 1)]
    for t in trials:
        runs = t.user_attrs.get("runs", {})
        per_env = []
        for env in d["envs"]:
            scores = [r["score"] for k, r in runs.items() if k.rsplit(" seed ", 1)[0] == env]
            per_env.append(fmt(float(np.mean(scores))) if scores and all(np.isfinite(scores)) else "")
        note = ("pruned at " + t.user_attrs["pruned_at"] + "; scores as far as its runs got"
                if "pruned_at" in t.user_attrs else t.user_attrs.get("failed", ""))
        lines.append(f"| {t.number} | {t.state.name.lower()} | {fmt(t.value, 4) if t.value is not None else ''} | "
                     + " | ".join(str(t.params.get(n, "")) for n in names) + " | " + " | ".join(per_env)
                     + f" | {note} |")
    lines.append("")
    lines += plots(s, out, complete)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return out / "report.md"


def plots(study, out, complete):
    import matplotlib

    matplotlib.use("Agg")
    import warnings

    import matplotlib.pyplot as plt
    from optuna.visualization.matplotlib import plot_optimization_history, plot_param_importances

    lines = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib backend experimental
        if complete:
            ax = plot_optimization_history(study.optuna)
            ax.figure.savefig(out / "history.png", dpi=100, bbox_inches="tight")
            plt.close(ax.figure)
            lines += ["![optimisation history](history.png)", ""]
        varied = [n for n in {k for t in complete for k in t.params} if len({t.params.get(n) for t in complete}) > 1]
        if len(complete) >= 2 and varied:
            try:
                ax = plot_param_importances(study.optuna)
                ax.figure.savefig(out / "importances.png", dpi=100, bbox_inches="tight")
                plt.close(ax.figure)
                lines += ["![importances of the settings (fANOVA)](importances.png)", ""]
            except Exception as e:  # too few or too alike trials for fANOVA
                lines += [f"No importances yet: {type(e).__name__}: {e}", ""]
        else:
            lines += ["No importances yet: they need two complete trials whose settings differ.", ""]
    return lines


# ----------------------------------------------------------------------------------------------
# Setting a study up, and main()
# ----------------------------------------------------------------------------------------------


def measured_bounds(env):
    """(low, high, where from) of an env: a random policy's score and CleanRL's published figure."""
    import compare
    import random_policy

    published = compare.PUBLISHED.get(env, {}).get("CleanRL")
    if published is None:
        raise TuneError(f"no bounds for {env}: give --bounds {env}=LOW:HIGH (LOW: a random policy's score, "
                        "HIGH: a target)")
    low = float(np.mean(random_policy.random_returns(env, 100)))
    if not low < published[0]:  # MountainCar: a random policy already scores what CleanRL published
        raise TuneError(f"no bounds for {env}: a random policy scores {low:g}, not below CleanRL's {published[0]:g}; "
                        f"give --bounds {env}=LOW:HIGH")
    return low, published[0], "low: a random policy, 100 episodes; high: CleanRL's published figure"


def define(args, extra):
    """The study's definition from the command line, checked: TuneError before anything is written."""
    if not args.script or not args.env_ids:
        raise TuneError("a new study needs -s SCRIPT and -e ENV[,ENV...]")
    script = Path(args.script).resolve()
    if not script.is_file():
        raise TuneError(f"no such script: {args.script}")
    envs = [e for e in args.env_ids.split(",") if e]
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise TuneError(f"--seeds {args.seeds!r}: expected integers like 1,2,3") from None
    if len(set(seeds)) != len(seeds) or len(set(envs)) != len(envs):
        raise TuneError("an env or a seed is given twice")
    specs = list(args.space or [])
    if args.space_file:
        try:
            text = Path(args.space_file).read_text()
        except OSError as e:
            raise TuneError(f"--space-file: {e}") from None
        specs += [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]
    if not specs:
        raise TuneError("no search space: give --space NAME=RANGE (or --space-file)")
    module = load_script(script)
    kinds = {f.name: (bool if f.type in (bool, "bool") else int if f.type in (int, "int") else
                      float if f.type in (float, "float") or "float" in str(f.type) else str)
             for f in fields(module.Args)}
    space = [parse_setting(spec, kinds) for spec in specs]
    names = [s["name"] for s in space]
    if len(set(names)) != len(names):
        raise TuneError("a setting is given twice in the search space")
    for name in names:
        # The budget is the study's (its rungs are tenths of it), not a setting to draw.
        if (name in ("env_id", "seed", "exp_name", "total_timesteps")
                or name not in getattr(module, "HYPERPARAMETERS", names)):
            raise TuneError(f"{name} is not a hyperparameter of {script.name}: it cannot be tuned")
    fixed = script_settings(module, list(extra))
    for corner in extremes(space):
        script_settings(module, list(extra) + to_flags(corner))
    if (args.rungs < 1 or args.trials < 1 or args.startup_trials < 0 or args.warmup_rungs < 0
            or (args.jobs is not None and args.jobs < 1)):
        raise TuneError("--trials, --rungs and --jobs must be at least 1, --startup-trials and --warmup-rungs at "
                        "least 0")
    if args.pruner not in ("median", "none") and not re.fullmatch(rf"threshold:{NUMBER}", args.pruner):
        raise TuneError(f"--pruner {args.pruner!r}: expected median, none or threshold:LOW")
    bounds, bounds_from = {}, {}
    for spec in args.bounds or []:
        m = re.fullmatch(rf"(.+)=({NUMBER}):({NUMBER})", spec)
        if m is None:
            raise TuneError(f"--bounds {spec!r}: expected ENV=LOW:HIGH")
        if m[1] not in envs:
            raise TuneError(f"--bounds {spec!r}: {m[1]} is not one of the envs (-e)")
        low, high = float(m[2]), float(m[5])
        if not low < high:
            raise TuneError(f"--bounds {spec!r}: LOW must be below HIGH")
        bounds[m[1]], bounds_from[m[1]] = (low, high), "given"
    for env in envs:
        if env not in bounds:
            low, high, where = measured_bounds(env)
            bounds[env], bounds_from[env] = (low, high), where
    # A script inside the repository is named from its root, so that the study moves with a clone.
    named = str(script.relative_to(REPO)) if script.is_relative_to(REPO) else str(script)
    return {"script": named, "envs": envs, "seeds": seeds, "space": space, "space_specs": specs,
            "extra": list(extra), "total_timesteps": fixed.total_timesteps, "bounds": bounds,
            "bounds_from": bounds_from,
            "objective": args.objective, "pruner": args.pruner, "startup_trials": args.startup_trials,
            "warmup_rungs": args.warmup_rungs, "rungs": args.rungs, "sampler": args.sampler,
            "sampler_seed": args.sampler_seed, "jobs": args.jobs or len(envs) * len(seeds)}


SAME_STUDY = ["script", "envs", "seeds", "space", "extra", "bounds", "objective", "pruner", "startup_trials",
              "warmup_rungs", "rungs", "sampler", "sampler_seed"]


def open_study(args, extra):
    """The study the command line names: a new one, or the one already there if it was defined alike."""
    if args.study:  # a name under --outdir, or a folder
        folder = Path(args.study) if os.sep in args.study else Path(args.outdir) / args.study
    elif args.script and args.env_ids:
        folder = Path(args.outdir) / f"{Path(args.script).stem}-{args.env_ids.replace(',', '-').replace('/', '_')}"
    else:
        raise TuneError("give -s SCRIPT and -e ENV[,ENV...] (a new study, or the one they name), or --study NAME")
    if not args.script:  # --study alone: the study there
        return Study(folder)
    old = json.loads((folder / "study.json").read_text()) if (folder / "study.json").is_file() else None
    if old is not None:  # bounds measured the first time are kept, for the envs not given now
        given = {spec.split("=", 1)[0] for spec in args.bounds or []}
        args.bounds = (args.bounds or []) + [f"{env}={lo!r}:{hi!r}" for env, (lo, hi) in old["bounds"].items()
                                             if env in (args.env_ids or "").split(",") and env not in given]
    definition = define(args, extra)
    if old is not None:
        definition["bounds_from"] = old["bounds_from"]
        differ = [k for k in SAME_STUDY if json.loads(json.dumps(definition[k])) != old.get(k)]
        if differ:
            raise TuneError(f"{folder} is a study of other settings ({', '.join(differ)} differ): give another "
                            "--study name, or the same command as the first time")
        return Study(folder, old | {"jobs": definition["jobs"]})
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "study.json.tmp"
    tmp.write_text(json.dumps(definition, indent=1) + "\n")
    os.replace(tmp, folder / "study.json")
    return Study(folder, definition, fresh=True)


def submit_slurm(args, argv):
    """W workers as one Slurm job array, each running this command without --slurm-workers."""
    own = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a.split("=")[0] in ("--slurm-workers", "--slurm-time", "--slurm-cpus", "--slurm-partition",
                               "--slurm-arg"):
            skip = "=" not in a
            continue
        if a == "--dry-run":
            continue
        own.append(a)
    folder = Path(args.outdir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / f"tune-workers-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sh"
    sbatch = ["sbatch", "--parsable", "--job-name", "tune", "--array", f"0-{args.slurm_workers - 1}",
              "--cpus-per-task", str(args.slurm_cpus), "--requeue", "--signal", "B:USR1@120",
              "--output", str(folder / "tune-%A_%a.out"), "--open-mode", "append"]
    if args.slurm_time:
        sbatch += ["--time", args.slurm_time]
    if args.slurm_partition:
        sbatch += ["--partition", args.slurm_partition]
    sbatch += args.slurm_arg or []
    text = ("#!/usr/bin/env bash\n# Written by tune.py: one worker of a shared study per task; a requeued task "
            "resumes the trial it was running.\n"
            f"cd {shlex.quote(os.getcwd())}\n"
            f"exec {shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} {shlex.join(own)}\n")
    if args.dry_run:
        print(text + f"# {shlex.join(sbatch + [str(job)])}")
        return 0
    job.write_text(text)
    result = subprocess.run(sbatch + [str(job)], capture_output=True, text=True)
    if result.returncode != 0:
        raise TuneError(f"sbatch failed: {result.stderr.strip()}")
    say(f"submitted {args.slurm_workers} workers as job array {result.stdout.strip()}; job script {job}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("-s", "--script", help="the script to tune (or a copy of one)")
    p.add_argument("-e", "--env-ids", help="comma-separated env ids")
    p.add_argument("--seeds", default="1,2,3", help="the seeds of every trial (default: %(default)s)")
    p.add_argument("--space", action="append", help="a setting's range, NAME=RANGE (repeatable; see below)")
    p.add_argument("--space-file", help="a file of --space specs, one per line")
    p.add_argument("--bounds", action="append", help="ENV=LOW:HIGH normalising that env's scores (repeatable)")
    p.add_argument("--trials", type=int, default=30, help="finish when the study has this many complete or "
                                                          "pruned trials (default: %(default)s)")
    p.add_argument("--objective", choices=["mean", "iqm"], default="mean")
    p.add_argument("--pruner", default="median", help="median (default), none, or threshold:LOW")
    p.add_argument("--startup-trials", type=int, default=5,
                   help="trials before the pruner prunes and the sampler stops sampling at random (default: 5)")
    p.add_argument("--warmup-rungs", type=int, default=2,
                   help="the first rung at which a trial can be pruned (default: 2; Optuna's n_warmup_steps)")
    p.add_argument("--rungs", type=int, default=10, help="progress reports per trial (default: 10)")
    p.add_argument("--sampler", choices=["tpe", "random"], default="tpe")
    p.add_argument("--sampler-seed", type=int, default=0)
    p.add_argument("-j", "--jobs", type=int, help="runs of a trial at once (default: all of them)")
    p.add_argument("-o", "--outdir", default=str(REPO / "benchmarks" / "tunes"),
                   help="where studies live (default: benchmarks/tunes)")
    p.add_argument("--study", help="the study's name under --outdir, or its folder (default: SCRIPT-ENVS)")
    p.add_argument("--report", action="store_true", help="only write the report of the study so far")
    p.add_argument("--poll-seconds", type=float, default=10.0, help="how often the runs' events are read")
    p.add_argument("--slurm-workers", type=int, help="submit this many workers as a Slurm job array")
    p.add_argument("--slurm-time", help="each worker's time limit (sbatch --time)")
    p.add_argument("--slurm-cpus", type=int, default=3, help="CPUs per worker (default: 3)")
    p.add_argument("--slurm-partition")
    p.add_argument("--slurm-arg", action="append", help="another sbatch argument (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="with --slurm-workers: print the job, submit nothing")
    args = p.parse_args(own)
    try:
        if args.slurm_workers:
            if args.slurm_workers < 1:
                raise TuneError("--slurm-workers must be at least 1")
            if not args.dry_run:
                open_study(args, extra)  # checked, and defined once, before any worker starts
            return submit_slurm(args, argv)
        study = open_study(args, extra)
        if args.report:
            say(f"wrote {write_report(study)}")
            return 0
        say(f"study {study.folder}: {len(study.runs)} runs a trial ({', '.join(study.d['envs'])} x seeds "
            f"{', '.join(map(str, study.d['seeds']))}), until {args.trials} trials are complete or pruned")
        return Worker(study, args.trials, args.poll_seconds).run()
    except TuneError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
