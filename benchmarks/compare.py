"""Compare PPO runs: a markdown table and learning-curve plots from the TensorBoard events the scripts write.

    python benchmarks/compare.py                          # everything under benchmarks/sweeps
    python benchmarks/compare.py benchmarks/sweeps/ppo_discrete --baseline default
    python benchmarks/compare.py runs --script ppo_discrete --out /tmp/report
    python benchmarks/compare.py --help

What is read. Every directory holding `events.out.tfevents.*` files is a run. Its name, as the scripts make
it, is `{env_id}__{exp_name}__{seed}__{unix_time}` under a `runs/` directory (the scripts write the `/` of an
id like `ALE/Breakout-v5` as `_`; a name that keeps it, as CleanRL's do, adds a directory level and is read
too). The exp_name is the *variant*. The *script* comes from the
layout of benchmarks/sweep.sh, `{outdir}/{script}/{variant}/{env}/seed{N}/runs/{run}`; outside that layout
(a plain `runs/` directory) from what the run itself says: the `hyperparameters` text each script logs lists
its arguments, and only ppo_atari.py has `env_path`, only ppo_continuous.py has `norm_obs`, and of the rest
only ppo_discrete.py has `eval_greedy`; failing that, an exp_name that is one of the script names (their
default); failing that, `--script`. Runs of the same script, env and variant are one group; their seeds are
the samples. Sweep runs without the sweep's `done` marker (still running,
interrupted, failed) are left out unless --include-unfinished. If one (script, env, variant, seed) appears
twice, the newest run is used.

What is computed, following the field's convention (CleanRL; Huang et al. 2022) and Agarwal et al. (2021,
"Deep RL at the edge of the statistical precipice", the rliable library), with scipy doing the statistics:
- per run: the mean of the last 100 training episodes' `charts/episodic_return` (--window);
- per group: mean +- population std (ddof=0) over seeds, as CleanRL and the PPO papers report; and the
  interquartile mean (scipy.stats.trim_mean, 25% cut at each end) with a 95% percentile-bootstrap
  confidence interval (scipy.stats.bootstrap). With 2 seeds or fewer the table gives no interval
  ("n/a: 2 seeds"): resampling two values can only return them, so the interval would mean nothing;
- between a variant X and the baseline Y on one env: the probability of improvement P(X > Y), the
  Mann-Whitney U statistic over all pairs of seeds divided by their number (ties count one half;
  scipy.stats.mannwhitneyu), with a 95% bootstrap interval (none when either side has 2 seeds or fewer); its
  mean over envs is the overall figure.

Published figures (CleanRL, openai/baselines ppo2; see PUBLISHED) stand beside ours. One from a longer budget
is marked with it ("(at 10M)"). An env version with no published figure (Hopper-v5) gets the nearest
published version's figure, marked with that version ("(v4)"); the plots draw the published line only for
the same env id at a matching budget, so such figures stay in the table.

Written to --out (default: the first log dir's `report/`): `comparison.md` (also printed) and, per script,
`{script}_steps.png` and `{script}_time.png`: return against environment steps and against wall time, one
panel per env, one line per variant. A line is the mean over seeds of each run's trailing mean of the last
--window episodes (so its end is the table's figure), read off on a grid of steps (or seconds) of its own
that spans the range all its seeds cover (from the latest first episode to where the shortest seed stops),
so a short variant is drawn however long the others are; the band is the 95% bootstrap confidence interval
of that mean (none with 2 seeds or fewer).
Wall time is measured from the moment the run opened its event file. A resumed run has one event file per
process that trained it; its wall time is the sum of their spans, so the time it spent stopped (waiting in a
queue, between sessions) does not count, and each episode is placed on that running clock.
"""

import argparse
import logging
import math
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import stats

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
# The scripts, each with an argument only it logs in its `hyperparameters` text (checked in this order:
# ppo_atari.py also has eval_greedy). A run outside a sweep layout is filed under the script it names.
SCRIPT_MARKERS = [("ppo_atari", "env_path"), ("ppo_continuous", "norm_obs"), ("ppo_discrete", "eval_greedy")]
HPARAMS_TAG = "hyperparameters/text_summary"  # where SummaryWriter.add_text("hyperparameters", ...) goes


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
    notes: list = field(default_factory=list)


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
    # Sweep layout: {outdir}/{script}/{variant}/{env}/seed{N}/runs/{run}
    if runs_dir is not None and len(runs_dir.parts) >= 5:
        seed_d, variant_d, script_d = runs_dir.parent, runs_dir.parents[2], runs_dir.parents[3]
        if seed_d.name == f"seed{parsed[2]}" and variant_d.name == parsed[1]:
            script, seed_dir = script_d.name, seed_d
    return parsed, script, seed_dir


