"""Tests of benchmarks/sweep.sh when runs are stopped, killed or preempted, on tiny real runs:

- extra arguments that collide with what the sweep sets, and contradictory options, are refused;
- a sweep killed outright (SIGKILL to its process group, as when its node dies) and started again resumes its
  unfinished run from the run's checkpoint, and finishes every run;
- a sweep stopped with SIGTERM passes the signal on, so the run checkpoints its last whole iteration, and
  resumes from exactly there; so does a run of two processes under torchrun, whose log then says that
  torchrun's traceback is its answer to the stop;
- Slurm mode on a real single-node Slurm started here: a job array runs, and a task warned before its time
  limit (USR1 to its batch shell) checkpoints, requeues itself, and its requeued task finishes the run.

"Complete" below means that the run's TensorBoard record (as TensorBoard shows it, after the resumed run hid
what the killed one logged past its checkpoint) has every iteration's step exactly once. The local runs are
ppo_discrete.py on CartPole-v1, 8192 steps of 128-step iterations with a checkpoint every 4 iterations, and
one tiny two-process ppo_atari.py run on Breakout.
The Slurm tests need slurm-wlm and munge (Debian packages) and root; they are skipped without them.
"""

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import read_scalars

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import layout  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "benchmarks" / "sweep.sh"
SCRIPT = REPO / "ppo_discrete.py"
TINY = ["--total-timesteps", "1024", "--num-envs", "2", "--num-steps", "128"]
# A run long enough to be stopped part-way: 64 iterations of 128 steps, a checkpoint every 4 (512 steps), and
# a progress line after every iteration (so the log says how far it got).
TOTAL, BATCH, CKPT_STEPS = 8192, 128, 512
RESUMABLE = ["--total-timesteps", TOTAL, "--num-envs", 4, "--num-steps", 32, "--num-minibatches", 1,
             "--update-epochs", 1, "--checkpoint-every", CKPT_STEPS // BATCH, "--progress-interval", 0]
ALL_STEPS = list(range(BATCH, TOTAL + 1, BATCH))


def sweep(*args, env=None, timeout=300):
    """Run sweep.sh with `args`; the extra environment `env` is added to ours."""
    return subprocess.run(["bash", str(SWEEP), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})}, cwd=REPO)


def start_sweep(*args, env=None):
    """sweep.sh in the background, in a process group of its own (the group a node failure takes down)."""
    return subprocess.Popen(["bash", str(SWEEP), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, start_new_session=True,
                            env={**os.environ, "PYTHON": sys.executable, **(env or {})})


def checkpoints(seed_dir):
    return sorted((seed_dir / "runs").glob("*/checkpoint.pt"))


def event_files(seed_dir):
    return sorted((seed_dir / "runs").rglob("events.out.tfevents.*"))


def wait_for_checkpoint(seed_dir, proc, timeout=180):
    deadline = time.time() + timeout
    while not checkpoints(seed_dir):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"no checkpoint in {seed_dir} (sweep exit {proc.returncode})\n{out}\n{err}")
        time.sleep(0.05)
    return checkpoints(seed_dir)[0]


def processes_in(folder, timeout=10):
    """Processes still working in `folder` (their cwd is in it); waits up to `timeout` s for them to go."""
    deadline = time.time() + timeout
    while True:
        found = []
        for p in Path("/proc").iterdir():
            try:
                if p.name.isdigit() and str(folder) in os.readlink(p / "cwd"):
                    found.append(p.name)
            except OSError:
                pass
        if not found or time.time() > deadline:
            return found
        time.sleep(0.2)


def reported_steps(log_text):
    """The steps of the progress lines ("step N/TOTAL ..."), one per iteration with --progress-interval 0."""
    return [int(s) for s in re.findall(r"^step (\d+)/", log_text, re.M)]


def resumed_at(log_text):
    return [int(s) for s in re.findall(r"resuming at step (\d+);", log_text)]


def logged_steps(seed_dir):
    """The steps of one scalar logged once per iteration, as TensorBoard shows the run."""
    (run_dir,) = [p for p in (seed_dir / "runs").iterdir() if p.is_dir()]
    return [step for step, _ in read_scalars(run_dir)["losses/value_loss"]]


