"""Tests of ppo_atari.py under torchrun ([aux-2]): two CPU processes on the gloo backend.

torchrun must change the speed, not the algorithm: the averaged gradient of a minibatch split across processes
is the one-process gradient of the whole minibatch, advantage normalisation uses the whole minibatch, every
process holds the same parameters, one run directory is written, and checkpoints move between world sizes.
"""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT, load_script, only_run_dir, read_scalars, script_env

SCRIPT = REPO_ROOT / "ppo_atari.py"
# 2 envs x 32 steps = 64 per rollout (32 per process), 2 minibatches, 1 epoch: cheap on a busy 2-core machine.
TINY = ["--no-cuda", "--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2, "--update-epochs", 1,
        "--progress-interval", 0]
BATCH = 64


def torchrun(*args, cwd, nproc=2, timeout=300, popen=False):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           *map(str, args)]
    # torchrun leaves an empty torchelastic_* folder in the temp dir at each launch: keep them out of /tmp
    scratch = Path(cwd).parent / f"{Path(cwd).name}-tmp"
    scratch.mkdir(exist_ok=True)
    env = script_env(TMPDIR=scratch)
    if popen:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def python(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=script_env(), capture_output=True,
                          text=True, timeout=timeout)


def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


# The pieces of one minibatch update, run once as one process on the whole minibatch (before the process group
# exists) and then on each process's half: the script's own functions, composed as its training loop does.
GRADIENT_CHECK = r'''
import importlib.util, os, sys
import torch
import torch.distributed as dist
spec = importlib.util.spec_from_file_location("ppo_atari", sys.argv[1])
pa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pa)
torch.manual_seed(0)
agent = pa.Agent(n_actions=4)
n = 16
obs = torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8)
actions = torch.randint(0, 4, (n,))
advantages = torch.randn(n) * 3 + 1  # far from normalised, so a per-process normalisation would show
returns, old_values = torch.randn(n), torch.randn(n)
with torch.no_grad():
    old_logprobs = agent.get_action_and_value(obs, actions)[1] + 0.3 * torch.randn(n)  # ratios away from 1
    old_logits = agent.logits(obs) + 0.5 * torch.randn(n, 4)  # [kl-1] a rollout policy away from this one
penalty = pa.KLPenalty(pa.Args(kl_penalty=0.7))

def loss_on(idx):
    _, logprob, entropy, value = agent.get_action_and_value(obs[idx], actions[idx])
    kl = penalty.kl(agent, obs[idx], old_logits[idx])
    loss, _ = pa.ppo_loss(logprob, entropy, value, old_logprobs[idx], old_values[idx], advantages[idx], returns[idx],
                          0.1, pa.Args(), kl, penalty.coef)
    return loss

assert pa.WORLD_SIZE == 2
agent.zero_grad()
loss_on(torch.arange(n)).backward()  # first the plain one-process computation, on the whole minibatch
reference = [p.grad.clone() for p in agent.parameters()]
with torch.no_grad():
    reference_kl = penalty.kl(agent, obs, old_logits).mean()
dist.init_process_group("gloo")
pa.normalize = pa.normalize_over_processes  # what init_distributed does, beside starting the process group
rank = dist.get_rank()
agent.zero_grad()
loss_on(torch.arange(rank * n // 2, (rank + 1) * n // 2)).backward()  # this process's half
pa.average_gradients(agent)
worst = max(((p.grad - r).abs().max() / (r.abs().max() + 1e-12)).item() for p, r in zip(agent.parameters(), reference))
with torch.no_grad():  # [kl-1] the mean KL that moves beta is the whole batch's, the same on every process
    half = torch.arange(rank * n // 2, (rank + 1) * n // 2)
    mean_kl = pa.mean_over_processes(penalty.kl(agent, obs[half], old_logits[half]).mean())
worst = max(worst, (abs(mean_kl - reference_kl) / reference_kl).item())
# every process's finished games reach rank 0, in step order
games = pa.games_of_every_process([(10 + rank, float(rank), 7)] if rank == 0 else [(5, 1.0, 3), (20, 2.0, 4)])
print(f"rank {rank} worst relative difference {worst:.3e} games {games}")
dist.destroy_process_group()
'''