def script_from_run(hparams, variant):
    """The script a run came from, by what the run says (None if it says nothing we know): the arguments in
    its `hyperparameters` text, else an exp_name left at its default, the script's name."""
    # The text is a markdown table, one `|name|value|` row per argument.
    names = {row.split("|")[1].strip() for row in hparams.splitlines() if row.count("|") >= 3}
    for script, marker in SCRIPT_MARKERS:
        if marker in names:
            return script
    if variant in {script for script, _ in SCRIPT_MARKERS}:
        return variant
    return None


def process_spans(run_dir):
    """(first, last) event time of each event file of a run, sorted: one per process that trained it (a run
    resumed twice has three). The gaps between them are time the run was stopped."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    spans = []
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        times = [event.wall_time for event in EventFileLoader(str(path)).Load()]
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
    """(episode scalar events, SPS events, first event time, last event time, hyperparameters text) of one
    run directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # A resumed run's event file starts again from its checkpoint's step, and TensorBoard drops what the stopped
    # process logged past it: meant (the scripts' purge_step), so not worth the warning it logs per resume.
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})  # 0: keep every point
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    hparams = ""
    if HPARAMS_TAG in acc.Tags().get("tensors", []):
        texts = acc.Tensors(HPARAMS_TAG)[0].tensor_proto.string_val
        hparams = texts[0].decode("utf-8", "replace") if texts else ""
    episodes = acc.Scalars(RETURN_TAG) if RETURN_TAG in tags else []
    sps = acc.Scalars(SPS_TAG) if SPS_TAG in tags else []
    last = max([e.wall_time for tag in tags for e in acc.Scalars(tag)[-1:]], default=math.nan)
    try:
        first = acc.FirstEventTimestamp()
    except ValueError:
        first = math.nan
    return episodes, sps, first, last, hparams


def find_runs(logdirs, default_script="runs", include_unfinished=False):
    """All runs with at least one episode under the log dirs; bad runs are skipped with a warning."""
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
    runs, unfinished = {}, []
    for run_dir in sorted(event_dirs):
        where = locate(run_dir, default_script)
        if where is None:
            warn(f"skipping {run_dir}: its name is not {{env}}__{{variant}}__{{seed}}__{{time}}")
            continue
        (env, variant, seed, start), script, seed_dir = where
        if seed_dir is not None and not (seed_dir / "done").exists() and not include_unfinished:
            unfinished.append(run_dir)
            continue
        try:
            episodes, sps, first, last, hparams = load_events(run_dir)
        except Exception as e:  # a truncated or corrupt event file
            warn(f"skipping {run_dir}: cannot read its events ({type(e).__name__}: {e})")
            continue
        if not episodes:
            warn(f"skipping {run_dir}: no {RETURN_TAG} values (it did not finish a single episode)")
            continue
        if seed_dir is None:  # not in a sweep layout: the run's own record names its script
            script = script_from_run(hparams, variant) or default_script
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
            wall_time=float(wall_time), sps=float(sps[-1].value) if sps else math.nan,
        )
        key = (script, env, variant, seed)
        if key in runs:
            old = runs[key]
            newer, older = (run, old) if (run.start, str(run.path)) > (old.start, str(old.path)) else (old, run)
            warn(f"{script} / {env} / {variant} / seed {seed} appears twice; using {newer.path}, "
                 f"not {older.path}")
            run = newer
        runs[key] = run
    if unfinished:
        warn(f"left out {len(unfinished)} unfinished sweep run(s) without a done marker "
             f"(--include-unfinished takes them): " + ", ".join(str(p) for p in unfinished[:5])
             + (" ..." if len(unfinished) > 5 else ""))
    if not runs:
        raise CompareError("no usable runs (see the warnings above)")
    return list(runs.values())


# ----------------------------------------------------------------------------------------------
# Curves
# ----------------------------------------------------------------------------------------------