# ----------------------------------------------------------------------------------------------
# Options refused
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, hint", [
    (["--seed", "3"], "use --seeds, or --num-seeds and --seed-start"),
    (["--seed=3"], "use --seeds, or --num-seeds and --seed-start"),
    (["--env-id", "Acrobot-v1"], "use -e/--env-ids"),
    (["--env_id=Acrobot-v1"], "use -e/--env-ids"),  # tyro takes the underscore spelling too
    (["--exp-name", "x"], "use -v/--variant"),
    (["--exp-name=x"], "use -v/--variant"),
    (["--resume", "runs/x/checkpoint.pt"], "the sweep resumes unfinished runs from their checkpoints itself"),
    (["--resume=runs/x/checkpoint.pt"], "the sweep resumes unfinished runs from their checkpoints itself"),
    (["--eval-checkpoint", "c.pt"], "a sweep trains; evaluate a checkpoint with the script itself"),
    (["--eval-checkpoint=c.pt"], "a sweep trains; evaluate a checkpoint with the script itself"),
    (["--no-save-model"], "every sweep run saves a checkpoint"),
    (["--checkpoint-minutes", "1"], "use the sweep's own --checkpoint-minutes"),
    (["--checkpoint-minutes=1"], "use the sweep's own --checkpoint-minutes"),
    (["--help"], "every run would print its help, exit 0 and be marked done"),
])
def test_sweep_refuses_extra_arguments_it_sets_itself(tmp_path, extra, hint):
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "-o", tmp_path, "--dry-run", "--", "--clip-coef", "0.1", *extra)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"sweep.sh: error: '{extra[0]}' after -- collides with what the sweep sets "
                                     f"for each run: {hint}"]
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("args, message", [
    (["--seeds", "1,2", "-n", "5"], "--seeds lists the seeds: do not also give --num-seeds or --seed-start"),
    (["-n", "5", "--seeds", "1,2"], "--seeds lists the seeds: do not also give --num-seeds or --seed-start"),
    (["--seeds", "1,2", "--seed-start", "3"], "--seeds lists the seeds: do not also give --num-seeds or --seed-start"),
    (["--seeds", "10,010"], "seed 10 is given twice"),  # decimal, whatever the leading zeros
    (["--checkpoint-minutes", "-1"], "--checkpoint-minutes must be a number >= 0"),
    (["--checkpoint-minutes", "five"], "--checkpoint-minutes must be a number >= 0"),
    (["--slurm", "--slurm-signal-secs", "0"], "--slurm-signal-secs must be an integer from 1 to 65535"),
    # Slurm may warn a task up to 60 s earlier than asked: a limit within that would stop it at once, forever.
    (["--slurm", "--slurm-time", "00:03:00"], "--slurm-time 00:03:00 leaves no time to run"),
    (["--slurm", "--slurm-time", "3"], "--slurm-time 3 leaves no time to run"),
    (["--slurm", "--slurm-time", "0-0:01", "--slurm-signal-secs", "30"], "--slurm-time 0-0:01 leaves no time"),
])
def test_sweep_refuses_contradictory_options(tmp_path, args, message):
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "-o", tmp_path, "--dry-run", *args)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"sweep.sh: error: {message}"), r.stderr


def test_sweep_passes_checkpoint_options(tmp_path):
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1", "-o", tmp_path, "--dry-run", "--", *TINY)
    assert r.returncode == 0, r.stderr
    assert " --exp-name default --save-model --checkpoint-minutes 5 --total-timesteps 1024 " in r.stdout
    assert "--no-progress" not in r.stdout  # a run's log.txt shows its progress lines
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1", "-o", tmp_path, "--dry-run",
              "--checkpoint-minutes=0.5", "--slurm", "--slurm-signal-secs", "300", "--slurm-time", "1:00:00")
    assert r.returncode == 0, r.stderr
    assert " --save-model --checkpoint-minutes 0.5" in r.stdout
    sbatch = r.stdout.splitlines()[-1]
    assert "--requeue --signal B:USR1@300 --open-mode append" in sbatch and "--time 1:00:00" in sbatch
    assert "--_slurm-task" in r.stdout


