"""Compare PPO runs: a markdown table and learning-curve plots from the TensorBoard events the scripts write.

    python benchmarks/compare.py                          # everything under benchmarks/sweeps
    python benchmarks/compare.py benchmarks/sweeps/ppo_discrete --baseline default
    python benchmarks/compare.py runs --script ppo_discrete --out /tmp/report
    python benchmarks/compare.py --help

What is read. Every directory holding `events.out.tfevents.*` files is a run. Its name, as the scripts make
it, is `{env_id}__{exp_name}__{seed}__{unix_time}` under a `runs/` directory (the scripts write the `/` of an
id like `ALE/Breakout-v5` as `_`; a name that keeps it, as CleanRL's do, adds a directory level and is read
too). The exp_name is the *variant*. The *script* comes from the layout of benchmarks/sweep.sh
(benchmarks/layout.py: `{outdir}/{script}/{variant}/{env}/seed{N}/runs/{run}`); outside it from what the run
itself says: the `hyperparameters` text each script logs names its file and lists its settings (for older runs,
and a copy's section: only ppo_atari.py has `env_path`, then only ppo_continuous.py `norm_obs`, then
ppo_discrete.py `bootstrap_truncation`, or before it `eval_greedy`; see SCRIPT_MARKERS, OLD_SCRIPT_MARKERS);
failing that, an exp_name that is one of the script names (their default); failing that, `--script`. Sweep runs
without the sweep's `done` marker (still running, interrupted, failed) are left out unless --include-unfinished;
--env and --variant leave the others unread.

What is a group. A row of the table is one configuration: one script, one variant, and the same logged settings
but for the seed and those that only say how the run was operated (NOT_CONFIGURATION: progress lines, checkpoints,
threads, ...). Its seeds are the samples. Runs under one variant whose settings differ are split into rows
labelled with the settings that differ, with a warning. A copy of a script (`ppo_continuous_mod.py`, or any copy
logging its settings) is reported in its original's section, as `{copy}/{variant}`, so that it is compared with
the original's baseline. If one seed of one configuration appears twice, the newest run is used. Under the table,
each row's figure per seed, and what each row ran: its script, the extra arguments its sweep gave, and how its
settings differ from the baseline's.

What is computed, following the field's convention (CleanRL; Huang et al. 2022) and Agarwal et al. (2021,
"Deep RL at the edge of the statistical precipice", the rliable library), with scipy doing the statistics:
- per run: the mean of the last 100 training episodes' `charts/episodic_return` (--window);
- per group: mean +- population std (ddof=0) over seeds, as CleanRL and the PPO papers report; and the
  interquartile mean (scipy.stats.trim_mean, 25% cut at each end) with a 95% percentile-bootstrap
  confidence interval (scipy.stats.bootstrap). With 2 seeds or fewer the table gives no interval
  ("n/a: 2 seeds"): resampling two values can only return them, so the interval would mean nothing;
- between a variant X and the baseline Y on one env: the probability of improvement P(X > Y), the
  Mann-Whitney U statistic over all pairs of seeds divided by their number (ties count one half;
  scipy.stats.mannwhitneyu), with a 95% bootstrap interval; not given when either side has 2 seeds or fewer
  (from 2 a side it can only be 0, 1/4, 1/2, 3/4 or 1, and would read as decisive); its mean over envs is the
  overall figure;
- with --milestones (e.g. 100,200,300), per run: the step, and the training time by then, at which the mean of
  --window consecutive episodes first reaches each score (a table under the section's). Games scored on other
  scales take scores of their own: --milestones ENV=SCORES for one env id (repeatable; a plain list is for the
  other envs), one table per list.

Published figures (CleanRL, openai/baselines ppo2; see PUBLISHED) stand beside ours. One from a longer budget
is marked with it ("(at 10M)"). An env version with no published figure (Hopper-v5) gets the nearest
published version's figure, marked with that version ("(v4)"); the plots draw the published line only for
the same env id at a matching budget, so such figures stay in the table.

With --monitor-curve LABEL=DIR, the steps plot also draws another project's curve where DIR/{env id}/ holds
the `N.monitor.csv` files of a Stable-Baselines3 run of that env (one per env of the run, one line per whole
game): the mean of the last --window games, with the games of all envs in the order they ended (a game that ends
at an env's F-th frame ends at about step n_envs * F / 4 for a NoFrameskip Atari id, n_envs * F otherwise). It
is not drawn against wall time, which is that project's machine's, nor counted in the table.

Written to --out (default: the first log dir's `report/`, or `report-2/`, ... : an earlier report is never
written over unless --out names its folder): `comparison.md` (also printed) and, per script, `{script}_steps.png`
and `{script}_time.png`: return against environment steps and against wall time, one panel per env, one line per
row. A line is the mean over seeds of each run's trailing mean of the last --window episodes (so its end is the
table's figure), read off on a grid of steps (or seconds) of its own that spans the range all its seeds cover
(from the latest first episode to where the shortest seed stops), so a short variant is drawn however long the
others are; the band is the 95% bootstrap confidence interval of that mean (none with 2 seeds or fewer, and the
title says which). `{script}_diagnostics.png`: the update's diagnostics against steps (value loss, approximate KL,
clip fraction, entropy, explained variance; mean over seeds), as the scripts log them: the losses, KL and entropy
of each iteration's last minibatch, the clip fraction averaged over its minibatches.
Wall time is measured from the moment the run opened its event file. A resumed run has one event file per
process that trained it; its wall time is the sum of their spans, so the time it spent stopped (waiting in a
queue, between sessions) does not count, and each episode is placed on that running clock.
"""

import argparse
import csv
import math
import re
import struct
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))  # however this file is loaded, layout.py is beside it
import layout  # noqa: E402  (where benchmarks/sweep.sh puts each run)

REPO = Path(__file__).resolve().parent.parent
RETURN_TAG = "charts/episodic_return"
SPS_TAG = "charts/SPS"

