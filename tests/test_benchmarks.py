"""Tests of the benchmark tools: benchmarks/sweep.sh (local mode on tiny real runs; stopped, killed and Slurm
sweeps are in test_sweep.py) and benchmarks/compare.py (statistics on hand-checked numbers, bad input on
synthetic event files, a table and plots from the real runs).

The real runs are ppo_discrete.py on CartPole-v1 for 1024 steps (a few seconds each, mostly imports).
"""

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "benchmarks" / "sweep.sh"
SCRIPT = REPO / "ppo_discrete.py"
TINY = ["--total-timesteps", "1024", "--num-envs", "2", "--num-steps", "128"]

sys.path.insert(0, str(REPO / "benchmarks"))  # where compare.py finds layout.py
import layout  # noqa: E402

_spec = importlib.util.spec_from_file_location("compare", REPO / "benchmarks" / "compare.py")
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def sweep(*args, env=None, timeout=240):
    """Run sweep.sh with `args`; the extra environment `env` is added to ours."""
    return subprocess.run(["bash", str(SWEEP), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})}, cwd=REPO)


def event_files(seed_dir):
    return sorted((seed_dir / "runs").rglob("events.out.tfevents.*"))


# ----------------------------------------------------------------------------------------------
# layout.py: the sweep layout, written down once
# ----------------------------------------------------------------------------------------------


def test_layout_paths_round_trip(tmp_path):
    d = layout.seed_dir(tmp_path, "ppo_atari", "bf16", "ALE/Breakout-v5", 3)
    assert d == tmp_path / "ppo_atari" / "bf16" / "ALE_Breakout-v5" / "seed3"
    assert layout.parse_seed_dir(d) == (tmp_path, "ppo_atari", "bf16", "ALE_Breakout-v5", 3)
    assert layout.parse_seed_dir(tmp_path / "a" / "b" / "c" / "seedling") is None
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "layout.py"), "seed-dirs", str(tmp_path),
                          "ppo_discrete", "v", "CartPole-v1,Acrobot-v1", "1,2"], capture_output=True, text=True)
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    assert [(e, s) for e, s, _ in rows] == [("CartPole-v1", "1"), ("CartPole-v1", "2"), ("Acrobot-v1", "1"),
                                            ("Acrobot-v1", "2")]
    assert rows[3][2] == str(layout.seed_dir(tmp_path, "ppo_discrete", "v", "Acrobot-v1", 2))


def test_layout_reads_a_checkpoints_step_from_its_status_file_or_the_checkpoint(tmp_path):
    import torch

    assert layout.checkpoint(tmp_path) is None
    old, new = tmp_path / "runs" / "a" / "checkpoint.pt", tmp_path / "runs" / "b" / "checkpoint.pt"
    for path, step in ((old, 128), (new, 256)):
        path.parent.mkdir(parents=True)
        torch.save({"global_step": step}, path)
    os.utime(old, (1, 1))
    assert layout.checkpoint(tmp_path) == (new, 256)  # the newest, asked itself: no checkpoint.json yet
    (new.parent / "checkpoint.json").write_text('{"global_step": 384}')
    assert layout.checkpoint(tmp_path) == (new, 384)  # the status file is read first
    os.utime(new.parent / "checkpoint.json", (2, 2))  # older than its checkpoint: a kill came between the two
    assert layout.checkpoint(tmp_path) == (new, 256)
    new.write_bytes(b"damaged")
    (new.parent / "checkpoint.json").unlink()
    assert layout.checkpoint(tmp_path) == (new, None)


# ----------------------------------------------------------------------------------------------
# compare.py: statistics on hand-checked numbers
# ----------------------------------------------------------------------------------------------


def test_run_return_is_mean_of_last_100_episodes():
    assert compare.run_return(np.arange(1, 151)) == pytest.approx(100.5)  # mean of 51..150
    assert compare.run_return([1.0, 2.0, 3.0]) == pytest.approx(2.0)  # fewer than 100: all of them
    assert compare.run_return(np.arange(10), last=4) == pytest.approx(7.5)
    with pytest.raises(ValueError):
        compare.run_return([])


def test_group_mean_and_population_std():
    s = compare.group_stats([490.0, 480.0, 500.0], resamples=500)
    assert s.n == 3
    assert s.mean == pytest.approx(490.0)
    assert s.std == pytest.approx(np.sqrt(200 / 3))  # ddof=0: 8.165, not the sample std 10.0
    assert s.iqm == pytest.approx(490.0)  # 3 values: 25% of 3 rounds down to 0 cut at each end
    assert 480.0 <= s.iqm_ci[0] <= 490.0 <= s.iqm_ci[1] <= 500.0


def test_interquartile_mean():
    assert compare.iqm(np.arange(1, 9)) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert compare.iqm([0.0, 1.0, 2.0, 3.0, 100.0]) == pytest.approx(2.0)  # one cut at each end
    assert compare.iqm([5.0, 1.0, 9.0, 3.0, 7.0, 100.0, -50.0, 4.0]) == pytest.approx(4.75)  # 3, 4, 5, 7


def test_iqm_bootstrap_interval():
    x = np.array([10.0, 12.0, 11.0, 13.0, 9.0, 30.0])
    lo, hi = compare.group_stats(x, resamples=2000, seed=1).iqm_ci
    assert x.min() <= lo <= compare.iqm(x) <= hi <= x.max()
    assert compare.group_stats(x, resamples=2000, seed=1).iqm_ci == (lo, hi)  # seeded: reproducible
    assert compare.group_stats([-200.0] * 3).iqm_ci == (-200.0, -200.0)  # constant (MountainCar)
    one = compare.group_stats([7.0])
    assert (one.mean, one.std, one.iqm) == (7.0, 0.0, 7.0) and np.isnan(one.iqm_ci[0])  # no interval from one


def test_probability_of_improvement():
    # pairs (x, y) with x > y: 3>1, 3>2, 4>1, 4>2, 5>1, 5>2, 5>4 (7) and one tie 4=4 (1/2): 7.5 / 9
    assert compare.probability_of_improvement([3, 4, 5], [1, 2, 4]) == pytest.approx(7.5 / 9)
    assert compare.probability_of_improvement([1, 2, 4], [3, 4, 5]) == pytest.approx(1.5 / 9)
    assert compare.probability_of_improvement([2, 2], [2, 2, 2]) == pytest.approx(0.5)
    assert compare.probability_of_improvement([10, 11], [1, 2, 3]) == pytest.approx(1.0)
    p, (lo, hi) = compare.poi_with_ci([3, 4, 5], [1, 2, 4], resamples=1000)
    assert p == pytest.approx(7.5 / 9) and 0.0 <= lo <= p <= hi <= 1.0


