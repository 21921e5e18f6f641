"""benchmarks/tune.py on a tiny budget: a study finishes and reports, resumes its cut trial after a stop and after
a kill, prunes a hopeless trial inside its runs, and refuses bad input with one line before any trial.

The runs are ppo_discrete.py on CartPole-v1, a few thousand steps each.
"""

import fcntl
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
TUNE = REPO / "benchmarks" / "tune.py"
SCRIPT = REPO / "ppo_discrete.py"
TINY = ["--num-envs", "2", "--num-steps", "128", "--num-minibatches", "2", "--update-epochs", "2"]
SPACE = ["--space", "learning_rate=log:1e-4:1e-2", "--space", "norm_adv=true,false"]

sys.path.insert(0, str(REPO / "benchmarks"))
import compare  # noqa: E402


def tune_args(out, *more, trials=3, steps=2048, extra=()):
    return ["-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1,2", "--trials", trials, *SPACE,
            "--bounds", "CartPole-v1=0:500", "-o", out, "--study", "s", "--poll-seconds", "0.5", "--startup-trials", 1,
            *more, "--", "--total-timesteps", steps, *TINY, *extra]


def tune(*args, timeout=600):
    return subprocess.run([sys.executable, str(TUNE), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def start(*args):
    return subprocess.Popen([sys.executable, str(TUNE), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True)


def trials(folder):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(str(folder / "journal.log")))
    return optuna.load_study(study_name="study", storage=storage).get_trials()


def seed_dirs(folder, number):
    return sorted((folder / "sweeps" / "ppo_discrete" / f"trial-{number:04d}" / "CartPole-v1").glob("seed*"))


def test_a_study_finishes_and_reports_every_trial_on_the_same_seeds(tmp_path):
    r = tune(*tune_args(tmp_path, "--pruner", "none"))
    assert r.returncode == 0, r.stdout + r.stderr
    folder = tmp_path / "s"
    done = trials(folder)
    assert [t.state.name for t in done] == ["COMPLETE"] * 3
    for t in done:
        # Every trial ran the same seeds, and its value is the mean over them of the normalised last-100 figure
        # of each run, read here from the events with compare.py.
        assert [d.name for d in seed_dirs(folder, t.number)] == ["seed1", "seed2"]
        figures = [compare.run_return(run.returns) for run in compare.find_runs([folder / "sweeps" / "ppo_discrete"
                                                                                 / f"trial-{t.number:04d}"])]
        assert t.value == pytest.approx(np.mean([f / 500 for f in figures]), rel=1e-9)
        assert t.user_attrs["flags"].startswith("--learning-rate ")
    report = (folder / "report" / "report.md").read_text()
    best = max(done, key=lambda t: t.value)
    assert f"## Best: trial {best.number}, value {best.value:.4f}" in report
    assert "| CartPole-v1 | 1 | " in report and "| CartPole-v1 | 2 | " in report  # its per-seed scores
    assert f"-v tuned-trial-{best.number} -- --total-timesteps 2048 " in report and "--seeds 3,4,5,6,7" in report
    assert all(f"| {t.number} | complete | {t.value:.4f} |" in report for t in done)
    for png in ("history.png", "importances.png"):
        assert (folder / "report" / png).read_bytes()[:4] == b"\x89PNG"
    # The study is a sweep that compare.py reads as it is, one row per trial.
    rc = compare.main([str(folder / "sweeps"), "--no-plots", "--out", str(tmp_path / "cmp")])
    assert rc == 0 and "| CartPole-v1 | trial-0002 | 2 |" in (tmp_path / "cmp" / "comparison.md").read_text()
    # Asked again, a finished study runs nothing more.
    again = tune(*tune_args(tmp_path, "--pruner", "none"))
    assert again.returncode == 0 and not re.search(r"trial \d+:", again.stdout), again.stdout
    assert len(trials(folder)) == 3


def log_text(seed_dir):
    try:
        return (seed_dir / "log.txt").read_text()
    except FileNotFoundError:
        return ""


def wait_for(predicate, proc, timeout=180):
    deadline = time.time() + timeout
    while not predicate():
        if proc.poll() is not None or time.time() > deadline:
            out, err = proc.communicate(timeout=60) if proc.poll() is not None else ("", "")
            pytest.fail(f"gave up waiting (tune exit {proc.returncode})\n{out}\n{err}")
        time.sleep(0.2)


def test_a_stopped_or_killed_worker_leaves_its_trial_to_be_resumed_not_failed(tmp_path):
    steps = 12288
    args = tune_args(tmp_path, "--pruner", "none", trials=1, steps=steps, extra=["--checkpoint-every", "2"])
    folder = tmp_path / "s"

    def checkpointed(number):
        return lambda: any(True for d in seed_dirs(folder, number) for _ in d.glob("runs/*/checkpoint.json"))

    # Stopped (SIGTERM): its runs write checkpoints; the worker says so and exits 130.
    proc = start(*args)
    wait_for(checkpointed(0), proc)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "stopped by SIGTERM: trial 0's runs wrote checkpoints" in out
    assert [t.state.name for t in trials(folder)] == ["RUNNING"]
    params = trials(folder)[0].params

    # Killed outright while it runs the resumed trial: its sweep stops the runs with checkpoints, and lets the
    # trial's lock go once they have exited.
    proc = start(*args)
    # A seed that had no checkpoint yet starts over: the sweep wipes and rewrites its log while this polls.
    wait_for(lambda: any("# resuming from " in log_text(d) for d in seed_dirs(folder, 0)), proc)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    with open(folder / ".trial-0000.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits for the sweep and its runs to be gone
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert [t.state.name for t in trials(folder)] == ["RUNNING"]

    r = tune(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    done = trials(folder)
    assert [t.state.name for t in done] == ["COMPLETE"]  # resumed and finished, not counted as failed
    assert done[0].params == params  # resumed with the settings it was drawn with
    log = "".join((d / "log.txt").read_text() for d in seed_dirs(folder, 0))
    assert "# resuming from " in log  # its runs went on from their checkpoints
    for t in done:
        for d in seed_dirs(folder, t.number):
            assert (d / "done").exists()
            assert json.loads(next(d.glob("runs/*/checkpoint.json")).read_text())["global_step"] == steps


def test_a_hopeless_trial_is_pruned_inside_its_runs_and_its_partial_scores_kept(tmp_path):
    # No trial reaches a normalised 5: the threshold pruner stops the first at its first rung.
    r = tune(*tune_args(tmp_path, "--pruner", "threshold:5", "--warmup-rungs", "0", "--rungs", "4", trials=1,
                        steps=65536, extra=["--checkpoint-every", "1"]))
    assert r.returncode == 0, r.stdout + r.stderr
    folder = tmp_path / "s"
    (t,) = trials(folder)
    assert t.state.name == "PRUNED" and list(t.intermediate_values) == [1]
    assert t.user_attrs["pruned_at"] == "rung 1 of 4 (step 16384)"
    assert "trial 0: pruned at rung 1 of 4" in r.stdout
    for key, run in t.user_attrs["runs"].items():
        assert not run["finished"] and 16384 <= run["steps"] < 65536, (key, run)  # stopped inside the run
        assert run["score"] > 0
    for d in seed_dirs(folder, 0):
        assert not (d / "done").exists() and list(d.glob("runs/*/checkpoint.pt"))
    report = (folder / "report" / "report.md").read_text()
    assert "| 0 | pruned |" in report and "pruned at rung 1 of 4 (step 16384); scores as far as its runs got" in report


@pytest.mark.parametrize("space, message", [
    ("bogus=0:1", "the script has no setting 'bogus'"),
    ("learning_rate=1e-3:1e-4", "the range is empty"),
    ("gamma=0.5:1.5", "the script refuses `--total-timesteps 2048 "),
    ("seed=int:1:5", "seed is not a hyperparameter of ppo_discrete.py"),
    ("num_minibatches=int:2.5:4", "an integer range needs integer bounds"),
    ("learning_rate=log:0:1", "a log range must be above 0"),
    ("total_timesteps=int:1000:2000", "total_timesteps is not a hyperparameter of ppo_discrete.py"),
    ("num_minibatches=2,4.5", "num_minibatches takes integers"),
    ("norm_adv=0:1", "norm_adv is a bool setting: its values are true,false"),
])
def test_bad_input_is_one_line_before_any_trial(tmp_path, space, message):
    r = tune("-s", SCRIPT, "-e", "CartPole-v1", "--space", space, "--bounds", "CartPole-v1=0:500", "-o", tmp_path / "o",
             "--", "--total-timesteps", 2048)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("tune.py: error: ") and message in r.stderr
    if space.startswith("gamma"):
        assert "--gamma 1.5 is out of range" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_study_is_not_continued_with_other_settings(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "study.json").write_text(json.dumps({"space_specs": []}))  # stands for another study's
    spec = importlib.util.spec_from_file_location("tune_module", TUNE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    definition = {k: "other" for k in module.SAME_STUDY} | {"bounds": {}, "bounds_from": {}}
    (tmp_path / "s" / "study.json").write_text(json.dumps(definition))
    r = tune(*tune_args(tmp_path))
    assert r.returncode == 2 and "is a study of other settings (script, envs, seeds, space" in r.stderr
    assert json.loads((tmp_path / "s" / "study.json").read_text()) == definition  # left as it was


def test_slurm_workers_run_the_same_command(tmp_path):
    r = tune(*tune_args(tmp_path, "--slurm-workers", 3, "--slurm-time", "01:00:00", "--dry-run"))
    assert r.returncode == 0, r.stderr
    assert "--array 0-2" in r.stdout and "--signal B:USR1@120" in r.stdout and "--time 01:00:00" in r.stdout
    worker = next(line for line in r.stdout.splitlines() if line.startswith("exec "))
    assert "--slurm" not in worker and "--dry-run" not in worker and " -- --total-timesteps 2048 " in worker


def load_tune():
    spec = importlib.util.spec_from_file_location("tune_module", TUNE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_documented_form_of_the_search_space_parses_as_documented():
    tune_module = load_tune()
    kinds = {"learning_rate": float, "num_minibatches": int, "norm_adv": bool}
    parse = tune_module.parse_setting
    assert parse("learning_rate=log:1e-4:1e-2", kinds) == {"name": "learning_rate", "kind": "float", "low": 1e-4,
                                                            "high": 1e-2, "log": True}
    assert parse("learning_rate = -0.1: 0.1", kinds)["low"] == -0.1  # spaces, as a --space-file may have them
    assert parse("num_minibatches=int:log:2:32", kinds) == {"name": "num_minibatches", "kind": "int", "low": 2,
                                                             "high": 32, "log": True}
    assert parse("num-minibatches=2:8", kinds)["kind"] == "int"  # an int setting's range is an integer range
    assert parse("num_minibatches=2,4,8", kinds) == {"name": "num_minibatches", "kind": "choice", "values": [2, 4, 8]}
    assert parse("norm_adv=true,false", kinds)["values"] == [True, False]
    assert tune_module.to_flags({"learning_rate": 0.001, "num_minibatches": 4, "norm_adv": False}) == [
        "--learning-rate", "0.001", "--num-minibatches", "4", "--no-norm-adv"]


def test_a_resumed_runs_returns_are_read_as_tensorboard_and_compare_read_them(tmp_path):
    """The resumed process's file starts at the checkpoint's step (purge_step): what the stopped one logged past it
    was redone, and counts once."""
    from torch.utils.tensorboard import SummaryWriter

    run_dir = tmp_path / "runs" / "CartPole-v1__x__1__100"
    writer = SummaryWriter(str(run_dir))
    for step in range(100, 1001, 100):
        writer.add_scalar("charts/episodic_return", step / 100, step)
    writer.close()
    time.sleep(0.01)  # the files are taken in the order they were written
    writer = SummaryWriter(str(run_dir), purge_step=501)  # resumed from a checkpoint at step 500
    for step in range(550, 901, 50):
        writer.add_scalar("charts/episodic_return", -step / 100, step)
    writer.close()
    steps, returns, last = load_tune().read_returns(run_dir)
    (run,) = compare.find_runs([tmp_path])
    assert steps.tolist() == run.steps.tolist() == [100, 200, 300, 400, 500, *range(550, 901, 50)]
    assert returns.tolist() == run.returns.tolist() and last == 900


def test_a_worker_that_joins_a_study_draws_other_settings_than_its_first(tmp_path):
    """A restarted or second worker must not repeat the first worker's draws (one sampler seed for all would)."""
    tune_module = load_tune()
    definition = {"script": "ppo_discrete.py", "envs": ["CartPole-v1"], "seeds": [1], "pruner": "none",
                  "startup_trials": 5, "warmup_rungs": 0, "sampler": "tpe", "sampler_seed": 0}
    space = {"name": "learning_rate", "kind": "float", "low": 1e-4, "high": 1e-2, "log": True}

    def first_draw(study):
        return tune_module.suggest(study.optuna.ask(), space)

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fresh = first_draw(tune_module.Study(tmp_path / "a", definition, fresh=True))
    assert first_draw(tune_module.Study(tmp_path / "b", definition, fresh=True)) == fresh  # reproducible
    assert first_draw(tune_module.Study(tmp_path / "a", definition)) != fresh  # joining: a seed of its own


def test_a_trial_whose_run_fails_fails_and_a_worker_gives_up_after_three(tmp_path):
    r = tune("-s", SCRIPT, "-e", "NoSuchEnv-v0", "--seeds", "1", "--space", "learning_rate=log:1e-4:1e-2",
             "--bounds", "NoSuchEnv-v0=0:1", "-o", tmp_path, "--study", "s", "--poll-seconds", "0.5", "--",
             "--total-timesteps", 2048, *TINY)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.count("FAILED (NoSuchEnv-v0 seed 1 failed;") == 3
    assert "3 trials in a row failed; stopping" in r.stdout
    assert [t.state.name for t in trials(tmp_path / "s")] == ["FAIL"] * 3


def test_bounds_a_random_policy_already_reaches_are_refused(tmp_path):
    r = tune("-s", SCRIPT, "-e", "MountainCar-v0", *SPACE, "-o", tmp_path / "o", "--", "--total-timesteps", 2048)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no bounds for MountainCar-v0: a random policy scores -200" in r.stderr and "--bounds" in r.stderr