def test_split_minibatch_gradient_equals_one_process_gradient(tmp_path):
    helper = tmp_path / "gradient_check.py"
    helper.write_text(GRADIENT_CHECK)
    result = torchrun(helper, SCRIPT, cwd=tmp_path)
    ok(result)
    # The two processes share one stdout, so their lines may run together: read each report by pattern.
    reports = re.findall(r"rank (\d) worst relative difference (\S+) games (\[.*?\])", result.stdout)
    assert sorted(rank for rank, _, _ in reports) == ["0", "1"], result.stdout
    for rank, worst, games in reports:
        # float32 sums in another order; a per-process normalisation or KL gives ~1e-1
        assert float(worst) < 1e-4, rank
        assert games == "[(5, 1.0, 3), (10, 0.0, 7), (20, 2.0, 4)]", games


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("ddp")
    result = torchrun(SCRIPT, *TINY, "--total-timesteps", 4 * BATCH, "--save-model", cwd=cwd)
    return result, cwd


def test_two_processes_write_one_run(two_process_run):
    result, cwd = two_process_run
    ok(result)
    run_dir = only_run_dir(cwd)  # one run directory, from rank 0
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    lines = result.stdout.splitlines()
    assert len([line for line in lines if line.startswith("ppo_atari: BreakoutNoFrameskip-v4")]) == 1
    assert "x 2 processes" in lines[0]
    assert [line.split()[1] for line in lines if line.startswith("step ")] == ["64/256", "128/256", "192/256",
                                                                               "256/256"]
    assert sum(line.startswith("ppo_atari: done, 256 steps") for line in lines) == 1
    scalars = read_scalars(run_dir)
    # Global steps: each iteration counts both processes' envs.
    assert [s for s, _ in scalars["charts/SPS"]] == [64, 128, 192, 256]
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 256 and ckpt["iteration"] == 4 and ckpt["args"]["num_envs"] == 2
    # Every update ended with the processes' parameter fingerprints compared (check_in_sync): a run whose
    # processes diverged would have stopped with an error.
    assert "differ" not in result.stderr


def test_checkpoints_resume_across_world_sizes(two_process_run, tmp_path):
    """A checkpoint of 2 processes resumes in 1, and one of 1 process resumes in 2."""
    result, cwd = two_process_run
    ok(result)
    ckpt = torch.load(only_run_dir(cwd) / "checkpoint.pt", map_location="cpu", weights_only=True)
    ckpt["iteration"], ckpt["global_step"] = 2, 2 * BATCH  # set back: two iterations left
    run_dir = tmp_path / "runs" / ckpt["run_name"]
    run_dir.mkdir(parents=True)
    torch.save(ckpt, run_dir / "checkpoint.pt")
    one = python(SCRIPT, "--resume", run_dir / "checkpoint.pt", cwd=tmp_path)
    ok(one)
    assert "resuming at step 128" in one.stdout
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"] == 4 * BATCH

    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    ckpt["iteration"], ckpt["global_step"] = 3, 3 * BATCH
    torch.save(ckpt, run_dir / "checkpoint.pt")
    two = torchrun(SCRIPT, "--resume", run_dir / "checkpoint.pt", cwd=tmp_path)
    ok(two)
    assert "resuming at step 192" in two.stdout and "x 2 processes" in two.stdout
    final = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert final["global_step"] == 4 * BATCH and final["iteration"] == 4
    # Resumed at 128 by one process (192, 256), then at 192 by two (256 again, hiding the first one's).
    assert [s for s, _ in read_scalars(run_dir)["charts/SPS"]] == [192, 256]


def workers_training(proc):
    """The pids of torchrun's worker processes, once training is under way (their signal handlers are in place)."""
    for line in proc.stdout:
        if line.startswith("step "):
            break
    return [int(pid) for pid in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                               text=True).stdout.split()]