def test_sweep_starts_runs_under_torchrun(tmp_path):
    """--nproc-per-node N: each run is one torchrun of N processes, locally and in Slurm tasks alike."""
    atari = REPO / "ppo_atari.py"
    r = sweep("-s", atari, "-e", "BreakoutNoFrameskip-v4", "--seeds", "1", "-o", tmp_path, "--dry-run",
              "--nproc-per-node", "2", "--", "--no-cuda")
    assert r.returncode == 0, r.stderr
    # torchrun's workers get 300 s, not its default 30, to finish an update and checkpoint after a stop signal
    launch = "python -m torch.distributed.run --standalone --nproc-per-node 2 --shutdown-timeout 300"
    assert f"{launch} {atari} --env-id BreakoutNoFrameskip-v4" in r.stdout.replace(sys.executable, "python")
    r = sweep("-s", atari, "-e", "BreakoutNoFrameskip-v4", "--seeds", "1", "-o", tmp_path, "--dry-run",
              "--nproc-per-node", "2", "--slurm", "--slurm-cpus", "2")
    assert r.returncode == 0 and "torch.distributed.run --standalone --nproc-per-node 2" in r.stdout, r.stderr
    # Only a script that trains under torchrun may be started that way.
    r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "-o", tmp_path, "--dry-run", "--nproc-per-node", "2")
    assert r.returncode == 2 and r.stderr.startswith("sweep.sh: error: ") and "torchrun" in r.stderr, r.stderr
    r = sweep("-s", atari, "-e", "PongNoFrameskip-v4", "-o", tmp_path, "--dry-run", "--nproc-per-node", "0")
    assert r.returncode == 2 and "--nproc-per-node must be a positive integer" in r.stderr, r.stderr