# Published returns (mean, population std over 3 seeds, last 100 training episodes), copied from the project's
# reference sheet (REFERENCE.md), which gathers: CleanRL's benchmark tables for ppo.py (classic control, 500k
# steps), ppo_continuous_action.py (MuJoCo v4, 1M steps, its latest table) and ppo_atari.py (10M steps), from
# https://docs.cleanrl.dev/rl-algorithms/ppo/; and openai/baselines ppo2 as rerun by Huang et al. (2022),
# "The 37 Implementation Details of Proximal Policy Optimization", ICLR blog track (MuJoCo: on v2 envs).
PUBLISHED = {
    "CartPole-v1": {"CleanRL": (490.04, 6.12), "ppo2": (497.54, 4.02)},
    "Acrobot-v1": {"CleanRL": (-86.36, 1.32), "ppo2": (-81.82, 5.58)},
    "MountainCar-v0": {"CleanRL": (-200.00, 0.00), "ppo2": (-200.00, 0.00)},
    "HalfCheetah-v4": {"CleanRL": (1442.64, 46.03), "ppo2": (2148.77, 1166.02, "v2")},
    "Hopper-v4": {"CleanRL": (2382.86, 271.74), "ppo2": (2448.73, 596.13, "v2")},
    "Walker2d-v4": {"CleanRL": (2287.95, 571.78), "ppo2": (3142.24, 982.25, "v2")},
    "InvertedPendulum-v4": {"CleanRL": (963.09, 22.20)},
    "Humanoid-v4": {"CleanRL": (716.11, 49.08)},
    "Pusher-v4": {"CleanRL": (-40.38, 7.15)},
    "BreakoutNoFrameskip-v4": {"CleanRL": (414.66, 28.09), "ppo2": (409.27, 30.98)},
    "PongNoFrameskip-v4": {"CleanRL": (20.36, 0.20), "ppo2": (20.59, 0.40)},
    "BeamRiderNoFrameskip-v4": {"CleanRL": (1915.93, 484.58), "ppo2": (2627.96, 625.75)},
}
# The step budget of those published runs: a figure from a longer run is marked with its budget in the table
# and left off the plots, where it would only flatten a shorter run's curve.
PUBLISHED_STEPS = {env: 500_000 for env in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0")}
PUBLISHED_STEPS.update({env: 1_000_000 for env in ("HalfCheetah-v4", "Hopper-v4", "Walker2d-v4",
                                                    "InvertedPendulum-v4", "Humanoid-v4", "Pusher-v4")})
PUBLISHED_STEPS.update({env: 10_000_000 for env in ("BreakoutNoFrameskip-v4", "PongNoFrameskip-v4",
                                                     "BeamRiderNoFrameskip-v4")})
PUBLISHED_NOTES = {
    "HalfCheetah-v4": "HalfCheetah is very seed-sensitive: an earlier CleanRL table had 2905.85 ± 1129.37.",
}
SOURCES = ["CleanRL", "ppo2"]
# A bootstrap interval needs at least this many seeds to say anything: from two, resampling can only return
# those two values, so the interval would just restate them.
MIN_SEEDS_FOR_CI = 3
# The scripts, each with an argument that, checked in this order, only it logs in its `hyperparameters` text (all
# three have bootstrap_truncation; CleanRL's scripts have none of these). A run outside a sweep layout is filed
# under the script it names (today's runs log their file name); these are for runs that do not.
SCRIPT_MARKERS = [("ppo_atari", "env_path"), ("ppo_continuous", "norm_obs"), ("ppo_discrete", "bootstrap_truncation")]
# Runs from before a marker existed: ppo_discrete.py's runs logged eval_greedy (now eval_deterministic).
OLD_SCRIPT_MARKERS = [("ppo_discrete", "eval_greedy")]
HPARAMS_TAG = "hyperparameters/text_summary"  # where SummaryWriter.add_text("hyperparameters", ...) goes
# Settings that say how a run was operated, not what it computed: runs that differ only in these (and the seed)
# are seeds of one configuration. Any other logged setting, a copy's new one included, is part of the
# configuration. (tests/test_benchmarks.py holds this list to each script's Args.)
NOT_CONFIGURATION = {
    "script", "exp_name", "seed", "env_id", "torch_deterministic", "cuda", "threads", "async_envs", "track",
    "wandb_project_name", "wandb_entity", "capture_video", "progress", "progress_interval", "save_model",
    "checkpoint_every", "checkpoint_minutes", "resume", "eval_checkpoint", "eval_episodes", "eval_greedy",
    "eval_deterministic",
}
# The update's diagnostics, plotted per variant. The scripts log the losses and the KL of the last minibatch of
# each iteration (as CleanRL does), the clip fraction as the mean over the iteration's minibatches, and the
# explained variance of the value function over the iteration's batch.
DIAGNOSTICS = [("losses/value_loss", "value loss (last minibatch)"),
               ("losses/approx_kl", "approximate KL (last minibatch)"),
               ("losses/clipfrac", "clip fraction (iteration mean)"),
               ("losses/entropy", "entropy (last minibatch)"),
               ("losses/explained_variance", "explained variance")]


class ScalarEvent(NamedTuple):
    """One logged point of a scalar tag."""
    step: int
    wall_time: float
    value: float


class CompareError(Exception):
    """Bad input that stops the comparison; main() prints it without a traceback."""


def warn(msg):
    print(f"compare.py: warning: {msg}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------


def run_return(returns, last=100):
    """Return of one run: the mean of its last `last` episodic returns (all of them if fewer)."""
    returns = np.asarray(returns, dtype=float)
    if returns.size == 0:
        raise ValueError("no episodes")
    return float(np.mean(returns[-last:]))


def iqm(x, axis=None):
    """Interquartile mean: the mean of the middle 50% (scipy's trim_mean cuts 25% at each end, as rliable)."""
    return stats.trim_mean(x, proportiontocut=0.25, axis=axis)


def bootstrap_ci(samples, statistic, resamples=2000, seed=0, confidence=0.95):
    """Percentile-bootstrap confidence interval of `statistic(*samples, axis)` (scipy.stats.bootstrap;
    several samples are resampled independently). (nan, nan) when a sample has fewer than two values."""
    samples = [np.asarray(s, dtype=float) for s in samples]
    if any(s.shape[0] < 2 for s in samples):
        return (math.nan, math.nan)
    res = stats.bootstrap(samples, statistic, n_resamples=resamples, confidence_level=confidence,
                          method="percentile", vectorized=True, axis=0, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def probability_of_improvement(x, y, axis=-1):
    """P(X > Y) + P(X = Y)/2 over all pairs of a sample of X and a sample of Y: the Mann-Whitney U statistic
    of x against y divided by len(x) * len(y) (Agarwal et al. 2021). 0.5 means no difference."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    u = stats.mannwhitneyu(x, y, axis=axis, method="asymptotic").statistic
    return u / (x.shape[axis] * y.shape[axis])


@dataclass
class GroupStats:
    n: int
    mean: float
    std: float  # population std, ddof=0
    iqm: float
    iqm_ci: tuple


def group_stats(run_returns, resamples=2000, seed=0):
    """Mean +- population std, and the IQM with its 95% bootstrap interval, of the per-run returns."""
    x = np.asarray(run_returns, dtype=float)
    ci = bootstrap_ci([x], lambda s, axis: iqm(s, axis=axis), resamples, seed)
    return GroupStats(len(x), float(np.mean(x)), float(np.std(x, ddof=0)), float(iqm(x)), ci)


def poi_with_ci(x, y, resamples=2000, seed=0):
    """Probability of improvement of x over y, with its 95% bootstrap interval (x and y resampled apart)."""
    p = float(probability_of_improvement(x, y))
    ci = bootstrap_ci([x, y], lambda a, b, axis: probability_of_improvement(a, b, axis=axis), resamples, seed)
    return p, ci


# ----------------------------------------------------------------------------------------------
# Reading runs
# ----------------------------------------------------------------------------------------------

RUN_NAME = re.compile(r"^(?P<env>.+?)__(?P<variant>.+?)__(?P<seed>-?\d+)__(?P<time>\d+)$")


def parse_run_name(name):
    """'CartPole-v1__default__1__1700000000' -> (env, variant, seed, time), or None if it is not one."""
    m = RUN_NAME.match(name)
    if m is None:
        return None
    return m["env"], m["variant"], int(m["seed"]), int(m["time"])


@dataclass
class Run:
    path: Path
    script: str
    env: str
    variant: str
    seed: int
    start: int  # the unix time in the run name
    steps: np.ndarray  # global step of each finished episode
    times: np.ndarray  # seconds since the event file was opened, of each episode
    returns: np.ndarray
    total_steps: int  # last global step logged
    wall_time: float  # seconds of training: from the first to the last event of each process, summed
    sps: float = math.nan  # last charts/SPS value
    hparams: dict = field(default_factory=dict)  # the settings the run logged (name -> value as text)
    sweep_args: Optional[str] = None  # the variant's extra arguments, for a run of a sweep
    diagnostics: dict = field(default_factory=dict)  # tag -> (steps, values)
    section: str = ""  # the script whose section of the report the run is in (a copy joins its original's)
    label: str = ""  # its row: the variant, with the script of a copy and the settings of a split group


def locate(run_dir, default_script):
    """Run name, script and sweep seed directory (None outside a sweep layout) of an event directory."""
    parts = run_dir.parts
    # The run name is the path below the nearest `runs/` (CleanRL's names keep an env id's '/': one more level).
    for depth in (1, 2):
        if len(parts) > depth and parts[-depth - 1] == "runs":
            name = "/".join(parts[-depth:])
            runs_dir = Path(*parts[:-depth])
            break
    else:
        name, runs_dir = run_dir.name, None
    parsed = parse_run_name(name)
    if parsed is None:
        return None
    script, seed_dir = default_script, None
    where = layout.parse_seed_dir(runs_dir.parent) if runs_dir is not None else None
    if where is not None and where[4] == parsed[2] and where[2] == parsed[1]:  # its seed and variant: a sweep's run
        script, seed_dir = where[1], runs_dir.parent
    return parsed, script, seed_dir


def parse_hparams(text):
    """The `hyperparameters` text each script logs (a markdown table, one `|name|value|` row per setting) as a
    dict; the header rows are left out."""
    rows = [row.split("|") for row in text.splitlines() if row.count("|") >= 3]
    return {cells[1].strip(): cells[2].strip() for cells in rows if cells[1].strip() not in ("param", "-")}


def script_from_run(hparams, variant):
    """The script a run came from, by what the run says (None if it says nothing we know): the script it names
    (the scripts log their file name), else an argument only that script has, else an exp_name left at its
    default, the script's name."""
    if hparams.get("script", "").endswith(".py"):
        return hparams["script"][:-3]
    return family_from_settings(hparams) or (variant if variant in {s for s, _ in SCRIPT_MARKERS} else None)


def family_from_settings(hparams):
    """The script whose settings a run logged (a copy logs its original's, and maybe more), or None."""
    for script, marker in SCRIPT_MARKERS + OLD_SCRIPT_MARKERS:
        if marker in hparams:
            return script
    return None


def configuration(run):
    """The settings that make a run what it is: what it logged, less the seed and how it was operated."""
    return {k: v for k, v in run.hparams.items() if k not in NOT_CONFIGURATION}


def read_events(path):
    """The Event records of one TensorBoard event file, in order. Their checksums are not verified:
    tensorboard's pure-Python CRC made reading a results folder take minutes. A torn last record, as a kill
    mid-write leaves, ends the file, as it does for TensorBoard."""
    from tensorboard.compat.proto.event_pb2 import Event

    data = Path(path).read_bytes()
    pos = 0
    while pos + 12 <= len(data):  # a record: length (8 bytes), its CRC (4), the Event, the Event's CRC (4)
        (length,) = struct.unpack_from("<Q", data, pos)
        start = pos + 12
        if start + length + 4 > len(data):
            return
        yield Event.FromString(data[start:start + length])
        pos = start + length + 4


def process_spans(run_dir):
    """(first, last) event time of each event file of a run, sorted: one per process that trained it (a run
    resumed twice has three). The gaps between them are time the run was stopped."""
    spans = []
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        times = [event.wall_time for event in read_events(path)]
        if times:
            spans.append((min(times), max(times)))
    return sorted(spans)


def training_clock(spans):
    """A function mapping event times to seconds of training: the gaps between the processes' spans (and
    any overlap) are left out."""
    starts, offsets, ends, total = [], [], [], 0.0
    for first, last in spans:
        if ends and first < ends[-1]:  # overlapping spans count once
            first = ends[-1]
            last = max(last, first)
        starts.append(first)
        offsets.append(total)
        ends.append(last)
        total += last - first

    starts, offsets, ends = np.array(starts), np.array(offsets), np.array(ends)

    def clock(t):
        t = np.asarray(t, dtype=float)
        i = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, len(starts) - 1)  # the span t falls in
        return offsets[i] + np.clip(t - starts[i], 0, ends[i] - starts[i])

    return clock, total


def load_events(run_dir):
    """(episode scalar events, SPS events, first event time, last event time, hyperparameters text,
    diagnostics {tag: events}) of one run directory, read as TensorBoard's EventAccumulator reads it (its
    event files in name order, every point kept), with its rule for a resumed run: a process that starts again
    at its checkpoint's step writes a SessionLog START there (the scripts' purge_step), and what the stopped
    process logged from that step on is dropped."""
    from tensorboard.compat.proto.event_pb2 import SessionLog

    scalars, texts, first = {}, {}, math.nan  # tag -> [ScalarEvent], tag -> [(step, text)]
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in read_events(path):
            if math.isnan(first):
                first = event.wall_time
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                for series in (*scalars.values(), *texts.values()):
                    series[:] = [e for e in series if e[0] < event.step]
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append(ScalarEvent(event.step, event.wall_time,
                                                                         value.simple_value))
                elif value.HasField("tensor"):
                    texts.setdefault(value.tag, []).append((event.step, value.tensor.string_val))
    hparams = texts.get(HPARAMS_TAG, [(0, [])])[0][1]
    hparams = hparams[0].decode("utf-8", "replace") if hparams else ""
    diagnostics = {tag: scalars[tag] for tag, _ in DIAGNOSTICS if tag in scalars}
    last = max([series[-1].wall_time for series in scalars.values() if series], default=math.nan)
    return scalars.get(RETURN_TAG, []), scalars.get(SPS_TAG, []), first, last, hparams, diagnostics


def find_runs(logdirs, default_script="runs", include_unfinished=False, envs=None, variants=None):
    """All runs with at least one episode under the log dirs (only those of `envs` and `variants` if given);
    bad runs are skipped with a warning."""
    event_dirs = set()
    for d in logdirs:
        d = Path(d)
        if not d.exists():
            raise CompareError(f"no such log directory: {d}")
        if not d.is_dir():
            raise CompareError(f"not a directory: {d}")
        event_dirs.update(p.parent.resolve() for p in d.rglob("events.out.tfevents.*") if p.is_file())
    if not event_dirs:
        raise CompareError(f"no TensorBoard event files under {', '.join(map(str, logdirs))} (expected "
                           "runs/{env}__{variant}__{seed}__{time}/events.out.tfevents.*, or a benchmarks/sweep.sh "
                           "output directory)")
    wanted_envs = None if not envs else set(envs) | {e.replace("/", "_") for e in envs}
    runs, unfinished, repeated, considered = {}, [], [], 0
    for run_dir in sorted(event_dirs):
        where = locate(run_dir, default_script)
        if where is None:
            warn(f"skipping {run_dir}: its name is not {{env}}__{{variant}}__{{seed}}__{{time}}")
            continue
        (env, variant, seed, start), script, seed_dir = where
        if (wanted_envs and env not in wanted_envs) or (variants and variant not in variants):
            continue
        considered += 1
        if seed_dir is not None and not layout.is_done(seed_dir) and not include_unfinished:
            unfinished.append(run_dir)
            continue
        try:
            episodes, sps, first, last, hparams, diagnostics = load_events(run_dir)
        except Exception as e:  # a truncated or corrupt event file
            warn(f"skipping {run_dir}: cannot read its events ({type(e).__name__}: {e})")
            continue
        if not episodes:
            warn(f"skipping {run_dir}: no {RETURN_TAG} values (it did not finish a single episode)")
            continue
        hparams = parse_hparams(hparams)
        sweep_args = None
        if seed_dir is None:  # not in a sweep layout: the run's own record names its script
            script = script_from_run(hparams, variant) or default_script
        else:
            outdir, *_ = layout.parse_seed_dir(seed_dir)
            sweep_args = layout.sweep_args(outdir, script, variant)
        steps = np.array([e.step for e in episodes], dtype=np.int64)
        spans = process_spans(run_dir)
        if len(spans) > 1:  # resumed: count the time each process trained, not the time it was stopped
            clock, wall_time = training_clock(spans)
            times = clock([e.wall_time for e in episodes])
        else:
            times, wall_time = np.array([e.wall_time - first for e in episodes]), float(last - first)
        run = Run(
            path=run_dir, script=script, env=env, variant=variant, seed=seed, start=start, steps=steps,
            times=np.asarray(times, dtype=float), returns=np.array([e.value for e in episodes], dtype=float),
            total_steps=int(max(sps[-1].step if sps else 0, steps.max())),
            wall_time=float(wall_time), sps=float(sps[-1].value) if sps else math.nan, hparams=hparams,
            sweep_args=sweep_args,
            diagnostics={tag: (np.array([e.step for e in es]), np.array([e.value for e in es], dtype=float))
                         for tag, es in diagnostics.items()},
        )
        # The same seed of the same configuration twice (a run made again): the newer one counts.
        key = (script, env, variant, seed, tuple(sorted(configuration(run).items())))
        if key in runs:
            old = runs[key]
            newer, older = (run, old) if (run.start, str(run.path)) > (old.start, str(old.path)) else (old, run)
            repeated.append((older.path, newer.path))
            run = newer
        runs[key] = run
    if repeated:
        warn(f"{len(repeated)} run(s) repeat the seed of a run of the same configuration; the newest of each "
             "is used, the older left out: " + ", ".join(str(old) for old, _ in repeated[:3])
             + (" ..." if len(repeated) > 3 else ""))
    if unfinished:
        warn(f"left out {len(unfinished)} unfinished sweep run(s) without a done marker "
             f"(--include-unfinished takes them): " + ", ".join(str(p) for p in unfinished[:5])
             + (" ..." if len(unfinished) > 5 else ""))
    if not runs:
        raise CompareError("no runs of the env ids and variants asked for (--env, --variant)" if not considered
                           else "no usable runs (see the warnings above)")
    return list(runs.values())


# ----------------------------------------------------------------------------------------------
# Groups: one configuration each
# ----------------------------------------------------------------------------------------------


def section_of(run):
    """The script whose section a run is in: a copy of a script (named like it, ppo_continuous_mod, or logging
    the settings only it has) joins its original's section, so that the two are compared."""
    for known, _ in SCRIPT_MARKERS:
        if run.script == known or run.script.startswith(known + "_"):
            return known
    return family_from_settings(run.hparams) or run.script


def group_runs(runs):
    """{section: {env: {label: runs by seed}}} and notes on the groups that were split. A group is one
    configuration: one script (or copy), one variant, the same settings but for the seed. Runs under one variant
    whose logged settings differ are split, each part labelled with the settings that tell them apart."""
    buckets = {}
    for r in runs:
        r.section = section_of(r)
        buckets.setdefault((r.section, r.env, r.script, r.variant), []).append(r)
    groups, notes = {}, []
    for (section, env, script, variant), rs in sorted(buckets.items()):
        name = variant if script == section else f"{script}/{variant}"
        shared = set.intersection(*(set(configuration(r)) for r in rs))  # older runs may lack a newer setting
        parts = {}
        for r in rs:
            parts.setdefault(tuple(sorted((k, configuration(r)[k]) for k in shared)), []).append(r)
        differing = sorted(k for k in shared if len({dict(key)[k] for key in parts}) > 1)
        for key, part in parts.items():
            label = name if len(parts) == 1 else f"{name} ({', '.join(f'{k}={dict(key)[k]}' for k in differing)})"
            for r in part:
                r.label = label
            groups.setdefault(section, {}).setdefault(env, {})[label] = sorted(part, key=lambda r: r.seed)
        if len(parts) > 1:
            notes.append(f"{section} / {env} / {name}: its runs differ in {', '.join(differing)}, so they are not "
                         f"seeds of one configuration; split into {len(parts)} rows")
            warn(notes[-1])
    return groups, notes


def differences(run, base):
    """How `run`'s settings differ from the baseline run's, in words ('' if they do not)."""
    mine, theirs = configuration(run), configuration(base)
    out = []
    for k in sorted(set(mine) | set(theirs)):
        if k not in theirs:
            out.append(f"{k}={mine[k]} (not a setting of the baseline's script)")
        elif k not in mine:
            out.append(f"no {k} (baseline: {theirs[k]})")
        elif mine[k] != theirs[k]:
            out.append(f"{k}={mine[k]} (baseline: {theirs[k]})")
    return ", ".join(out)


def describe(label, runs, base_label, base_runs):
    """What a row ran: its script, the arguments its sweep gave, and its settings against the baseline's."""
    r = runs[0]
    words = [f"`{r.script}.py`"]
    if r.sweep_args is not None:
        given = r.sweep_args.strip()
        words.append(f"swept with `{given}`" if given else "swept with no extra arguments")
    if label == base_label:
        words.append("the baseline")
    elif not r.hparams or not base_runs or not base_runs[0].hparams:
        words.append("its settings were not logged, so they cannot be set against the baseline's")
    else:
        diff = differences(r, base_runs[0])
        words.append(f"differs from `{base_label}` in: {diff}" if diff else f"the same settings as `{base_label}`")
    return "; ".join(words)


# ----------------------------------------------------------------------------------------------
# Other projects' curves: Stable-Baselines3 Monitor files
# ----------------------------------------------------------------------------------------------


def read_monitors(folder):
    """[(the env's frames so far at each game's end, the games' returns)] per env file of a run, in the order
    0.monitor.csv, 1.monitor.csv, ... Raises ValueError, naming the file, on anything else."""
    files = sorted((p for p in Path(folder).glob("*.monitor.csv") if p.name.split(".")[0].isdigit()),
                   key=lambda p: int(p.name.split(".")[0]))
    if not files:
        raise ValueError(f"no N.monitor.csv files in {folder}")
    envs = []
    for path in files:
        with path.open() as f:
            if not f.readline().startswith("#"):
                raise ValueError(f"{path}: not a Monitor file (its first line is not the '#{{...}}' header)")
            rows = list(csv.DictReader(f))
        if not rows or not {"r", "l"} <= set(rows[0]):
            raise ValueError(f"{path}: no games with r and l columns")
        try:
            lengths, returns = [int(r["l"]) for r in rows], [float(r["r"]) for r in rows]
        except (TypeError, ValueError):
            raise ValueError(f"{path}: a game's r or l is missing or not a number") from None
        envs.append((np.cumsum(lengths), np.array(returns)))
    return envs


def monitor_curve(envs, frameskip):
    """(steps, returns) of every game of every env of a lockstep vectorised run, in the order the games ended:
    a game ending at an env's F-th frame ends at about step (number of envs) * F / frameskip."""
    steps = np.concatenate([len(envs) * frames / frameskip for frames, _ in envs])
    returns = np.concatenate([r for _, r in envs])
    order = np.argsort(steps, kind="stable")
    return steps[order], returns[order]


def monitor_frameskip(env):
    """Frames per agent step in a Monitor file of `env`: 4 where it wraps the emulator of a NoFrameskip Atari id,
    whose wrappers repeat each action 4 frames; else 1."""
    return 4 if "NoFrameskip" in env else 1


# ----------------------------------------------------------------------------------------------
# Curves
# ----------------------------------------------------------------------------------------------


def trailing_mean(values, window):
    """Mean of the last `window` values up to and including each position (fewer at the start)."""
    c = np.concatenate([[0.0], np.cumsum(values, dtype=float)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def first_reached_at(returns, scores, window):
    """For each score, the index of the episode at which the mean of `window` whole episodes first reaches it,
    or None where it never does."""
    means = trailing_mean(returns, window)[window - 1:]
    hits = [np.flatnonzero(means >= score) for score in scores]
    return [int(hit[0]) + window - 1 if hit.size else None for hit in hits]


def first_reached(run, scores, window):
    """For each score, (the step, the seconds of training) at which the mean of `window` whole episodes first
    reaches it, or None where it never does."""
    return [None if i is None else (int(run.steps[i]), float(run.times[i]))
            for i in first_reached_at(run.returns, scores, window)]


def milestone_table(script, rows, scores, window):
    """Where each run's curve first reaches each score: the step and the training time by then."""
    lines = [f"Where each run's score (the mean of {window} consecutive episodes) first reaches "
             f"{', '.join(f'{v:g}' for v in scores)}: the step, and the training time by then.", "",
             "| env | variant | seed | " + " | ".join(f"{v:g}" for v in scores) + " |",
             "|---|---|---|" + "---|" * len(scores)]
    for row in rows:
        for run in sorted(row.runs, key=lambda r: r.seed):
            cells = ["not reached" if hit is None else f"{fmt_steps(hit[0])} ({fmt_time(hit[1])})"
                     for hit in first_reached(run, scores, window)]
            lines.append(f"| {row.env} | {row.label} | {run.seed} | " + " | ".join(cells) + " |")
    return lines + [""]


def milestone_tables(script, rows, milestones, window):
    """One milestone table per list of scores: `milestones` maps an env id, or None for every other env, to its
    scores; the tables come in the order of their first env."""
    tables = {}  # scores -> the rows of the envs that take them, in order
    for row in rows:
        scores = milestones.get(row.env, milestones.get(None))
        if scores:
            tables.setdefault(tuple(scores), []).append(row)
    return [line for scores, its_rows in tables.items() for line in milestone_table(script, its_rows, scores, window)]


def on_grid(x, y, grid):
    """The value of the step function y(x) (last value at or before each grid point; nan before x[0])."""
    i = np.searchsorted(x, grid, side="right") - 1
    out = np.asarray(y, dtype=float)[np.maximum(i, 0)]
    out[i < 0] = np.nan
    return out


def group_curve(runs, axis, grid_points, window, resamples, seed):
    """(grid, mean, low, high) of a group on a grid of its own over the range all its seeds cover, or None if
    they share none. The grid is the group's, not the env's, so a short group is not squeezed off the plot by
    a long one. low and high are None with fewer than MIN_SEEDS_FOR_CI seeds."""
    xs = [r.steps if axis == "steps" else r.times for r in runs]
    lo = max(x[0] for x in xs)  # before this some seed has no episode yet
    hi = min((r.total_steps if axis == "steps" else r.wall_time) for r in runs)
    if hi < lo:
        return None
    g = np.linspace(lo, hi, grid_points) if hi > lo else np.array([lo], dtype=float)  # one point: a dot
    ys = np.stack([on_grid(x, trailing_mean(r.returns, window), g) for x, r in zip(xs, runs)])
    mean = ys.mean(axis=0)
    if len(runs) < MIN_SEEDS_FOR_CI:
        return g, mean, None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant columns (e.g. MountainCar at -200) are fine: low = high
        res = stats.bootstrap((ys,), np.mean, axis=0, n_resamples=resamples, method="percentile",
                              vectorized=True, rng=np.random.default_rng(seed))
    low, high = res.confidence_interval.low, res.confidence_interval.high
    low, high = np.where(np.isnan(low), mean, low), np.where(np.isnan(high), mean, high)
    return g, mean, low, high


# ----------------------------------------------------------------------------------------------
# The comparison
# ----------------------------------------------------------------------------------------------


def ordered_variants(variants, baseline):
    rest = sorted(v for v in variants if v != baseline)
    return ([baseline] if baseline in variants else []) + rest


def pick_baseline(variants, wanted, script):
    if wanted is not None:
        return wanted if wanted in variants else None
    for v in ("default", script):
        if v in variants:
            return v
    return sorted(variants)[0]


def fmt(x, digits=2):
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def fmt_steps(n):
    for unit, div in (("M", 1e6), ("k", 1e4)):
        if n >= div:
            return f"{n / (1e3 if unit == 'k' else div):.4g}{unit}"
    return str(n)


def fmt_time(seconds):
    if not np.isfinite(seconds):
        return "n/a"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def published_budget_matches(env, steps):
    """Whether runs of `steps` steps can be set beside the published figure (within 10% of its budget)."""
    return steps >= 0.9 * PUBLISHED_STEPS.get(env, 0)


ENV_VERSION = re.compile(r"^(?P<name>.+)-v(?P<version>\d+)$")


def published_env(env, source):
    """The env id whose published `source` figure stands for `env`: env itself if it has one, else the
    nearest other version of the same env (Hopper-v5 -> Hopper-v4; the higher one on a tie), else None."""
    if source in PUBLISHED.get(env, {}):
        return env
    m = ENV_VERSION.match(env)
    if m is None:
        return None
    others = [(abs(int(o["version"]) - int(m["version"])), -int(o["version"]), key) for key in PUBLISHED
              if source in PUBLISHED[key] and (o := ENV_VERSION.match(key)) and o["name"] == m["name"]]
    return min(others)[2] if others else None


def fmt_published(env, source, steps=None):
    """The published figure beside `env`, marked with its budget when longer than `steps` and with its env
    version when it is not `env`'s own (a figure that already names its version, ppo2's v2, keeps that)."""
    key = published_env(env, source)
    if key is None:
        return ""
    entry = PUBLISHED[key][source]
    text = f"{entry[0]:.2f} ± {entry[1]:.2f}"
    if steps is not None and not published_budget_matches(key, steps):
        text += f" (at {fmt_steps(PUBLISHED_STEPS[key])})"
    if len(entry) > 2:
        text += f" ({entry[2]})"
    elif key != env:
        text += f" (v{ENV_VERSION.match(key)['version']})"
    return text


def fmt_ci(ci, n):
    """' [low, high]' of a bootstrap interval, '' when there is none, and a note instead of one from
    fewer than MIN_SEEDS_FOR_CI seeds (`n`: the smallest sample)."""
    if n < MIN_SEEDS_FOR_CI:
        return f" [n/a: {n} seed{'s' if n != 1 else ''}]"
    return "" if not np.isfinite(ci[0]) else f" [{fmt(ci[0])}, {fmt(ci[1])}]"


def check_budgets(script, env, groups):
    """Warn about runs trained for different numbers of steps; returns notes for the table."""
    notes = []
    for variant, runs in groups.items():
        totals = sorted({r.total_steps for r in runs})
        if len(totals) > 1:
            msg = (f"{script} / {env} / {variant}: its seeds trained for different numbers of steps "
                   f"({', '.join(map(str, totals))}); the curve stops at the shortest, and the last-100 figures "
                   "mix budgets")
            warn(msg)
            notes.append(msg)
    medians = {v: int(np.median([r.total_steps for r in runs])) for v, runs in groups.items()}
    if len(set(medians.values())) > 1:
        msg = (f"{script} / {env}: the variants trained for different numbers of steps ("
               + ", ".join(f"{v}: {n}" for v, n in medians.items()) + "); compare the curves, not only the table")
        warn(msg)
        notes.append(msg)
    return notes


@dataclass
class Row:
    """One group on one env: its runs and the figure of each (the mean of its last --window episodes)."""
    env: str
    label: str
    runs: list
    finals: np.ndarray
    stats: GroupStats


def section_rows(envs, order, window, resamples, seed):
    """The statistics of one section: a Row per env and group, in table order."""
    rows = []
    for env in sorted(envs):
        for label in order:
            if label in envs[env]:
                finals = np.array([run_return(r.returns, window) for r in envs[env][label]])
                rows.append(Row(env, label, envs[env][label], finals, group_stats(finals, resamples, seed)))
    return rows


def improvements(rows, base, resamples, seed):
    """(env, label, P(improvement), its interval, seeds, baseline seeds) of each group against the baseline on
    the same env. P is None where either side has fewer than MIN_SEEDS_FOR_CI seeds: from two seeds a side it
    can only be 0, 0.25, 0.5, 0.75 or 1, and would read as decisive."""
    by_env = {}
    for row in rows:
        by_env.setdefault(row.env, {})[row.label] = row
    out = []
    for env, labels in by_env.items():
        if base not in labels:
            continue
        y = labels[base].finals
        for label, row in labels.items():
            if label == base:
                continue
            enough = min(len(row.finals), len(y)) >= MIN_SEEDS_FOR_CI
            p, ci = poi_with_ci(row.finals, y, resamples, seed) if enough else (None, None)
            out.append((env, label, p, ci, len(row.finals), len(y)))
    return out


def fmt_return(s):
    """'mean ± std' over seeds; one seed has no spread to give."""
    return f"{fmt(s.mean)} (1 seed)" if s.n == 1 else f"{fmt(s.mean)} ± {fmt(s.std)}"


def section_table(script, envs, rows, pois, base, order, notes):
    """The markdown of one section: the table, the per-seed figures, the probabilities of improvement, what
    each row ran, and the notes."""
    lines = [f"## {script}", "",
             "Return: mean of the last 100 training episodes of each run; mean ± population std over seeds, and the "
             "interquartile mean with its 95% bootstrap confidence interval. Published figures (3 seeds, same "
             "convention) beside ours.", "",
             "| env | variant | seeds | return (mean ± std) | IQM [95% CI] | steps | wall time | SPS | CleanRL "
             "| baselines ppo2 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        s, rs = row.stats, row.runs
        sps = [r.sps for r in rs if np.isfinite(r.sps)]
        steps = int(np.median([r.total_steps for r in rs]))
        lines.append(f"| {row.env} | {row.label} | {s.n} | {fmt_return(s)} | {fmt(s.iqm)}{fmt_ci(s.iqm_ci, s.n)} "
                     f"| {fmt_steps(steps)} | {fmt_time(float(np.mean([r.wall_time for r in rs])))} "
                     f"| {fmt(float(np.mean(sps)) if sps else None, 0)} "
                     f"| {fmt_published(row.env, 'CleanRL', steps)} | {fmt_published(row.env, 'ppo2', steps)} |")
    seeds = sorted({r.seed for row in rows for r in row.runs})
    lines += ["", "Each seed's return:", "",
              "| env | variant | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|---|" + "---|" * len(seeds)]
    for row in rows:
        per_seed = {r.seed: f for r, f in zip(row.runs, row.finals)}
        lines.append(f"| {row.env} | {row.label} | " + " | ".join(fmt(per_seed.get(s)) if s in per_seed else ""
                                                             for s in seeds) + " |")
    lines.append("")
    if pois:
        lines += [f"Probability of improvement over `{base}`: P(variant > {base}) over all pairs of seeds (ties count "
                  f"½; 0.5 = no difference), with its 95% bootstrap interval; not given from fewer than "
                  f"{MIN_SEEDS_FOR_CI} seeds a side.", "",
                  "| env | variant | P(improvement) [95% CI] | seeds |", "|---|---|---|---|"]
        for env, label, p, ci, n, m in pois:
            figure = f"n/a (too few seeds)" if p is None else f"{fmt(p)}{fmt_ci(ci, min(n, m))}"
            lines.append(f"| {env} | {label} | {figure} | {n} vs {m} |")
        for label in order:
            ps = [p for _, lab, p, *_ in pois if lab == label and p is not None]
            if len(ps) > 1:
                lines.append(f"| mean over {len(ps)} envs | {label} | {fmt(float(np.mean(ps)))} | |")
        lines.append("")
    lines += ["What each row ran:", ""]
    for label in order:
        env = next(e for e in sorted(envs) if label in envs[e])
        base_runs = envs[env].get(base) or next((envs[e][base] for e in sorted(envs) if base in envs[e]), None)
        lines.append(f"- **{label}**: {describe(label, envs[env][label], base, base_runs)}")
    lines.append("")
    extra = [PUBLISHED_NOTES[k] for k in sorted({published_env(e, "CleanRL") for e in envs} - {None})
             if k in PUBLISHED_NOTES]
    if any(fmt_published(e, "ppo2").endswith("(v2)") for e in envs):
        extra.append("(v2): the published ppo2 MuJoCo runs used the v2 envs.")
    for e in sorted(envs):
        key = published_env(e, "CleanRL")
        if key not in (None, e):
            extra.append(f"{e}: nothing is published for this version; the figures beside it are "
                         f"{key}'s, marked ({key.rsplit('-', 1)[1]}).")
    if any(row.stats.n < MIN_SEEDS_FOR_CI for row in rows):
        extra.append(f"[n/a: N seeds]: no bootstrap interval from fewer than {MIN_SEEDS_FOR_CI} seeds; "
                     "resampling so few values can only restate them.")
    lines += [f"- {n}" for n in notes + extra]
    if notes or extra:
        lines.append("")
    return lines


def compare(runs, baseline=None, window=100, resamples=2000, seed=0, out=None, plots=True, grid_points=200,
            milestones=None, monitor_curves=()):
    """The markdown report of `runs` (and, if `out` and `plots`, the PNGs beside it, the steps plot with the
    curves of `monitor_curves`: (label, folder of one N.monitor.csv folder per env id)), with the milestone tables
    of `milestones` ({env id, or None for the others: scores}). Returns the markdown."""
    short = [r for r in runs if len(r.returns) < window]
    if short:
        warn(f"{len(short)} run(s) have fewer than {window} episodes; their figure is the mean of all their "
             f"episodes (e.g. {short[0].path.name}: {len(short[0].returns)})")
    groups, split_notes = group_runs(runs)
    lines = []
    for script in sorted(groups):
        envs = groups[script]
        labels = {label for env_groups in envs.values() for label in env_groups}
        base = pick_baseline(labels, baseline, script)
        if baseline is not None and base is None:
            warn(f"{script}: no variant named {baseline!r} (it has {', '.join(sorted(labels))})")
        order = ordered_variants(labels, base)
        notes = [n for n in split_notes if n.startswith(f"{script} / ")]
        for env in sorted(envs):
            notes += check_budgets(script, env, envs[env])
        rows = section_rows(envs, order, window, resamples, seed)
        lines += section_table(script, envs, rows, improvements(rows, base, resamples, seed), base, order, notes)
        if milestones:
            lines += milestone_tables(script, rows, milestones, window)
        if out is not None and plots:
            for axis in ("steps", "time"):
                png = plot(script, envs, order, axis, Path(out) / f"{script}_{axis}.png", window, resamples, seed,
                           grid_points, monitor_curves)
                lines += [f"![{script}: return against {axis}]({png.name})", ""]
            png = plot_diagnostics(script, envs, order, Path(out) / f"{script}_diagnostics.png", grid_points)
            if png is not None:
                lines += [f"![{script}: the update's diagnostics against steps]({png.name})", ""]
    return "\n".join(lines)


def figure_grid(nrows, ncols, width, height):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return plt, fig, axes


def save_figure(plt, fig, path):
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot(script, envs, order, axis, path, window, resamples, seed, grid_points=200, monitor_curves=()):
    names = sorted(envs)
    ncols = min(3, len(names))
    plt, fig, axes = figure_grid(math.ceil(len(names) / ncols), ncols, 5.2, 3.8)
    colors = {v: f"C{i % 10}" for i, v in enumerate(order)}
    all_times = [r.wall_time for groups in envs.values() for rs in groups.values() for r in rs]
    scale, unit = (1, "s") if max(all_times) < 120 else (60, "min") if max(all_times) < 7200 else (3600, "h")
    banded = False
    for ax, env in zip(axes.flat, names):
        groups = envs[env]
        for v in order:
            if v not in groups:
                continue
            curve = group_curve(groups[v], axis, grid_points, window, resamples, seed)
            if curve is None:
                warn(f"{script} / {env} / {v}: its seeds share no common range of {axis}; not plotted")
                continue
            g, mean, low, high = curve
            x = g if axis == "steps" else g / scale
            ax.plot(x, mean, color=colors[v], marker="o" if len(x) == 1 else None,
                    label=f"{v} ({len(groups[v])} seed{'' if len(groups[v]) == 1 else 's'})")
            if low is not None:
                ax.fill_between(x, low, high, color=colors[v], alpha=0.2, linewidth=0)
                banded = True
        for label, folder in monitor_curves if axis == "steps" else ():
            if (Path(folder) / env).is_dir():
                steps, returns = monitor_curve(read_monitors(Path(folder) / env), monitor_frameskip(env))
                ax.plot(steps, trailing_mean(returns, window), color="black", linestyle=":", linewidth=1.2,
                        label=f"{label} (Monitor files)")
        longest = max(r.total_steps for rs in groups.values() for r in rs)
        if "CleanRL" in PUBLISHED.get(env, {}) and published_budget_matches(env, longest):
            ax.axhline(PUBLISHED[env]["CleanRL"][0], color="gray", linestyle="--", linewidth=1,
                       label="CleanRL published")
        ax.set_title(env)
        ax.set_xlabel("environment steps" if axis == "steps" else f"wall time ({unit})")
        ax.set_ylabel(f"return (mean of last {window} episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    band = ("band = 95% bootstrap CI" if banded else
            f"no band: a confidence band needs {MIN_SEEDS_FOR_CI} seeds or more")
    if banded and any(len(rs) < MIN_SEEDS_FOR_CI for groups in envs.values() for rs in groups.values()):
        band += f" (none for fewer than {MIN_SEEDS_FOR_CI} seeds)"
    # One column is too narrow for the title on one line.
    fig.suptitle(f"{script}: mean over seeds" + ("\n" if ncols == 1 else ", ") + band)
    return save_figure(plt, fig, path)


def plot_diagnostics(script, envs, order, path, grid_points=200):
    """The update's diagnostics against steps: one row per diagnostic, one column per env, one line per group
    (the mean over its seeds, on the range they all cover). None if no run logged any."""
    tags = [(tag, name) for tag, name in DIAGNOSTICS
            if any(tag in r.diagnostics for groups in envs.values() for rs in groups.values() for r in rs)]
    if not tags:
        return None
    names = sorted(envs)
    plt, fig, axes = figure_grid(len(tags), len(names), max(4.0, 6.4 / len(names)), 2.6)
    colors = {v: f"C{i % 10}" for i, v in enumerate(order)}
    for col, env in enumerate(names):
        for row, (tag, name) in enumerate(tags):
            ax = axes[row, col]
            for v in order:
                rs = [r for r in envs[env].get(v, []) if tag in r.diagnostics]
                if not rs:
                    continue
                lo, hi = max(r.diagnostics[tag][0][0] for r in rs), min(r.diagnostics[tag][0][-1] for r in rs)
                if hi < lo:
                    continue
                g = np.linspace(lo, hi, grid_points) if hi > lo else np.array([lo], dtype=float)
                mean = np.mean([on_grid(*r.diagnostics[tag], g) for r in rs], axis=0)
                ax.plot(g, mean, color=colors[v], marker="o" if len(g) == 1 else None, linewidth=1,
                        label=f"{v} ({len(rs)} seed{'' if len(rs) == 1 else 's'})")
            ax.set_title(f"{env}: {name}", fontsize="small")
            ax.grid(alpha=0.3)
            if row == len(tags) - 1:
                ax.set_xlabel("environment steps")
            if row == 0 and col == 0:
                ax.legend(fontsize="x-small")
    fig.suptitle(f"{script}: the update's diagnostics, mean over seeds")
    return save_figure(plt, fig, path)


def unused_folder(path):
    """path, or path-2, path-3, ... : the first that does not exist."""
    n = 1
    candidate = path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def milestone_scores(text):
    try:
        scores = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not all(math.isfinite(v) for v in scores):
        raise argparse.ArgumentTypeError(f"{text!r}: every score must be a finite number")
    return scores


def env_milestone_scores(text):
    """SCORES or ENV=SCORES -> (env id or None, [score, ...])."""
    env, _, numbers = text.rpartition("=")
    return env or None, milestone_scores(numbers)


def monitor_curve_arg(text):
    label, sep, folder = text.partition("=")
    if not sep or not label or not folder:
        raise argparse.ArgumentTypeError(f"{text!r} is not LABEL=DIR")
    if not Path(folder).is_dir():
        raise argparse.ArgumentTypeError(f"{folder}: no such folder")
    return label, folder


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("logdirs", nargs="*", default=[str(REPO / "benchmarks" / "sweeps")],
                   help="directories searched for event files (default: benchmarks/sweeps)")
    p.add_argument("--script", default="runs",
                   help="script name for runs outside a sweep layout whose logged settings do not name their script "
                        "(default: %(default)s)")
    p.add_argument("--env", action="append", dest="envs", help="only this env id (repeatable)")
    p.add_argument("--variant", action="append", dest="variants", help="only this variant (repeatable)")
    p.add_argument("--baseline", help="variant the others are compared with (default: 'default' if present, "
                                      "else the one named like the script, else the first by name)")
    p.add_argument("--out", help="output directory for comparison.md and the PNGs, which replace any there "
                                 "(default: LOGDIR/report, or report-2, report-3, ... if that exists: a report is "
                                 "never written over unless asked)")
    p.add_argument("--window", type=int, default=100, help="episodes per run's figure (default: %(default)s)")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default: %(default)s)")
    p.add_argument("--include-unfinished", action="store_true",
                   help="also use sweep runs without a done marker")
    p.add_argument("--no-plots", action="store_true", help="only the table")
    p.add_argument("--milestones", type=env_milestone_scores, action="append", default=[],
                   help="scores, comma-separated (e.g. 100,200,300): where each run's curve first reaches each; "
                        "ENV=SCORES gives one env id its own (repeatable)")
    p.add_argument("--monitor-curve", type=monitor_curve_arg, action="append", default=[], dest="monitor_curves",
                   metavar="LABEL=DIR", help="also draw, on the steps plot, the curve of the Stable-Baselines3 run "
                                             "whose N.monitor.csv files are in DIR/{env id}/ (repeatable)")
    args = p.parse_args(argv)
    if args.window < 1 or args.resamples < 1:
        p.error("--window and --resamples must be positive")
    milestones = dict(args.milestones)
    if len(milestones) < len(args.milestones):
        p.error("--milestones: one list of scores per env id (and one for the others)")
    try:
        runs = find_runs(args.logdirs, args.script, args.include_unfinished, args.envs, args.variants)
        for env in sorted(set(milestones) - {None} - {r.env for r in runs}):
            warn(f"--milestones {env}=...: no run of {env}")
        out = Path(args.out) if args.out else unused_folder(Path(args.logdirs[0]) / "report")
        out.mkdir(parents=True, exist_ok=True)
        report = compare(runs, args.baseline, args.window, args.resamples, args.seed, out, not args.no_plots,
                         milestones=milestones, monitor_curves=args.monitor_curves)
    except CompareError as e:
        print(f"compare.py: error: {e}", file=sys.stderr)
        return 1
    (out / "comparison.md").write_text("# PPO benchmark comparison\n\n" + report + "\n")
    print(report)
    print(f"compare.py: wrote {out / 'comparison.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
