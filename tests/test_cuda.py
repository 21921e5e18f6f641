"""The --cuda path of the three scripts: what only a machine with a GPU can test (skipped on the others).

`benchmarks/gpu_check.sh` runs these on a GPU machine, beside a timed Breakout run. They check that each script
really trains on the GPU when asked, that a checkpoint written there evaluates and resumes on a CPU (the way
users move a trained policy to their laptop), that the GPU computes the CPU's gradient, and that a seed
reproduces its curve on the GPU as it does on the CPU. Without a GPU, only the check script's own refusal runs.
"""

import copy
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO_ROOT, load_script, only_run_dir, read_scalars, run_script, script_env

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TINY = {
    "ppo_discrete": ["--total-timesteps", 512, "--num-envs", 2, "--num-steps", 64],
    "ppo_continuous": ["--env-id", "Pendulum-v1", "--total-timesteps", 1024, "--num-steps", 256,
                       "--num-minibatches", 4, "--update-epochs", 2],
    "ppo_atari": ["--total-timesteps", 512, "--num-envs", 2, "--num-steps", 128],
}


def env(**extra):
    """script_env, keeping PYTHONPATH: gpu_check.sh finds the packages a bare GPU machine lacks through it."""
    return script_env(**extra, **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ})


def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


@needs_gpu
@pytest.mark.parametrize("script", sorted(TINY))
def test_trains_on_the_gpu_and_its_checkpoint_evaluates_and_resumes_on_the_cpu(script, tmp_path):
    trained = ok(run_script(script, *TINY[script], "--cuda", "--save-model", "--progress-interval", 0,
                            cwd=tmp_path, env=env()))
    assert " on cuda" in trained.stdout, trained.stdout  # not a silent fall-back to the CPU
    checkpoint = only_run_dir(tmp_path) / "checkpoint.pt"
    no_gpu = env(CUDA_VISIBLE_DEVICES="")  # as on a laptop: a checkpoint that needs CUDA to load fails here
    evaluated = ok(run_script(script, "--eval-checkpoint", checkpoint, "--eval-episodes", 2, "--no-cuda",
                              cwd=tmp_path, env=no_gpu))
    assert "over 2 " in evaluated.stdout, evaluated.stdout
    # Back to the middle of the run, keeping the GPU's tensors (no map_location): the CPU run trains the rest.
    ckpt = torch.load(checkpoint, weights_only=True)
    assert ckpt["model"][next(iter(ckpt["model"]))].is_cuda
    ckpt["iteration"], ckpt["global_step"] = 1, ckpt["args"]["num_envs"] * ckpt["args"]["num_steps"]
    elsewhere = tmp_path / "on_the_laptop"
    elsewhere.mkdir()
    torch.save(ckpt, elsewhere / "middle.pt")
    resumed = ok(run_script(script, "--resume", elsewhere / "middle.pt", "--no-cuda", "--progress-interval", 0,
                            cwd=elsewhere, env=no_gpu))
    assert "resuming at step" in resumed.stdout and " on cpu" in resumed.stdout, resumed.stdout


@needs_gpu
def test_the_gpu_computes_the_cpus_gradient_of_one_atari_minibatch(monkeypatch):
    pa = load_script("ppo_atari")
    # TF32 convolutions keep 10 mantissa bits, not float32's 23: compare like with like.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # no Winograd kernels either
    torch.manual_seed(0)
    cpu_agent = pa.Agent(n_actions=4)
    obs = torch.randint(0, 256, (64, 4, 84, 84), dtype=torch.uint8)
    actions = torch.randint(0, 4, (64,))
    advantages, returns, old_values = torch.randn(64) * 3 + 1, torch.randn(64), torch.randn(64)
    with torch.no_grad():
        old_logprobs = cpu_agent.get_action_and_value(obs, actions)[1] + 0.3 * torch.randn(64)

    def gradients(agent, device):
        agent.zero_grad()
        _, logprob, entropy, value = agent.get_action_and_value(obs.to(device), actions.to(device))
        ratio = (logprob - old_logprobs.to(device)).exp()
        pg_loss = -pa.clipped_surrogate(ratio, pa.normalize(advantages.to(device)), 0.1).mean()
        v_loss = pa.value_loss(value, old_values.to(device), returns.to(device), 0.1)
        (pg_loss - 0.01 * entropy.mean() + 0.5 * v_loss).backward()
        return [p.grad.cpu() for p in agent.parameters()]

    gpu_agent = copy.deepcopy(cpu_agent).to("cuda")
    for on_cpu, on_gpu in zip(gradients(cpu_agent, "cpu"), gradients(gpu_agent, "cuda")):
        # float32 sums in another order: ~1e-6 of the largest entry; a wrong layout or dtype gives ~1e-1
        assert (on_cpu - on_gpu).abs().max() <= 1e-4 * on_cpu.abs().max() + 1e-7


@needs_gpu
def test_same_seed_same_curve_on_the_gpu(tmp_path):
    curves = []
    for name in ("a", "b"):
        cwd = tmp_path / name
        cwd.mkdir()
        ok(run_script("ppo_atari", *TINY["ppo_atari"], "--cuda", "--seed", 3, "--progress-interval", 0,
                           cwd=cwd, env=env()))
        scalars = read_scalars(only_run_dir(cwd))
        curves.append({tag: scalars[tag] for tag in ("losses/value_loss", "losses/policy_loss", "losses/approx_kl")})
    assert curves[0] == curves[1]


@needs_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_torchrun_on_two_gpus_trains_one_run(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(load_script("ppo_atari").__file__), *map(str, TINY["ppo_atari"]), "--cuda", "--save-model",
           "--progress-interval", 0]
    result = ok(subprocess.run(list(map(str, cmd)), cwd=tmp_path, env=env(), capture_output=True,
                               text=True, timeout=600))
    assert " on cuda" in result.stdout, result.stdout
    assert (only_run_dir(tmp_path) / "checkpoint.pt").is_file()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_gpu_check_on_a_machine_without_a_gpu_says_so_and_writes_nothing(tmp_path):
    result = subprocess.run(["bash", str(REPO_ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path / "out")],
                            env=script_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["gpu_check.sh: error: torch sees no CUDA GPU here; run this on "
                                                  "a machine with one"]
    assert not (tmp_path / "out").exists()