def test_published_figures_from_a_longer_budget_are_marked():
    # CleanRL's Atari figure is at 10M steps: beside a 500k-step run it must say so; at the same budget it doesn't
    assert compare.fmt_published("BreakoutNoFrameskip-v4", "CleanRL", 10_000_000) == "414.66 ± 28.09"
    assert compare.fmt_published("BreakoutNoFrameskip-v4", "CleanRL", 500_000) == "414.66 ± 28.09 (at 10M)"
    assert compare.fmt_published("CartPole-v1", "CleanRL", 499_712) == "490.04 ± 6.12"
    assert compare.fmt_published("Hopper-v4", "ppo2", 1_000_000) == "2448.73 ± 596.13 (v2)"
    assert compare.fmt_published("Pendulum-v1", "CleanRL", 1_000_000) == ""
    assert compare.published_budget_matches("Walker2d-v4", 950_000)
    assert not compare.published_budget_matches("PongNoFrameskip-v4", 2_000_000)


def test_curve_helpers():
    np.testing.assert_allclose(compare.trailing_mean([1.0, 2.0, 3.0, 4.0], 2), [1.0, 1.5, 2.5, 3.5])
    np.testing.assert_allclose(compare.trailing_mean([1.0, 2.0, 3.0], 100), [1.0, 1.5, 2.0])
    got = compare.on_grid(np.array([10, 20, 30]), np.array([1.0, 2.0, 3.0]), np.array([0, 10, 15, 30, 40]))
    np.testing.assert_allclose(got, [np.nan, 1.0, 1.0, 3.0, 3.0])
    assert compare.parse_run_name("CartPole-v1__noclip__3__1700000000") == ("CartPole-v1", "noclip", 3, 1700000000)
    assert compare.parse_run_name("ALE/Breakout-v5__default__1__17") == ("ALE/Breakout-v5", "default", 1, 17)
    assert compare.parse_run_name("not-a-run") is None


# ----------------------------------------------------------------------------------------------
# compare.py: bad input, on synthetic event files
# ----------------------------------------------------------------------------------------------