def trailing_mean(values, window):
    """Mean of the last `window` values up to and including each position (fewer at the start)."""
    c = np.concatenate([[0.0], np.cumsum(values, dtype=float)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


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


def compare(runs, baseline=None, window=100, resamples=2000, seed=0, out=None, plots=True, grid_points=200):
    """The markdown report of `runs` (and, if `out` and `plots`, the PNGs beside it). Returns the markdown."""
    short = [r for r in runs if len(r.returns) < window]
    if short:
        warn(f"{len(short)} run(s) have fewer than {window} episodes; their figure is the mean of all their "
             f"episodes (e.g. {short[0].path.name}: {len(short[0].returns)})")
    lines = []
    by_script = {}
    for r in runs:
        by_script.setdefault(r.script, {}).setdefault(r.env, {}).setdefault(r.variant, []).append(r)
    for script in sorted(by_script):
        envs = by_script[script]
        variants = {v for groups in envs.values() for v in groups}
        base = pick_baseline(variants, baseline, script)
        if baseline is not None and base is None:
            warn(f"{script}: no variant named {baseline!r} (it has {', '.join(sorted(variants))})")
        order = ordered_variants(variants, base)
        lines += [f"## {script}", ""]
        lines += ["Return: mean of the last 100 training episodes of each run; mean ± population std over seeds, "
                  "and the interquartile mean with its 95% bootstrap confidence interval. Published figures "
                  "(3 seeds, same convention) beside ours.", ""]
        lines += ["| env | variant | seeds | return (mean ± std) | IQM [95% CI] | steps | wall time | SPS "
                  "| CleanRL | baselines ppo2 |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        notes, poi_rows, pois = [], [], {v: [] for v in order if v != base}
        for env in sorted(envs):
            groups = {v: sorted(envs[env][v], key=lambda r: r.seed) for v in order if v in envs[env]}
            notes += check_budgets(script, env, groups)
            finals = {v: np.array([run_return(r.returns, window) for r in rs]) for v, rs in groups.items()}
            for v, rs in groups.items():
                s = group_stats(finals[v], resamples, seed)
                ci = fmt_ci(s.iqm_ci, s.n)
                sps = [r.sps for r in rs if np.isfinite(r.sps)]
                steps = int(np.median([r.total_steps for r in rs]))
                lines.append(
                    f"| {env} | {v} | {s.n} | {fmt(s.mean)} ± {fmt(s.std)} | {fmt(s.iqm)}{ci} "
                    f"| {fmt_steps(steps)} "
                    f"| {fmt_time(float(np.mean([r.wall_time for r in rs])))} "
                    f"| {fmt(float(np.mean(sps)) if sps else None, 0)} "
                    f"| {fmt_published(env, 'CleanRL', steps)} | {fmt_published(env, 'ppo2', steps)} |")
            if base in finals:
                for v in finals:
                    if v == base:
                        continue
                    p, poi_ci = poi_with_ci(finals[v], finals[base], resamples, seed)
                    pois[v].append(p)
                    ci = fmt_ci(poi_ci, min(len(finals[v]), len(finals[base])))
                    poi_rows.append(f"| {env} | {v} | {fmt(p)}{ci} | {len(finals[v])} vs {len(finals[base])} |")
        lines.append("")
        if poi_rows:
            lines += [f"Probability of improvement over `{base}`: P(variant > {base}) over all pairs of seeds "
                      "(ties count ½; 0.5 = no difference), with its 95% bootstrap interval.", "",
                      "| env | variant | P(improvement) [95% CI] | seeds |", "|---|---|---|---|"]
            lines += poi_rows
            for v, ps in pois.items():
                if len(ps) > 1:
                    lines.append(f"| mean over {len(ps)} envs | {v} | {fmt(float(np.mean(ps)))} | |")
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
        if any(len(rs) < MIN_SEEDS_FOR_CI for groups in envs.values() for rs in groups.values()):
            extra.append(f"[n/a: N seeds]: no bootstrap interval from fewer than {MIN_SEEDS_FOR_CI} seeds; "
                         "resampling so few values can only restate them.")
        for n in notes + extra:
            lines.append(f"- {n}")
        if notes or extra:
            lines.append("")
        if out is not None and plots:
            for axis in ("steps", "time"):
                png = plot(script, envs, order, axis, Path(out) / f"{script}_{axis}.png", window, resamples, seed,
                           grid_points)
                lines += [f"![{script}: return against {axis}]({png.name})", ""]
    return "\n".join(lines)


def plot(script, envs, order, axis, path, window, resamples, seed, grid_points=200):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(envs)
    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False)
    colors = {v: f"C{i % 10}" for i, v in enumerate(order)}
    all_times = [r.wall_time for groups in envs.values() for rs in groups.values() for r in rs]
    scale, unit = (1, "s") if max(all_times) < 120 else (60, "min") if max(all_times) < 7200 else (3600, "h")
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
    fig.suptitle(f"{script}: mean over seeds, band = 95% bootstrap CI")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
    p.add_argument("--out", help="output directory for comparison.md and the PNGs (default: LOGDIR/report)")
    p.add_argument("--window", type=int, default=100, help="episodes per run's figure (default: %(default)s)")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default: %(default)s)")
    p.add_argument("--include-unfinished", action="store_true",
                   help="also use sweep runs without a done marker")
    p.add_argument("--no-plots", action="store_true", help="only the table")
    args = p.parse_args(argv)
    if args.window < 1 or args.resamples < 1:
        p.error("--window and --resamples must be positive")
    try:
        runs = find_runs(args.logdirs, args.script, args.include_unfinished)
        if args.envs:
            runs = [r for r in runs if r.env in args.envs]
        if args.variants:
            runs = [r for r in runs if r.variant in args.variants]
        if not runs:
            raise CompareError("no runs left after --env/--variant")
        out = Path(args.out) if args.out else Path(args.logdirs[0]) / "report"
        out.mkdir(parents=True, exist_ok=True)
        report = compare(runs, args.baseline, args.window, args.resamples, args.seed, out, not args.no_plots)
    except CompareError as e:
        print(f"compare.py: error: {e}", file=sys.stderr)
        return 1
    (out / "comparison.md").write_text("# PPO benchmark comparison\n\n" + report + "\n")
    print(report)
    print(f"compare.py: wrote {out / 'comparison.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