# ----------------------------------------------------------------------------------------------
# Local mode: killed outright, stopped with SIGTERM
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def killed_sweep(tmp_path_factory):
    """Seeds 1 and 2 one after the other; SIGKILL to the sweep's whole process group as soon as seed 1 has a
    checkpoint (seed 2 has not started); then the same sweep started again."""
    out = tmp_path_factory.mktemp("killed")
    args = ["-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1,2", "-j", "1", "-o", out, "--", *RESUMABLE]
    vdir = out / "ppo_discrete" / "default"
    proc = start_sweep(*args)
    ckpt = wait_for_checkpoint(vdir / "CartPole-v1" / "seed1", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    info = {"args": args, "vdir": vdir, "ckpt": ckpt, "kill_rc": proc.returncode, "leftovers": processes_in(vdir),
            # (a kill between checkpoint.pt and checkpoint.json leaves the older json: layout asks the checkpoint)
            "ckpt_step": layout.checkpoint(vdir / "CartPole-v1" / "seed1")[1],
            "log_at_kill": (vdir / "CartPole-v1" / "seed1" / "log.txt").read_text(),
            "seed2_started": (vdir / "CartPole-v1" / "seed2").exists()}
    info["result"] = sweep(*args)
    return info


def test_sweep_killed_outright_resumes_from_checkpoints(killed_sweep):
    info, vdir = killed_sweep, killed_sweep["vdir"]
    assert info["kill_rc"] == -signal.SIGKILL and info["leftovers"] == []  # the training process died too
    assert not info["seed2_started"]
    r = info["result"]
    assert r.returncode == 0, r.stderr
    assert "2 runs, 0 already done, 2 to run (1 from a checkpoint)" in r.stderr
    assert "2 finished, 0 skipped (done before), 0 failed" in r.stderr

    seed1 = vdir / "CartPole-v1" / "seed1"
    log = (seed1 / "log.txt").read_text()
    assert log.startswith(info["log_at_kill"])  # the log is appended to, not restarted
    assert f"\n# resuming from {info['ckpt']} (step {info['ckpt_step']}); started " in log
    assert f" --checkpoint-every 4 --progress-interval 0 --resume {info['ckpt']}\n" in log  # the command, logged
    (step,) = resumed_at(log)
    assert step == info["ckpt_step"]  # checkpoint.json says where the checkpoint is
    # The run resumed at its last checkpoint: a whole number of checkpoint intervals, at most one interval
    # behind the last iteration it reported before the kill.
    last = reported_steps(info["log_at_kill"])[-1]
    assert step > 0 and step % CKPT_STEPS == 0 and 0 <= last - step <= CKPT_STEPS, (step, last)
    assert f"ppo_discrete: done, {TOTAL} steps in " in log and (seed1 / "done").exists()
    assert len(event_files(seed1)) == 2  # one per process, in the same run folder
    assert logged_steps(seed1) == ALL_STEPS

    seed2 = vdir / "CartPole-v1" / "seed2"  # never started before the kill: an ordinary run
    log2 = (seed2 / "log.txt").read_text()
    assert "# resuming" not in log2 and f"ppo_discrete: done, {TOTAL} steps in " in log2
    assert (seed2 / "done").exists() and logged_steps(seed2) == ALL_STEPS
    assert processes_in(vdir, timeout=0) == []


def test_sweep_finished_run_without_done_marker(killed_sweep):
    """Killed after the run exited 0 but before its done marker was written: its final checkpoint says it is
    finished, so starting the sweep again resumes it, which trains nothing and writes nothing, and marks it done."""
    seed2 = killed_sweep["vdir"] / "CartPole-v1" / "seed2"
    (seed2 / "done").unlink()
    events = {p: p.stat().st_size for p in event_files(seed2)}
    r = sweep(*killed_sweep["args"])
    assert r.returncode == 0, r.stderr
    assert "2 runs, 1 already done, 1 to run (1 from a checkpoint)" in r.stderr
    assert "already finished" in (seed2 / "log.txt").read_text()
    assert (seed2 / "done").exists()
    assert {p: p.stat().st_size for p in event_files(seed2)} == events


@pytest.fixture(scope="module")
def terminated_sweep(tmp_path_factory):
    """One run; SIGTERM to the sweep (not to the run) once it has a checkpoint; then the sweep started again."""
    out = tmp_path_factory.mktemp("terminated")
    args = ["-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1", "-o", out, "--", *RESUMABLE]
    vdir = out / "ppo_discrete" / "default"
    proc = start_sweep(*args)
    wait_for_checkpoint(vdir / "CartPole-v1" / "seed1", proc)
    proc.send_signal(signal.SIGTERM)
    stop_out, stop_err = proc.communicate(timeout=120)
    info = {"vdir": vdir, "stop_rc": proc.returncode, "stop_out": stop_out, "stop_err": stop_err,
            "leftovers": processes_in(vdir), "log_at_stop": (vdir / "CartPole-v1" / "seed1" / "log.txt").read_text(),
            "done_at_stop": (vdir / "CartPole-v1" / "seed1" / "done").exists()}
    info["result"] = sweep(*args)
    return info


def test_sweep_stopped_with_sigterm_resumes_where_it_stopped(terminated_sweep):
    info, seed1 = terminated_sweep, terminated_sweep["vdir"] / "CartPole-v1" / "seed1"
    assert info["stop_rc"] == 130, info["stop_err"]
    assert "stopping: the runs are writing checkpoints; start the same sweep again to resume them" in info["stop_err"]
    assert info["leftovers"] == []
    stopped = re.search(r"ppo_discrete: stopped by SIGTERM at step (\d+); checkpoint saved to ", info["log_at_stop"])
    assert stopped, info["log_at_stop"]
    step = int(stopped.group(1))
    assert f"stopped  {seed1} (checkpoint at step {step}); it resumes from its checkpoint next time" \
        in info["stop_out"]
    # A stopped run loses only its partial rollout: the checkpoint holds the last iteration it reported.
    assert 0 < step < TOTAL and reported_steps(info["log_at_stop"])[-1] == step
    assert not info["done_at_stop"]
    # The log's last line says the exit status above it is a stop's, and where the run goes on from.
    assert info["log_at_stop"].endswith(
        f"\n# stopped with a checkpoint at step {step}; it resumes from its checkpoint next time\n")
    assert "torchrun" not in info["log_at_stop"]

    r = info["result"]
    assert r.returncode == 0, r.stderr
    assert "1 runs, 0 already done, 1 to run (1 from a checkpoint)" in r.stderr
    log = (seed1 / "log.txt").read_text()
    assert log.startswith(info["log_at_stop"]) and resumed_at(log) == [step]
    assert f"ppo_discrete: done, {TOTAL} steps in " in log and (seed1 / "done").exists()
    assert logged_steps(seed1) == ALL_STEPS
    # Each iteration was computed once: the two segments' progress lines add up to the run.
    assert reported_steps(log) == ALL_STEPS


def test_sweep_stops_and_resumes_a_torchrun_run(tmp_path):
    """--nproc-per-node 2: SIGTERM to the sweep reaches both processes through torchrun; they stop with one
    checkpoint, the log's last lines say that torchrun's traceback is its answer to the stop, and the same
    sweep started again resumes the run from that checkpoint and finishes it."""
    total, batch = 2048, 64  # 2 envs x 32 steps per iteration, split across the two processes
    args = ["-s", REPO / "ppo_atari.py", "-e", "BreakoutNoFrameskip-v4", "--seeds", "1", "--nproc-per-node", 2,
            "-o", tmp_path / "sweeps", "--", "--no-cuda", "--total-timesteps", total, "--num-envs", 2,
            "--num-steps", 32, "--num-minibatches", 2, "--update-epochs", 1, "--checkpoint-every", 2,
            "--progress-interval", 0]
    env = {"TMPDIR": str(tmp_path)}  # torchrun leaves an empty torchelastic_* folder in it at each launch
    seed1 = tmp_path / "sweeps" / "ppo_atari" / "default" / "BreakoutNoFrameskip-v4" / "seed1"
    proc = start_sweep(*args, env=env)
    try:
        wait_for_checkpoint(seed1, proc)
        proc.send_signal(signal.SIGTERM)
        stop_out, stop_err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stop_out + stop_err
    assert processes_in(seed1) == []
    log = (seed1 / "log.txt").read_text()
    stopped = re.findall(r"ppo_atari: stopped by SIGTERM at step (\d+); checkpoint saved to ", log)
    assert len(stopped) == 1, log  # rank 0 speaks for both processes
    step = int(stopped[0])
    assert 0 < step < total and step % batch == 0 and len(checkpoints(seed1)) == 1
    assert f"stopped  {seed1} (checkpoint at step {step}); it resumes from its checkpoint next time" in stop_out
    assert "SignalException: Process" in log  # torchrun's own traceback, which the last line explains
    assert log.endswith(f"\n# stopped with a checkpoint at step {step}; it resumes from its checkpoint next time\n"
                        "# (the traceback above is torchrun's answer to the stop signal, not an error)\n"), log

    result = sweep(*args, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert processes_in(seed1) == []
    log = (seed1 / "log.txt").read_text()
    assert resumed_at(log) == [step] and f"ppo_atari: done, {total} steps in " in log
    assert (seed1 / "done").exists() and "torchrun's answer" not in log.split("# resuming from ")[1]
    assert reported_steps(log) == list(range(batch, total + 1, batch))  # each iteration once


def test_a_run_another_sweep_is_running_is_left_to_it(tmp_path):
    """Whichever sweep started a run (a local one, a Slurm task) holds its lock: another sweep of the same
    folder neither wipes it nor trains beside it."""
    import fcntl

    seed1 = tmp_path / "ppo_discrete" / "default" / "CartPole-v1" / "seed1"
    seed1.mkdir(parents=True)
    (seed1 / "log.txt").write_text("a run without a checkpoint yet, in another sweep\n")
    with open(seed1.parent / ".seed1.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = sweep("-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1,2", "-o", tmp_path, "--", *TINY)
    assert r.returncode == 1  # not every run is done
    assert f"{seed1} is being run by another sweep; left to it" in r.stderr
    assert "CartPole-v1 seed 1 is left to the sweep that is running it" in r.stderr
    assert "1 finished, 0 skipped (done before), 1 left to another sweep, 0 failed" in r.stderr
    assert "failed runs" not in r.stderr
    assert (seed1 / "log.txt").read_text() == "a run without a checkpoint yet, in another sweep\n"
    assert sorted(p.name for p in seed1.iterdir()) == ["log.txt"]
    assert (seed1.parent / "seed2" / "done").exists()  # the others run as usual


def test_slurm_task_is_requeued_only_when_its_run_moved_on(tmp_path):
    """A task warned of its time limit (USR1 to its batch shell) stops its run with a checkpoint. It is requeued
    when the run got past the step it started from; a task warned before it finished one whole iteration would
    be warned there again after every requeue, so it is not."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol_calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "scontrol").chmod(0o755)
    seed1 = tmp_path / "ppo_discrete" / "default" / "CartPole-v1" / "seed1"
    log = seed1 / "log.txt"
    iterations_of_32k_steps = ["--total-timesteps", 10 ** 6, "--num-envs", 8, "--num-steps", 4096,
                               "--checkpoint-every", 1]

    def task_warned(once):
        """The task (the same command each time, as a requeued task is), warned as soon as `once(log text of this
        attempt)` holds; its stdout and this attempt's part of the log."""
        offset = log.stat().st_size if log.exists() else 0
        task = subprocess.Popen(
            ["bash", str(SWEEP), "--_slurm-task", str(seed1), "1", sys.executable, str(SCRIPT), "--env-id",
             "CartPole-v1", "--seed", "1", "--save-model", *map(str, iterations_of_32k_steps)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_ARRAY_JOB_ID": "7",
                 "SLURM_ARRAY_TASK_ID": "0"})
        deadline = time.time() + 120
        while not once(log.read_text()[offset:] if log.exists() else ""):
            assert time.time() < deadline and task.poll() is None, task.communicate()
            time.sleep(0.05)
        time.sleep(1.0)  # the start line is printed just before the stop signals are handled
        task.send_signal(signal.SIGUSR1)  # Slurm's warning, to the batch shell
        out, err = task.communicate(timeout=120)
        assert task.returncode != 0, out + err
        return out, log.read_text()[offset:]

    # Warned after its first whole iteration: it moved on from step 0, and is requeued.
    out, attempt = task_warned(lambda text: checkpoints(seed1))
    stopped = re.search(r"ppo_discrete: stopped by SIGUSR1 at step (\d+);", attempt)
    assert stopped and int(stopped.group(1)) > 0, attempt
    assert "requeueing Slurm task 7_0" in out and calls.read_text() == "requeue 7_0\n"
    # The log says, in this order, that the stop kept a checkpoint and that the task was requeued.
    assert attempt.endswith(f"\n# stopped with a checkpoint at step {stopped.group(1)}; it resumes from its checkpoint "
                            "next time\n# requeueing Slurm task 7_0\n"), attempt
    # The requeued task, warned before it finished an iteration: it stops where it resumed, and is not requeued.
    out, attempt = task_warned(lambda text: "resuming at step" in text)
    step = stopped.group(1)
    assert f"resuming at step {step};" in attempt and f"ppo_discrete: stopped by SIGUSR1 at step {step};" in attempt
    assert f"not requeueing Slurm task 7_0: its time ran out at step {step}, where it started, before one whole " \
           "iteration; give it a longer --slurm-time" in out, out
    assert attempt.endswith(f"\n# stopped with a checkpoint at step {step}; it resumes from its checkpoint next time\n"
                            f"# not requeueing Slurm task 7_0: its time ran out at step {step}, where it started, "
                            "before one whole iteration; give it a longer --slurm-time\n"), attempt
    assert calls.read_text() == "requeue 7_0\n"  # not called again


# ----------------------------------------------------------------------------------------------
# Slurm mode, on a real single-node Slurm started here
# ----------------------------------------------------------------------------------------------

SBIN_PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
SLURM_BINARIES = ["munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo"]
# How long a requeued job waits before it may start again (Slurm's AuthInfo cred_expire; 120 s by default).
# The scheduler's main loop then starts it (every sched_interval seconds; 60 by default).
REQUEUE_WAIT = 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout, what, procs=()):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        for name, p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with status {p.returncode} while waiting for {what}")
        time.sleep(0.3)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


class LocalSlurm:
    """munged + slurmctld + slurmd on this host, all state in one temporary directory."""

    def __init__(self):
        # munged wants its socket directory (and the key) readable by it only where it says; mkdtemp is 0700.
        self.dir = Path(tempfile.mkdtemp(prefix="sweep-slurm-"))
        self.dir.chmod(0o755)
        self.procs = []
        self.env = {"SLURM_CONF": str(self.dir / "slurm.conf"), "PATH": SBIN_PATH}

    def cmd(self, *args, check=True):
        r = subprocess.run(list(args), capture_output=True, text=True, timeout=30, env={**os.environ, **self.env})
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
        return r

    def spawn(self, name, *args):
        log = open(self.dir / f"{name}.out", "w")
        p = subprocess.Popen(list(args), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, **self.env})
        log.close()
        self.procs.append((name, p))
        return p

    def logs(self):
        text = []
        for f in sorted(self.dir.glob("*.out")) + sorted((self.dir / "log").glob("*.log")):
            text.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(text)

    def wait_gone(self, job_id, timeout):
        """Wait until the job (all its array tasks, requeued ones too) has left the queue."""
        try:
            wait_for(lambda: self.cmd("squeue", "-h", "-j", job_id, check=False).stdout.strip() == "", timeout,
                     f"job {job_id}")
        except TimeoutError as e:
            pytest.fail(f"{e}\n{self.cmd('squeue', check=False).stdout}\n{self.logs()}")

    def start(self):
        d = self.dir
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir()
        (d / "munge").chmod(0o755)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = d / "munge" / "munge.socket"
        self.spawn("munged", "munged", "--foreground", f"--socket={sock}", f"--key-file={key}",
                   f"--log-file={d / 'munge' / 'munged.log'}", f"--pid-file={d / 'munge' / 'munged.pid'}",
                   f"--seed-file={d / 'munge' / 'munged.seed'}")
        wait_for(sock.exists, 15, "the munge socket", self.procs)
        host = socket.gethostname().split(".")[0]
        ctld_port, d_port = free_port(), free_port()
        (d / "slurm.conf").write_text(f"""\
ClusterName=sweeptest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock},cred_expire={REQUEUE_WAIT}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'log' / 'slurmctld.log'}
SlurmdLogFile={d / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=600
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
        self.spawn("slurmctld", "slurmctld", "-D", "-c", "-f", str(d / "slurm.conf"))
        wait_for(lambda: self.cmd("scontrol", "ping", check=False).stdout.count("UP") > 0, 30, "slurmctld",
                 self.procs)
        self.spawn("slurmd", "slurmd", "-D", "-N", host, "-f", str(d / "slurm.conf"))
        wait_for(lambda: self.cmd("sinfo", "-h", "-o", "%t", check=False).stdout.strip() == "idle", 30,
                 "the node to be idle", self.procs)

    def stop(self):
        if any(name == "slurmctld" and p.poll() is None for name, p in self.procs):
            self.cmd("scancel", "--user", "root", check=False)
            try:
                wait_for(lambda: self.cmd("squeue", "-h", check=False).stdout.strip() == "", 20, "jobs to end")
            except (TimeoutError, RuntimeError):
                pass
        for _, p in reversed(self.procs):  # slurmd, slurmctld, munged: only the processes started here
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm(request):
    missing = [b for b in SLURM_BINARIES if shutil.which(b, path=SBIN_PATH) is None]
    if missing and os.environ.get("CI"):
        pytest.fail(f"Slurm is not installed ({', '.join(missing)} not found): .ci/run installs it")
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} not found); "
                    "apt-get install -y slurm-wlm munge provides it")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm test runs slurmd, which starts jobs, as root")
    cluster = LocalSlurm()
    request.addfinalizer(cluster.stop)  # before starting anything: the daemons are stopped even on failure
    try:
        cluster.start()
    except (RuntimeError, TimeoutError) as e:
        pytest.fail(f"could not start a local Slurm: {e}\n{cluster.logs()}")
    return cluster


def run_compare(*args):
    """benchmarks/compare.py's main(args) -> (exit status, stdout, stderr)."""
    import contextlib
    import io

    spec = importlib.util.spec_from_file_location("compare", REPO / "benchmarks" / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = compare.main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def test_sweep_slurm_job_array(slurm, tmp_path):
    out = tmp_path / "sweeps"
    args = ["-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1,2", "-o", out, "--slurm", "--slurm-max-parallel", "2",
            "--slurm-cpus", "1", "--slurm-time", "00:05:00", "--slurm-output", tmp_path / "slurm-out" / "%A_%a.out",
            "--", *TINY]
    r = sweep(*args, env=slurm.env)
    assert r.returncode == 0, r.stderr + slurm.logs()
    job_id = r.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), r.stdout
    assert "submitted job array" in r.stderr
    # While the array is queued or running, the same sweep is not submitted a second time.
    again = sweep(*args, env=slurm.env)
    assert again.returncode == 2 and f"job(s) {job_id} of sweep-ppo_discrete-default are still queued" in again.stderr
    job = slurm.cmd("scontrol", "show", "job", job_id).stdout
    assert "ArrayTaskThrottle=2" in job and "TimeLimit=00:05:00" in job and "NumCPUs=1" in job
    assert "Requeue=1" in job  # preemption and node failure requeue a task
    slurm.wait_gone(job_id, 150)
    states = slurm.cmd("scontrol", "show", "job", job_id).stdout
    assert states.count("JobState=COMPLETED") == 2 and states.count("Restarts=0") == 2, states
    vdir = out / "ppo_discrete" / "default"
    for seed, task in ((1, 0), (2, 1)):
        d = vdir / "CartPole-v1" / f"seed{seed}"
        task_out = tmp_path / "slurm-out" / f"{job_id}_{task}.out"
        assert (d / "done").exists(), (d / "log.txt").read_text() + task_out.read_text()
        assert len(event_files(d)) == 1 and len(checkpoints(d)) == 1
        assert (d / "log.txt").read_text().startswith(f"cd {d} && OMP_NUM_THREADS=1 ")
        assert f"finished {d}" in task_out.read_text()
    job_scripts = list((vdir / "slurm").glob("array-*.sh"))
    assert len(job_scripts) == 1
    assert "--array 0-1%2" in job_scripts[0].read_text() and "--signal B:USR1@120" in job_scripts[0].read_text()
    # Submitting the same sweep again: everything is done, nothing is submitted.
    r = sweep(*args, env=slurm.env)
    assert r.returncode == 0 and "nothing to submit" in r.stderr and r.stdout.strip() == ""
    # The results read like local ones.
    rc, table, err = run_compare(out, "--out", tmp_path / "report", "--no-plots", "--resamples", "200")
    assert rc == 0 and "| CartPole-v1 | default | 2 |" in table, err


def test_sweep_slurm_task_warned_of_its_time_limit_requeues_and_resumes(slurm, tmp_path):
    """USR1 to the batch shell only, as --signal=B:USR1@SECS sends it before the time limit: the task stops its
    run with a checkpoint and requeues itself; the requeued task (SLURM_RESTART_COUNT=1) finishes the run."""
    out = tmp_path / "sweeps"
    task_out = tmp_path / "slurm-out" / "task.out"
    args = ["-s", SCRIPT, "-e", "CartPole-v1", "--seeds", "1", "-o", out, "--slurm", "--slurm-time", "00:10:00",
            "--slurm-output", task_out, "--", *RESUMABLE]
    r = sweep(*args, env=slurm.env)
    assert r.returncode == 0, r.stderr + slurm.logs()
    job_id = r.stdout.strip().splitlines()[-1]
    seed1 = out / "ppo_discrete" / "default" / "CartPole-v1" / "seed1"
    try:
        wait_for(lambda: checkpoints(seed1), 180, "the run's first checkpoint")
    except TimeoutError as e:
        pytest.fail(f"{e}\n{slurm.cmd('squeue', check=False).stdout}\n{slurm.logs()}")
    slurm.cmd("scancel", "--signal=USR1", "--batch", f"{job_id}_0")
    slurm.wait_gone(job_id, 240 + REQUEUE_WAIT)

    job = slurm.cmd("scontrol", "show", "job", job_id).stdout
    assert "JobState=COMPLETED" in job and "Restarts=1" in job, job
    log = (seed1 / "log.txt").read_text()
    stopped = re.search(r"ppo_discrete: stopped by SIGUSR1 at step (\d+); checkpoint saved to (\S+);", log)
    assert stopped, log + task_out.read_text()
    step, ckpt = int(stopped.group(1)), stopped.group(2)
    assert f"# requeueing Slurm task {job_id}_0\n" in log
    assert f"# resuming from {seed1 / 'runs'}/" in log and " (Slurm restart 1); started " in log
    assert resumed_at(log) == [step] and 0 < step < TOTAL and reported_steps(log) == ALL_STEPS
    assert f"ppo_discrete: done, {TOTAL} steps in " in log and (seed1 / "done").exists()
    assert checkpoints(seed1) == [seed1 / "runs" / Path(ckpt).parent.name / "checkpoint.pt"]
    assert logged_steps(seed1) == ALL_STEPS
    # One output file for both segments of the task (--open-mode append).
    text = task_out.read_text()
    assert f"requeueing Slurm task {job_id}_0" in text and f"finished {seed1}" in text
    assert text.index("requeueing") < text.index("finished")