def write_run(run_dir, returns=(), steps=None, sps_steps=(), seconds_per_step=0.01):
    """An event file like the scripts write: charts/episodic_return per episode and charts/SPS per update."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    def scalar(tag, value, step):
        return Event(wall_time=t0 + step * seconds_per_step, step=int(step),
                     summary=Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]))

    t0 = time.time()
    writer = EventFileWriter(str(run_dir))
    steps = np.arange(1, len(returns) + 1) * 10 if steps is None else steps
    for r, s in zip(returns, steps):
        writer.add_event(scalar("charts/episodic_return", r, s))
    for s in sps_steps:
        writer.add_event(scalar("charts/SPS", 1000, s))
    writer.close()


def run_compare(*args):
    """compare.main(args) -> (exit status, stdout, stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = compare.main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def test_compare_missing_or_empty_logdir(tmp_path):
    rc, _, err = run_compare(tmp_path / "nowhere", "--out", tmp_path / "out")
    assert rc == 1 and "no such log directory" in err
    (tmp_path / "empty").mkdir()
    rc, _, err = run_compare(tmp_path / "empty", "--out", tmp_path / "out")
    assert rc == 1 and "no TensorBoard event files" in err
    assert "Traceback" not in err


def test_compare_runs_without_episodes(tmp_path):
    write_run(tmp_path / "runs" / "CartPole-v1__default__1__100", returns=[], sps_steps=[512, 1024])
    rc, _, err = run_compare(tmp_path, "--out", tmp_path / "out")
    assert rc == 1 and "no charts/episodic_return" in err and "no usable runs" in err
    # Beside a good run, the empty one is skipped and the rest is reported.
    write_run(tmp_path / "runs" / "CartPole-v1__default__2__100", returns=[10, 20, 30], sps_steps=[1024])
    (tmp_path / "runs" / "some-other-dir").mkdir()
    write_run(tmp_path / "runs" / "some-other-dir", returns=[1])  # not a run name: skipped with a warning
    (tmp_path / "runs" / "Acrobot-v1__default__1__100").mkdir()
    (tmp_path / "runs" / "Acrobot-v1__default__1__100" / "events.out.tfevents.1.x").write_bytes(b"\x00garbage" * 8)
    rc, out, err = run_compare(tmp_path, "--out", tmp_path / "out", "--no-plots")
    assert rc == 0, err
    assert "| CartPole-v1 | default | 1 | 20.00 (1 seed) |" in out  # no spread from one seed
    assert "some-other-dir" in err and "Traceback" not in err
    assert "Acrobot-v1" not in out


def test_compare_mismatched_step_grids(tmp_path):
    rng = np.random.default_rng(0)
    for seed, n in ((1, 200), (2, 100)):  # seed 2 trained half as long
        write_run(tmp_path / "runs" / f"CartPole-v1__default__{seed}__100", returns=rng.normal(100, 5, n),
                  steps=np.arange(1, n + 1) * 50, sps_steps=np.arange(1, n // 10 + 1) * 500)
    for seed in (1, 2):  # another variant at yet another budget, episodes at other steps
        write_run(tmp_path / "runs" / f"CartPole-v1__noclip__{seed}__100", returns=rng.normal(50, 5, 150),
                  steps=np.arange(1, 151) * 37, sps_steps=[5550])
    out_dir = tmp_path / "out"
    rc, out, err = run_compare(tmp_path, "--out", out_dir, "--script", "ppo_discrete", "--resamples", "200")
    assert rc == 0, err
    assert "different numbers of steps (5000, 10000)" in err
    assert "the variants trained for different numbers of steps" in err
    assert "| CartPole-v1 | default | 2 |" in out and "| CartPole-v1 | noclip | 2 |" in out
    # 50 never beats 100, but from 2 seeds a side P(improvement) can only be 0, 1/4, ... 1: not given
    assert "| CartPole-v1 | noclip | n/a (too few seeds) | 2 vs 2 |" in out
    assert (out_dir / "ppo_discrete_steps.png").stat().st_size > 10_000
    assert (out_dir / "ppo_discrete_time.png").stat().st_size > 10_000


def test_compare_milestones_say_where_each_curve_first_reaches_a_score(tmp_path):
    # Windows of 2 whole episodes: means 5, 15, 25, 35 at the 2nd to 5th episodes (steps 20 to 50). 0 is first
    # reached at step 20 (one episode is no window); 15 at step 30, 35 at step 50; 36 never.
    write_run(tmp_path / "runs" / "CartPole-v1__default__1__100", returns=[0, 10, 20, 30, 40], sps_steps=[50])
    rc, out, err = run_compare(tmp_path, "--out", tmp_path / "out", "--no-plots", "--window", 2,
                               "--milestones", "0,15,35,36")
    assert rc == 0, err
    assert "| env | variant | seed | 0 | 15 | 35 | 36 |" in out
    row = next(line for line in out.splitlines() if line.startswith("| CartPole-v1 | default | 1 | 20 ("))
    assert [cell.split(" (")[0] for cell in row.strip("|").split("|")[3:]] == [" 20", " 30", " 50", " not reached "]
    with pytest.raises(SystemExit):
        run_compare(tmp_path, "--milestones", "100,lots")


def test_compare_milestones_of_each_env_on_its_own_scale(tmp_path):
    # Windows of 2 whole episodes. CartPole: means 15, 25, 25 at steps 20, 30, 40; Acrobot: -15, -10, -5.
    write_run(tmp_path / "runs" / "CartPole-v1__default__1__100", returns=[10, 20, 30, 20], sps_steps=[40])
    write_run(tmp_path / "runs" / "Acrobot-v1__default__1__100", returns=[-20, -10, -10, 0], sps_steps=[40])
    rc, out, err = run_compare(tmp_path, "--out", tmp_path / "out", "--no-plots", "--window", 2,
                               "--milestones", "20,30", "--milestones=Acrobot-v1=-12,-5,0")
    assert rc == 0, err
    tables = [block for block in out.split("\n\n") if block.startswith("| env | variant | seed | ")]
    assert len(tables) == 2, out  # one table per list of scores, each with only its envs
    assert tables[0].splitlines()[0] == "| env | variant | seed | -12 | -5 | 0 |"
    assert [cell.split(" (")[0].strip() for cell in tables[0].splitlines()[2].split("|")[1:-1]] == \
        ["Acrobot-v1", "default", "1", "30", "40", "not reached"]
    assert tables[1].splitlines()[0] == "| env | variant | seed | 20 | 30 |"
    assert [cell.split(" (")[0].strip() for cell in tables[1].splitlines()[2].split("|")[1:-1]] == \
        ["CartPole-v1", "default", "1", "30", "not reached"]
    assert len(tables[0].splitlines()) == len(tables[1].splitlines()) == 3
    # An env with scores of its own but no run is named; one env given two lists is refused.
    rc, _, err = run_compare(tmp_path, "--out", tmp_path / "out", "--no-plots", "--milestones=Pong-v5=0")
    assert rc == 0 and "--milestones Pong-v5=...: no run of Pong-v5" in err
    with pytest.raises(SystemExit):
        run_compare(tmp_path, "--milestones=Acrobot-v1=1", "--milestones=Acrobot-v1=2")


def test_compare_duplicates_and_unfinished_sweep_runs(tmp_path):
    write_run(tmp_path / "runs" / "CartPole-v1__default__1__100", returns=[1.0])
    write_run(tmp_path / "runs" / "CartPole-v1__default__1__200", returns=[2.0])  # same seed, newer
    seed_dir = tmp_path / "sweeps" / "ppo_discrete" / "v" / "CartPole-v1" / "seed1"
    write_run(seed_dir / "runs" / "CartPole-v1__v__1__100", returns=[3.0])  # no done marker yet
    rc, out, err = run_compare(tmp_path, "--out", tmp_path / "out", "--no-plots")
    assert rc == 0, err
    assert "1 run(s) repeat the seed of a run of the same configuration" in err
    assert "| CartPole-v1 | default | 1 | 2.00 (1 seed) |" in out
    assert "left out 1 unfinished sweep run" in err and "| v |" not in out
    rc, out, err = run_compare(tmp_path, "--out", tmp_path / "out", "--no-plots", "--include-unfinished")
    assert "## ppo_discrete" in out and "| CartPole-v1 | v | 1 | 3.00 (1 seed) |" in out
    (seed_dir / "done").write_text("")
    rc, out, err = run_compare(tmp_path / "sweeps", "--out", tmp_path / "out", "--no-plots")
    assert rc == 0 and "| CartPole-v1 | v | 1 | 3.00 (1 seed) |" in out and "unfinished" not in err
    # The scripts and the sweep write the '/' of an env id as '_'.
    ale = tmp_path / "sweeps" / "ppo_atari" / "v" / "ALE_Breakout-v5" / "seed3"
    write_run(ale / "runs" / "ALE_Breakout-v5__v__3__100", returns=[4.0, 6.0])
    (ale / "done").write_text("")
    rc, out, err = run_compare(tmp_path / "sweeps", "--out", tmp_path / "out", "--no-plots")
    assert rc == 0 and "## ppo_atari" in out and "| ALE_Breakout-v5 | v | 1 | 5.00 (1 seed) |" in out
    # CleanRL's run names keep the '/', which adds a directory level below runs/.
    write_run(tmp_path / "cleanrl" / "runs" / "ALE" / "Pong-v5__ppo_atari__1__100", returns=[-20.0, -18.0])
    rc, out, err = run_compare(tmp_path / "cleanrl", "--script", "cleanrl", "--no-plots")
    assert rc == 0 and "| ALE/Pong-v5 | ppo_atari | 1 | -19.00 (1 seed) |" in out, out + err


def write_script_run(run_dir, returns, hparams=None, steps=None):
    """A run as the scripts log it, with torch's SummaryWriter: the `hyperparameters` text (a |param|value|
    table) and one charts/episodic_return per episode."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir))
    if hparams is not None:  # names (each logged as 1) or {name: value}
        hparams = hparams if isinstance(hparams, dict) else dict.fromkeys(hparams, 1)
        writer.add_text("hyperparameters",
                        "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in hparams.items()))
    steps = np.arange(1, len(returns) + 1) * 10 if steps is None else steps
    for r, s in zip(returns, steps):
        writer.add_scalar("charts/episodic_return", r, int(s))
    writer.close()


def args_fields(script):
    """The argument names of a script's Args dataclass, read from its source (what its runs log)."""
    import ast

    tree = ast.parse((REPO / f"{script}.py").read_text())
    args = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args")
    return [n.target.id for n in args.body if isinstance(n, ast.AnnAssign)]


def test_compare_files_plain_runs_under_the_script_they_name(tmp_path):
    runs = tmp_path / "runs"
    # Each script's real argument list, under an exp_name that names nothing (as --exp-name bench did).
    for script, env in (("ppo_discrete", "CartPole-v1"), ("ppo_continuous", "HalfCheetah-v4"),
                        ("ppo_atari", "PongNoFrameskip-v4")):
        write_script_run(runs / f"{env}__bench__1__100", [1.0, 3.0], hparams=args_fields(script))
    # No hyperparameters text (as CleanRL's older runs), but the script's default exp_name.
    write_script_run(runs / "Hopper-v4__ppo_continuous__1__100", [5.0])
    # Nothing tells: --script.
    write_script_run(runs / "Acrobot-v1__mine__1__100", [-90.0], hparams=["seed", "env_id"])
    rc, out, err = run_compare(runs, "--script", "ppo_discrete", "--out", tmp_path / "out", "--no-plots")
    assert rc == 0, err
    sections = {part.split("\n", 1)[0]: part for part in out.split("## ")[1:]}
    assert sorted(sections) == ["ppo_atari", "ppo_continuous", "ppo_discrete"]
    assert "| CartPole-v1 | bench |" in sections["ppo_discrete"] and "| Acrobot-v1 | mine |" in sections["ppo_discrete"]
    assert "| HalfCheetah-v4 | bench |" in sections["ppo_continuous"]
    assert "| Hopper-v4 | ppo_continuous |" in sections["ppo_continuous"]
    assert "| PongNoFrameskip-v4 | bench |" in sections["ppo_atari"]
    assert "HalfCheetah" not in sections["ppo_discrete"] and "Pong" not in sections["ppo_discrete"]
    # Each marker names one script only: the ones checked before it are absent from the later scripts.
    fields = {script: set(args_fields(script)) for script, _ in compare.SCRIPT_MARKERS}
    for i, (script, marker) in enumerate(compare.SCRIPT_MARKERS):
        assert marker in fields[script]
        assert all(marker not in fields[other] for other, _ in compare.SCRIPT_MARKERS[i + 1:])


def test_compare_plots_each_group_on_its_own_range(tmp_path):
    runs = tmp_path / "runs"
    rng = np.random.default_rng(0)
    for seed in (1, 2, 3):  # 500k steps, an episode every 500
        write_run(runs / f"CartPole-v1__long__{seed}__100", returns=rng.normal(400, 10, 1000),
                  steps=np.arange(1, 1001) * 500, sps_steps=[500_000])
    for seed in (1, 2, 3):  # 1,000 steps, well under one point of a 200-point grid over 500k
        write_run(runs / f"CartPole-v1__short__{seed}__100", returns=rng.normal(20, 2, 50),
                  steps=np.arange(1, 51) * 20, sps_steps=[1_000])
    rc, out, err = run_compare(runs, "--script", "ppo_discrete", "--out", tmp_path / "out", "--resamples", "100")
    assert rc == 0, err
    assert "not plotted" not in err
    short = [r for r in compare.find_runs([runs]) if r.variant == "short"]
    grid, mean, low, high = compare.group_curve(short, "steps", 50, 100, 100, 0)
    assert (grid[0], grid[-1], len(grid)) == (20, 1_000, 50)  # its first episode to its end
    np.testing.assert_allclose(mean[-1], np.mean([np.mean(r.returns) for r in short]))  # ends at the table's figure
    assert low is not None and np.all(low <= mean) and np.all(mean <= high)
    # Seeds that share a single step: one point, not nothing.
    one = [r for r in short if r.seed == 1]
    one[0].total_steps = int(one[0].steps[0])
    one[0].steps, one[0].returns, one[0].times = one[0].steps[:1], one[0].returns[:1], one[0].times[:1]
    assert len(compare.group_curve(one, "steps", 50, 100, 100, 0)[0]) == 1


def test_compare_v5_envs_get_the_nearest_published_version(tmp_path):
    assert compare.fmt_published("Hopper-v5", "CleanRL", 1_000_000) == "2382.86 ± 271.74 (v4)"
    assert compare.fmt_published("Hopper-v5", "CleanRL", 500_000) == "2382.86 ± 271.74 (at 1M) (v4)"
    assert compare.fmt_published("Hopper-v5", "ppo2", 1_000_000) == "2448.73 ± 596.13 (v2)"  # its own version
    assert compare.fmt_published("Hopper-v4", "CleanRL", 1_000_000) == "2382.86 ± 271.74"  # no mark for its own
    assert compare.fmt_published("HalfCheetah-v3", "CleanRL") == "1442.64 ± 46.03 (v4)"
    assert compare.fmt_published("ALE/Pong-v5", "CleanRL") == ""  # another env, not another version
    assert compare.fmt_published("Pendulum-v1", "CleanRL") == ""
    for seed in (1, 2, 3):
        write_run(tmp_path / "runs" / f"Hopper-v5__default__{seed}__100", returns=[2000.0 + seed],
                  sps_steps=[1_000_000])
    rc, out, err = run_compare(tmp_path, "--script", "ppo_continuous", "--out", tmp_path / "out", "--no-plots")
    assert rc == 0, err
    row = next(line for line in out.splitlines() if line.startswith("| Hopper-v5 | default | 3 |"))
    assert row.endswith("| 1M | 2.78 h | 1000 | 2382.86 ± 271.74 (v4) | 2448.73 ± 596.13 (v2) |"), row
    assert "Hopper-v5: nothing is published for this version; the figures beside it are Hopper-v4's" in out


def test_compare_gives_no_interval_from_two_seeds(tmp_path):
    for seed in (1, 2):
        write_run(tmp_path / "runs" / f"CartPole-v1__default__{seed}__100", returns=[100.0 * seed])
    for seed in (1, 2, 3):
        write_run(tmp_path / "runs" / f"Acrobot-v1__default__{seed}__100", returns=[-80.0 - seed])
    write_run(tmp_path / "runs" / "MountainCar-v0__default__1__100", returns=[-200.0])
    rc, out, err = run_compare(tmp_path, "--out", tmp_path / "out", "--no-plots")
    assert rc == 0, err
    assert "| CartPole-v1 | default | 2 | 150.00 ± 50.00 | 150.00 [n/a: 2 seeds] |" in out
    assert "| MountainCar-v0 | default | 1 | -200.00 (1 seed) | -200.00 [n/a: 1 seed] |" in out
    assert "| Acrobot-v1 | default | 3 | -82.00 ± 0.82 | -82.00 [-83.00, -81.00] |" in out
    assert "[n/a: N seeds]: no bootstrap interval from fewer than 3 seeds" in out


def test_compare_splits_a_variant_whose_runs_differ_in_their_settings(tmp_path):
    """Runs under one exp_name are seeds of one configuration only if they ran the same settings."""
    runs = tmp_path / "runs"
    base = {"script": "ppo_discrete.py", "learning_rate": 0.001, "ent_coef": 0.0, "progress": True}
    write_script_run(runs / "CartPole-v1__ppo_discrete__1__100", [20.0, 22.0], hparams=base)
    # Another seed, run without progress lines: how a run is operated does not make it another configuration.
    write_script_run(runs / "CartPole-v1__ppo_discrete__2__100", [30.0], hparams={**base, "seed": 2, "progress": False})
    write_script_run(runs / "CartPole-v1__ppo_discrete__3__100", [10.0],
                     hparams={**base, "learning_rate": 1e-05, "ent_coef": 0.5})
    rc, out, err = run_compare(runs, "--out", tmp_path / "out", "--no-plots")
    assert rc == 0, err
    assert "ppo_discrete / CartPole-v1 / ppo_discrete: its runs differ in ent_coef, learning_rate" in err
    assert "| CartPole-v1 | ppo_discrete (ent_coef=0.0, learning_rate=0.001) | 2 | 25.50 ± 4.50 |" in out
    assert "| CartPole-v1 | ppo_discrete (ent_coef=0.5, learning_rate=1e-05) | 1 | 10.00 (1 seed) |" in out
    assert "split into 2 rows" in out  # the report says so too
    assert "differs from `ppo_discrete (ent_coef=0.0, learning_rate=0.001)` in: ent_coef=0.5 (baseline: 0.0), " \
           "learning_rate=1e-05 (baseline: 0.001)" in out


def test_compare_sets_a_copy_of_a_script_beside_its_original(tmp_path):
    """A changed copy (ppo_continuous_mod.py) is compared with the script it was copied from, in one section."""
    sweeps = tmp_path / "sweeps"
    settings = {"ppo_continuous": {"learning_rate": 0.0003}, "ppo_continuous_mod": {"learning_rate": 0.0003,
                                                                                    "aux_coef": 0.5}}
    for script, returns in (("ppo_continuous", [100.0, 110.0, 120.0]), ("ppo_continuous_mod", [200.0, 210.0, 220.0])):
        for seed, value in zip((1, 2, 3), returns):
            d = layout.seed_dir(sweeps, script, "default", "Hopper-v5", seed)
            write_script_run(d / "runs" / f"Hopper-v5__default__{seed}__100", [value],
                             hparams={"script": f"{script}.py", **settings[script]})
            (d / "done").write_text("")
        (layout.variant_dir(sweeps, script, "default") / "sweep_args").write_text("")
    # A plain run of a copy says which file it is.
    write_script_run(tmp_path / "runs" / "Hopper-v5__mine__1__100", [5.0],
                     hparams={"script": "ppo_continuous_mod.py", "norm_obs": True})
    rc, out, err = run_compare(sweeps, tmp_path / "runs", "--out", tmp_path / "out", "--no-plots")
    assert rc == 0, err
    assert out.count("## ") == 1 and "## ppo_continuous\n" in out
    assert "| Hopper-v5 | ppo_continuous_mod/default | 3 | 210.00 ± 8.16 |" in out
    assert "| Hopper-v5 | ppo_continuous_mod/mine | 1 | 5.00 (1 seed) |" in out
    assert "| Hopper-v5 | ppo_continuous_mod/default | 1.00 [" in out  # each seed of the copy beats each original
    assert ("- **ppo_continuous_mod/default**: `ppo_continuous_mod.py`; swept with no extra arguments; differs from "
            "`default` in: aux_coef=0.5 (not a setting of the baseline's script)") in out


def test_compare_never_writes_over_an_earlier_report_and_filters_before_it_warns(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "CartPole-v1__default__1__100", returns=[1.0])
    write_run(runs / "Acrobot-v1__default__1__100", returns=[-90.0])
    write_run(runs / "Acrobot-v1__default__1__200", returns=[-80.0])  # a seed run again
    rc, _, err = run_compare(runs, "--no-plots")
    assert rc == 0 and "1 run(s) repeat the seed" in err and f"wrote {runs / 'report' / 'comparison.md'}" in err
    rc, out, err = run_compare(runs, "--no-plots", "--env", "CartPole-v1")
    assert rc == 0 and f"wrote {runs / 'report-2' / 'comparison.md'}" in err
    assert "repeat" not in err and "Acrobot" not in out  # what --env leaves out is not read, nor warned about
    assert "Acrobot" in (runs / "report" / "comparison.md").read_text()  # the first report is still there
    rc, _, err = run_compare(runs, "--no-plots", "--env", "Pendulum-v1")
    assert rc == 1 and "no runs of the env ids and variants asked for" in err


def test_the_plot_draws_a_band_only_where_it_says_so(tmp_path, monkeypatch):
    import matplotlib.figure

    titles = []
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda self, text, **k: titles.append(text))
    for seeds in ((1, 2), (1, 2, 3)):
        for seed in seeds:
            write_run(tmp_path / f"n{len(seeds)}" / "runs" / f"CartPole-v1__default__{seed}__100",
                      returns=[float(seed)] * 5)
        assert run_compare(tmp_path / f"n{len(seeds)}", "--out", tmp_path / "out", "--resamples", "50")[0] == 0
    assert "no band: a confidence band needs 3 seeds or more" in titles[0]
    assert titles[2].endswith("band = 95% bootstrap CI")  # [1] is the time axis, [2] the 3-seed steps plot


def write_monitors(folder, games_per_env):
    """N.monitor.csv files as Stable-Baselines3 writes them: a JSON header, then r,l,t, one line per game."""
    folder.mkdir(parents=True)
    for i, games in enumerate(games_per_env):
        lines = ['#{"t_start": 0, "env_id": "x"}', "r,l,t"] + [f"{r},{l},0.0" for r, l in games]
        (folder / f"{i}.monitor.csv").write_text("\n".join(lines) + "\n")


def test_compare_draws_a_monitor_file_curve_on_the_steps_plot_only(tmp_path, monkeypatch, capsys):
    import matplotlib.axes

    drawn = []
    real_plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, x, y, **k: drawn.append((k.get("label"), list(x), list(y))) or
                        real_plot(self, x, y, **k))
    write_run(tmp_path / "runs" / "runs" / "CartPole-v1__default__1__100", returns=[1.0] * 5)
    # Two envs in lockstep: env 0's games end at its frames 10 and 30, env 1's at 20; so the run's games end at
    # steps 2 * 10, 2 * 20, 2 * 30 (CartPole: no frameskip), in the order env 0, env 1, env 0.
    write_monitors(tmp_path / "peer" / "CartPole-v1", [[(10.0, 10), (30.0, 20)], [(20.0, 20)]])
    write_monitors(tmp_path / "peer" / "Acrobot-v1", [[(5.0, 5)]])  # an env not compared: not read
    rc, _, err = run_compare(tmp_path / "runs", "--out", tmp_path / "out", "--window", "2",
                             "--monitor-curve", f"The zoo={tmp_path / 'peer'}")
    assert rc == 0, err
    peer = [(x, y) for label, x, y in drawn if label == "The zoo (Monitor files)"]
    assert peer == [([20.0, 40.0, 60.0], [10.0, 15.0, 25.0])]  # once: on the steps plot, not the time plot
    for bad, message in (("nolabel", "'nolabel' is not LABEL=DIR"),
                         (f"x={tmp_path / 'missing'}", f"{tmp_path / 'missing'}: no such folder")):
        with pytest.raises(SystemExit) as exit_info:
            compare.main([str(tmp_path / "runs"), "--monitor-curve", bad])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_monitor_milestones_reads_the_files_in_game_order_and_refuses_bad_ones(tmp_path):
    import contextlib
    import io

    spec = importlib.util.spec_from_file_location("monitor_milestones", REPO / "benchmarks" / "monitor_milestones.py")
    milestones = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(milestones)
    # A NoFrameskip Atari id (the folder's name): 4 frames a step. Env 0's games end at steps 2 * 40 / 4 = 20 and
    # 2 * 120 / 4 = 60, env 1's at 40.
    run = tmp_path / "PongNoFrameskip-v4"
    write_monitors(run, [[(0.0, 40), (30.0, 80)], [(10.0, 80)]])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert milestones.main([str(run), "--window", "2", "--milestones", "5,20,21", "--at", "39,40,60"]) == 0
    assert out.getvalue().splitlines() == [
        "2 envs, 3 games; frames / frameskip: 50", "last 2 games: 20.00",
        "5: 40 steps", "20: 60 steps", "21: not reached",  # scores 0, 10, 30 in that order: means 5, 20
        "at 39: fewer than 2 games", "at 40: 5.00", "at 60: 20.00"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # --frameskip 1 by hand: each frame a step, so steps 80, 160, 240
        assert milestones.main([str(run), "--window", "2", "--milestones", "5", "--frameskip", "1"]) == 0
    assert "5: 160 steps" in out.getvalue().splitlines()
    write_monitors(tmp_path / "bad", [[(1.0, 10)]])
    (tmp_path / "bad" / "0.monitor.csv").write_text('#{}\nr,l,t\n1.0,,0\n')
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert milestones.main([str(tmp_path / "bad")]) == 2
    assert err.getvalue() == f"monitor_milestones.py: error: {tmp_path / 'bad' / '0.monitor.csv'}: a game's r or l " \
                             "is missing or not a number\n"


@pytest.mark.parametrize("script", ["ppo_discrete", "ppo_continuous", "ppo_atari"])
def test_what_compare_leaves_out_of_a_configuration_is_how_the_script_is_operated(script):
    """Every setting of a script is either part of a run's configuration (a hyperparameter) or named by
    compare.NOT_CONFIGURATION (how it was operated), never both: a new operational flag must be added there."""
    from conftest import load_script

    module = load_script(script)
    names = set(args_fields(script))
    configuration = set(module.HYPERPARAMETERS) - {"exp_name", "seed", "env_id"}
    assert not configuration & compare.NOT_CONFIGURATION
    assert names - configuration <= compare.NOT_CONFIGURATION


# ----------------------------------------------------------------------------------------------
# same_values.py: do two runs log the same values?
# ----------------------------------------------------------------------------------------------


def write_scalars(run_dir, tags):
    """A run that logged each {tag: [(step, value), ...]}."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir))
    for tag, points in tags.items():
        for step, value in points:
            writer.add_scalar(tag, value, step)
    writer.close()


def same_values(*args):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "same_values.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


def test_same_values_compares_every_point_or_with_prefix_the_steps_both_runs_have(tmp_path):
    loss = [(s, 0.5 / s) for s in range(1, 11)]
    episodes = [(s, float(s % 3)) for s in range(2, 13, 2)]
    write_scalars(tmp_path / "long", {"losses/value_loss": loss, "charts/episodic_return": episodes,
                                      "charts/SPS": [(s, 100.0 + s) for s in range(1, 11)]})
    # A run still training: its losses reach step 6, its episodes step 8; SPS (the machine) differs.
    write_scalars(tmp_path / "short", {"losses/value_loss": loss[:6], "charts/episodic_return": episodes[:4],
                                       "charts/SPS": [(s, 7.0) for s in range(1, 7)]})
    rc, out = same_values(tmp_path / "long", tmp_path / "long")
    assert rc == 0 and "same values: 2 tags, 16 points" in out, out
    rc, out = same_values(tmp_path / "long", tmp_path / "short")
    assert rc == 1 and "losses/value_loss: 10 and 6 points, first difference at point 6" in out, out
    # Over the steps both have on every tag (up to 6): the losses 1-6 and the episodes at 2, 4, 6.
    rc, out = same_values("--prefix", tmp_path / "long", tmp_path / "short")
    assert rc == 0 and "same values: 2 tags, 9 points up to step 6" in out, out
    # A value that differs within the common steps is found, one beyond them is not compared.
    write_scalars(tmp_path / "moved", {"losses/value_loss": loss[:5] + [(6, 0.1)],
                                       "charts/episodic_return": episodes[:4]})
    rc, out = same_values("--prefix", tmp_path / "long", tmp_path / "moved")
    assert rc == 1 and "losses/value_loss: 6 and 6 points, first difference at point 5" in out, out
    write_scalars(tmp_path / "later", {"losses/value_loss": loss[:6], "charts/episodic_return": episodes[:3] + [(8, 9.0)]})
    rc, out = same_values("--prefix", tmp_path / "long", tmp_path / "later")
    assert rc == 0, out
    rc, out = same_values("--prefix", tmp_path / "long", tmp_path / "nothing")
    assert rc == 2 and out.strip() == f"error: no such run folder: {tmp_path / 'nothing'}", out
    (tmp_path / "empty").mkdir()
    rc, out = same_values(tmp_path / "long", tmp_path / "empty")
    assert rc == 2 and out.strip() == f"error: no scalars in {tmp_path / 'empty'}", out


# ----------------------------------------------------------------------------------------------
# sweep.sh, local mode, on tiny real runs
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """CartPole-v1 seeds 1, 2 (they work) and NoSuchEnv-v0 seeds 1, 2 (they fail), two at a time."""
    out = tmp_path_factory.mktemp("sweeps")
    args = ["-s", SCRIPT, "-e", "CartPole-v1,NoSuchEnv-v0", "--seeds", "1,2", "-j", "2", "-o", out, "--", *TINY]
    result = sweep(*args)
    return {"out": out, "args": args, "result": result, "vdir": out / "ppo_discrete" / "default"}


def test_sweep_runs_in_parallel_and_reports_failures(local_sweep):
    r, vdir = local_sweep["result"], local_sweep["vdir"]
    assert r.returncode == 1, r.stderr  # some runs failed
    for seed in (1, 2):
        d = vdir / "CartPole-v1" / f"seed{seed}"
        assert (d / "done").exists(), (d / "log.txt").read_text()
        events = event_files(d)
        assert len(events) == 1 and events[0].parent.name.startswith(f"CartPole-v1__default__{seed}__")
        first = (d / "log.txt").read_text().splitlines()[0]  # the exact command, runnable as it is
        assert first.startswith(f"cd {d} && OMP_NUM_THREADS=1 ")
        assert f"{SCRIPT} --env-id CartPole-v1 --seed {seed} --exp-name default --save-model " \
               "--checkpoint-minutes 5 --total-timesteps 1024 --num-envs 2 --num-steps 128" in first
    # -j 2: two runs at once, never more (a start is printed before a run begins, its end after it exits).
    running, most = 0, 0
    for line in r.stdout.splitlines():
        running += ("] start " in line) - line.startswith(("sweep.sh: finished ", "sweep.sh: FAILED "))
        most = max(most, running)
    assert most == 2 and running == 0, r.stdout
    for seed in (1, 2):
        d = vdir / "NoSuchEnv-v0" / f"seed{seed}"
        assert not (d / "done").exists()
        assert "NoSuchEnv" in (d / "log.txt").read_text()
        assert f"NoSuchEnv-v0 seed {seed}: exit status 2" in r.stderr and str(d / "log.txt") in r.stderr
    assert "2 finished, 0 skipped (done before), 2 failed" in r.stderr


def test_sweep_dry_run(local_sweep):
    vdir = local_sweep["vdir"]
    r = sweep(*local_sweep["args"][:-len(TINY) - 1], "--dry-run", "--", *TINY)
    assert r.returncode == 0, r.stderr
    assert "# skip (done): CartPole-v1 seed 1" in r.stdout
    lines = [line for line in r.stdout.splitlines() if not line.startswith("#")]
    assert len(lines) == 2 and all("--env-id NoSuchEnv-v0" in line for line in lines)
    assert lines[0].startswith(f"cd {vdir / 'NoSuchEnv-v0' / 'seed1'} && OMP_NUM_THREADS=1 ")
    # Nothing ran: the failed runs' logs are untouched.
    assert "exit status 2" in (vdir / "NoSuchEnv-v0" / "seed1" / "log.txt").read_text()


def test_a_variant_whose_runs_all_failed_can_be_run_again_with_other_arguments(tmp_path):
    """A variant whose runs never reached a checkpoint keeps nothing of its arguments: fixed, it runs again."""
    out = tmp_path / "sweeps"
    failed = sweep("-s", SCRIPT, "-e", "NoSuchEnv-v0", "--seeds", "1", "-o", out, "--", *TINY)
    assert failed.returncode == 1
    vdir = layout.variant_dir(out, "ppo_discrete", "default")
    assert not layout.has_progress(vdir)
    r = sweep("-s", SCRIPT, "-e", "NoSuchEnv-v0", "--seeds", "1", "-o", out, "--dry-run", "--", "--clip-coef", "0.3",
              *TINY)
    assert r.returncode == 0 and "but none of its runs finished or reached a checkpoint" in r.stderr, r.stderr
    # Once a run has got somewhere, other arguments under the same name are refused.
    (layout.seed_dir(out, "ppo_discrete", "default", "NoSuchEnv-v0", 1) / "done").write_text("")
    assert layout.has_progress(vdir)
    r = sweep("-s", SCRIPT, "-e", "NoSuchEnv-v0", "--seeds", "1", "-o", out, "--dry-run", "--", "--clip-coef", "0.3",
              *TINY)
    assert r.returncode == 2 and "was run with the extra arguments" in r.stderr


def test_sweep_usage_errors(local_sweep):
    out = local_sweep["out"]
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "-o", out, "--", "--clip-coef", "100")
    assert r.returncode == 2 and "variant 'default' of ppo_discrete was run with the extra arguments" in r.stderr
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "-v", "a__b", "-o", out)
    assert r.returncode == 2 and "bad --variant" in r.stderr
    r = sweep("-s", "nope.py", "-e", "CartPole-v1", "-o", out)
    assert r.returncode == 2 and "no such script" in r.stderr
    r = sweep("--bogus")
    assert r.returncode == 2 and "unknown option" in r.stderr
    # the same env and seed twice would share one run directory
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1,2,1", "-o", out, "--dry-run")
    assert r.returncode == 2 and "seed 1 is given twice" in r.stderr
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1,Acrobot-v1,CartPole-v1", "-o", out, "--dry-run")
    assert r.returncode == 2 and "env id CartPole-v1 is given twice" in r.stderr
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "--slurm", "--slurm-max-parallel", "0", "-o", out, "--dry-run")
    assert r.returncode == 2 and "--slurm-max-parallel must be a positive integer" in r.stderr
    r = sweep("--help")
    assert r.returncode == 0 and "Usage:" in r.stdout and "--slurm-max-parallel" in r.stdout


def test_sweep_resume_skips_finished_and_restarts_interrupted(local_sweep):
    vdir = local_sweep["vdir"]
    kept = vdir / "CartPole-v1" / "seed1"
    kept_events, kept_done = event_files(kept), (kept / "done").read_text()
    # seed 2 looks like a run that failed before its first checkpoint: no done marker, no checkpoint, a partial
    # run directory left behind. (A run with a checkpoint resumes instead: test_sweep.py.)
    redo = vdir / "CartPole-v1" / "seed2"
    (redo / "done").unlink()
    for ckpt in (redo / "runs").glob("*/checkpoint.pt"):
        ckpt.unlink()
    (redo / "runs" / "CartPole-v1__default__2__1").mkdir()
    (redo / "leftover").write_text("partial")
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1,2", "-j", "2", "-o", local_sweep["out"], "--", *TINY)
    assert r.returncode == 0, r.stderr
    assert "2 runs, 1 already done, 1 to run (0 from a checkpoint)" in r.stderr
    assert event_files(kept) == kept_events and (kept / "done").read_text() == kept_done  # not run again
    assert (redo / "done").exists() and not (redo / "leftover").exists()
    assert [p.parent.name for p in event_files(redo)] != ["CartPole-v1__default__2__1"]
    assert len(event_files(redo)) == 1
    assert "1 finished, 1 skipped (done before), 0 failed" in r.stderr
    assert len((vdir / "sweeps.log").read_text().splitlines()) == 2


@pytest.fixture(scope="module")
def interrupted_sweep(local_sweep):
    """Variant `clip100` (--clip-coef 100): stopped with SIGTERM while running, then started again."""
    out = local_sweep["out"]
    args = ["-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1,2", "-j", "2", "-v", "clip100", "-o", out,
            "--", "--clip-coef", "100", *TINY]
    vdir = out / "ppo_discrete" / "clip100"
    proc = subprocess.Popen(["bash", str(SWEEP), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, start_new_session=True, env={**os.environ, "PYTHON": sys.executable})
    logs = [vdir / "CartPole-v1" / f"seed{s}" / "log.txt" for s in (1, 2)]
    deadline = time.time() + 60
    while not all(p.exists() for p in logs) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)  # the training processes are starting (importing torch)
    proc.send_signal(signal.SIGTERM)
    _, stopped_err = proc.communicate(timeout=60)
    leftovers = []  # processes still working in the sweep's run directories
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and str(vdir) in os.readlink(p / "cwd"):
                leftovers.append(p.name)
        except OSError:
            pass
    info = {"stop_rc": proc.returncode, "stop_err": stopped_err, "leftovers": leftovers,
            "done_after_stop": [(vdir / "CartPole-v1" / f"seed{s}" / "done").exists() for s in (1, 2)]}
    info["result"] = sweep(*args)
    info["vdir"] = vdir
    return info


def test_sweep_interrupted_runs_resume_or_start_over(interrupted_sweep):
    info = interrupted_sweep
    assert info["stop_rc"] == 130, info["stop_err"]
    assert "stopping" in info["stop_err"]
    assert info["leftovers"] == []  # the training processes were stopped too
    assert info["done_after_stop"] == [False, False]
    r = info["result"]
    assert r.returncode == 0, r.stderr
    assert "2 runs, 0 already done, 2 to run" in r.stderr
    for s in (1, 2):
        d = info["vdir"] / "CartPole-v1" / f"seed{s}"
        log = (d / "log.txt").read_text()
        assert (d / "done").exists(), log
        # A run stopped once it was training wrote a checkpoint and resumed from it (a second event file in
        # its run folder); one stopped while still starting up (importing torch) had none and started over.
        resumed = "# resuming from " in log
        assert resumed == ("stopped by SIGTERM at step " in log)
        assert len(event_files(d)) == (2 if resumed else 1)


def test_compare_table_and_plots_from_real_runs(local_sweep, interrupted_sweep, tmp_path):
    out_dir = tmp_path / "report"
    rc, out, err = run_compare(local_sweep["out"], "--out", out_dir, "--resamples", "500")
    assert rc == 0, err
    assert "## ppo_discrete" in out
    rows = [line for line in out.splitlines() if line.startswith("| CartPole-v1 |")]
    assert rows[0].startswith("| CartPole-v1 | default | 2 |")  # the baseline first
    assert rows[1].startswith("| CartPole-v1 | clip100 | 2 |")
    # 1024-step runs beside 500k-step published figures: marked with their budget
    assert all("| 1024 |" in row and "| 490.04 ± 6.12 (at 500k) | 497.54 ± 4.02 (at 500k) |" in row for row in rows[:2])
    assert "Probability of improvement over `default`" in out
    (poi,) = [row for row in rows if row.endswith("| 2 vs 2 |")]
    assert poi.startswith("| CartPole-v1 | clip100 | n/a (too few seeds) |")
    # The figure in the table is the mean over seeds of each run's last-100 mean, read here independently.
    finals = []
    for s in (1, 2):
        run = compare.find_runs([local_sweep["vdir"] / "CartPole-v1" / f"seed{s}"])[0]
        finals.append(np.mean(run.returns[-100:]))
    assert f"| {np.mean(finals):.2f} ± {np.std(finals):.2f} |" in rows[0]
    per_seed = [row for row in rows if row.startswith("| CartPole-v1 | default | ") and row.count("|") == 5]
    assert per_seed == [f"| CartPole-v1 | default | {finals[0]:.2f} | {finals[1]:.2f} |"]  # each seed's figure
    # What each row ran: the sweep's extra arguments, and the settings that differ from the baseline's.
    assert "- **default**: `ppo_discrete.py`; swept with `--total-timesteps 1024 " in out and "; the baseline" in out
    assert "- **clip100**: `ppo_discrete.py`; swept with `--clip-coef 100 " in out
    assert "differs from `default` in: clip_coef=100.0 (baseline: 0.2)" in out
    text = (out_dir / "comparison.md").read_text()
    assert "![ppo_discrete: return against steps](ppo_discrete_steps.png)" in text
    for name in ("ppo_discrete_steps.png", "ppo_discrete_time.png", "ppo_discrete_diagnostics.png"):
        png = out_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "NoSuchEnv" not in out  # failed runs wrote no events


def test_compare_counts_the_training_time_of_a_resumed_run(tmp_path, monkeypatch):
    """A run resumed an hour after it stopped has two event files; its wall time and its curve against time
    count the seconds each process trained, not the hour in between."""
    run_dir = tmp_path / "runs" / "CartPole-v1__default__1__100"
    now = time.time()
    write_run(run_dir, returns=range(10), steps=np.arange(1, 11) * 10)  # ~1 s of events
    monkeypatch.setattr(time, "time", lambda: now + 3600)  # the resumed process, an hour later
    write_run(run_dir, returns=range(10), steps=np.arange(11, 21) * 10)  # from 1.1 to 2 s after its start
    monkeypatch.undo()
    (run,) = compare.find_runs([tmp_path])
    assert 2.9 < run.wall_time < 3.5, run.wall_time
    assert np.all(np.diff(run.times) >= 0) and run.times[-1] <= run.wall_time
    assert 1.0 <= run.times[10] - run.times[9] < 1.5  # the hour is left out; the second process's lead-in is not


def test_compare_reads_the_events_as_tensorboard_does(tmp_path):
    """compare.py's own reader of the event files gives what TensorBoard's EventAccumulator gives: every point of
    every tag, the hyperparameters text, and for a resumed run the purge of what the stopped process logged from
    the resumed one's first step on (its purge_step); a torn last record, as a kill mid-write leaves, ends the
    file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    run_dir = tmp_path / "runs" / "CartPole-v1__default__1__100"
    writer = SummaryWriter(str(run_dir))
    writer.add_text("hyperparameters", "first process")
    for step in range(100, 1001, 100):
        writer.add_scalar(compare.RETURN_TAG, step / 100, step)
        writer.add_scalar(compare.SPS_TAG, step + 0.5, step)
        writer.add_scalar("losses/value_loss", -step, step)
    writer.close()
    writer = SummaryWriter(str(run_dir), purge_step=500)  # resumed from a checkpoint at step 500
    writer.add_text("hyperparameters", "second process")
    for step in range(500, 901, 50):
        writer.add_scalar(compare.RETURN_TAG, -step / 100, step)
    writer.close()

    def points(events):
        return [(e.step, e.wall_time, e.value) for e in events]

    def as_tensorboard_reads_it():
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        last = max(acc.Scalars(tag)[-1].wall_time for tag in acc.Tags()["scalars"] if acc.Scalars(tag))
        return (points(acc.Scalars(compare.RETURN_TAG)), points(acc.Scalars(compare.SPS_TAG)),
                points(acc.Scalars("losses/value_loss")), acc.FirstEventTimestamp(), last,
                acc.Tensors(compare.HPARAMS_TAG)[0].tensor_proto.string_val[0].decode())

    def as_compare_reads_it():
        episodes, sps, first, last, hparams, diagnostics = compare.load_events(run_dir)
        return points(episodes), points(sps), points(diagnostics["losses/value_loss"]), first, last, hparams

    read = as_compare_reads_it()
    assert read == as_tensorboard_reads_it()
    assert [step for step, _, _ in read[0]] == [100, 200, 300, 400, *range(500, 901, 50)]
    assert [value for _, _, value in read[0]][3:5] == [4.0, -5.0]  # step 500 as the resumed process logged it
    assert [step for step, _, _ in read[1]] == [step for step, _, _ in read[2]] == [100, 200, 300, 400]
    assert read[1][0][2] == 100.5 and read[5] == "first process"

    last_file = sorted(run_dir.glob("events.out.tfevents.*"))[-1]
    last_file.write_bytes(last_file.read_bytes()[:-3])  # the last return's record torn
    torn = as_compare_reads_it()
    assert torn == as_tensorboard_reads_it()
    assert torn[0] == read[0][:-1] and torn[1:3] == read[1:3]


def test_clip_gif_makes_a_small_gif_or_refuses(tmp_path):
    spec = importlib.util.spec_from_file_location("clip_gif", REPO / "benchmarks" / "clip_gif.py")
    clip_gif = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(clip_gif)
    from moviepy import ImageSequenceClip
    from PIL import Image

    frames = [np.full((60, 80, 3), 10 * i, dtype=np.uint8) for i in range(25)]  # 1 s at 25 fps, 80x60
    ImageSequenceClip(frames, fps=25).write_videofile(str(tmp_path / "in.mp4"), logger=None)
    clip_gif.main([str(tmp_path / "in.mp4"), str(tmp_path / "out.gif"), "--fps", "10", "--width", "40"])
    gif = Image.open(tmp_path / "out.gif")
    assert gif.size == (40, 30) and gif.n_frames == 10
    with pytest.raises(SystemExit, match="--max-kb 1"):
        clip_gif.main([str(tmp_path / "in.mp4"), str(tmp_path / "big.gif"), "--max-kb", "1"])
    assert not (tmp_path / "big.gif").exists()


def test_sweep_checks_the_extra_arguments_once_before_any_run(tmp_path):
    """A typo after -- is one error line from the script's own check, before any run or record of the variant."""
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "-n", 2, "-v", "typo", "-o", tmp_path, "--", "--total-timestep", 20000)
    assert r.returncode == 2
    assert "error: unknown flag --total-timestep; did you mean --total-timesteps?" in r.stderr
    assert [line for line in r.stderr.splitlines() if "error" in line] == [r.stderr.strip().splitlines()[-1]]
    assert not (tmp_path / "ppo_discrete").exists()  # no sweep_args: the corrected command is not refused
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "-n", 2, "-v", "typo", "-o", tmp_path, "--dry-run", "--",
              "--total-timesteps", 20000)
    assert r.returncode == 0, r.stderr