def test_a_signal_to_one_process_stops_every_process_with_one_checkpoint(tmp_path):
    proc = torchrun(SCRIPT, *TINY, "--total-timesteps", 1_000_000, cwd=tmp_path, popen=True)
    try:
        workers = workers_training(proc)
        assert len(workers) == 2, workers  # torchrun's own children
        # Only the worker started last (rank 1) gets the signal, as when one node's job step is signalled.
        subprocess.run(["kill", "-TERM", str(max(workers))], check=True)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stop_lines = [line for line in out.splitlines() if "stopped by SIGTERM" in line]
    assert len(stop_lines) == 1, out + err  # rank 0 speaks for the run
    assert proc.returncode != 0
    step = int(re.search(r"at step (\d+)", stop_lines[0])[1])
    ckpt = torch.load(only_run_dir(tmp_path) / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == step and step % BATCH == 0


def test_bad_input_under_torchrun_prints_one_error_line(tmp_path):
    """Rank 0 says it, even when it reaches the check last: torchrun ends the other processes as soon as one
    exits, so a rank that failed first and left at once would have rank 0 ended before its line (as happened
    on a busy machine). Here rank 0 starts 3 s after the others."""
    late_rank_0 = tmp_path.parent / f"{tmp_path.name}-late_rank_0.py"
    late_rank_0.write_text("import os, runpy, time\n"
                           "time.sleep(3 if os.environ['RANK'] == '0' else 0)\n"
                           f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n")
    result = torchrun(late_rank_0, "--gamma", 2, cwd=tmp_path)
    assert result.returncode != 0
    ours = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert ours == ["error: --gamma 2.0 is out of range: it must be in [0, 1]"]  # once, not once per process
    assert not (tmp_path / "runs").exists()
    odd = torchrun(SCRIPT, "--num-envs", 3, "--num-minibatches", 1, cwd=tmp_path)
    assert [line for line in odd.stderr.splitlines() if line.startswith("error:")][0].startswith(
        "error: --num-envs 3 must split evenly across the 2 torchrun processes")


def test_an_error_only_another_rank_meets_is_said_by_that_rank(monkeypatch, capsys):
    """Rank 0 did not end the run within the wait, so the error was that rank's alone: it says it, naming
    itself, rather than leave torchrun's report without a reason."""
    module = load_script("ppo_atari")
    monkeypatch.setattr(module, "RANK", 1)
    monkeypatch.setattr(module, "OTHER_RANKS_FAIL_AFTER_S", 0)
    with pytest.raises(SystemExit) as stop:
        module.fail("2 processes on this machine but 1 GPUs")
    assert stop.value.code == 2
    assert capsys.readouterr().err == "error: on rank 1: 2 processes on this machine but 1 GPUs\n"


def test_evaluation_under_torchrun_with_any_process_count(two_process_run, tmp_path):
    """Evaluation runs on rank 0 alone, so 3 processes may evaluate although the default 8 envs do not split
    into 3; the one score line comes from rank 0."""
    result, cwd = two_process_run
    ok(result)
    ckpt = only_run_dir(cwd) / "checkpoint.pt"
    three = torchrun(SCRIPT, "--eval-checkpoint", ckpt, "--eval-episodes", 1, "--no-cuda", cwd=tmp_path, nproc=3)
    ok(three)
    assert len([line for line in three.stdout.splitlines() if "over 1 game (" in line]) == 1, three.stdout


def test_workers_stop_with_a_checkpoint_when_torchrun_is_killed(tmp_path):
    """torchrun killed outright (SIGKILL, as the out-of-memory killer does) leaves no orphans training on: its
    workers are told to stop by the kernel, and stop as on any signal, with one checkpoint."""
    proc = torchrun(SCRIPT, *TINY, "--total-timesteps", 1_000_000, cwd=tmp_path, popen=True)
    try:
        workers = workers_training(proc)
        assert len(workers) == 2, workers
        proc.kill()
        out, err = proc.communicate(timeout=120)  # the pipes close when the workers have exited too
        deadline = time.time() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.time() < deadline:
            time.sleep(0.5)
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers), "workers still running"
    finally:
        for pid in workers if "workers" in locals() else []:
            subprocess.run(["kill", "-KILL", str(pid)], capture_output=True)
    stop_lines = [line for line in out.splitlines() if "stopped by SIGTERM" in line]
    assert len(stop_lines) == 1, out + err
    step = int(re.search(r"at step (\d+)", stop_lines[0])[1])
    ckpt = torch.load(only_run_dir(tmp_path) / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == step and step % BATCH == 0


# A worker's end as exit_without_teardown runs it: a finished main() exits 0 with its output flushed and nothing
# of the interpreter's exit-time teardown run (an atexit handler stands for it here); sys.exit exits as usual.
EXIT_CHECK = r'''
import atexit, importlib.util, sys
spec = importlib.util.spec_from_file_location("ppo_atari", sys.argv[1])
pa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pa)
atexit.register(lambda: print(" and the teardown", end=""))
how = sys.argv[2]

def main():
    print("the run's last line", end="")  # still in the buffer: stdout is a pipe
    if how != "return":
        sys.exit(int(how) if how.isdigit() else how)

pa.exit_without_teardown(main)
'''


@pytest.mark.parametrize("how, status, stdout, stderr", [
    ("return", 0, "the run's last line", ""),
    ("3", 3, "the run's last line and the teardown", ""),
    ("error: stopped", 1, "the run's last line and the teardown", "error: stopped"),
])
def test_a_finished_worker_exits_0_at_once_its_output_flushed_and_an_error_as_usual(tmp_path, how, status, stdout,
                                                                                    stderr):
    result = python("-c", EXIT_CHECK, SCRIPT, how, cwd=tmp_path)
    assert result.returncode == status, result.stderr
    assert result.stdout == stdout
    assert result.stderr.strip() == stderr
