"""Tests of ppo_continuous.py: the Gaussian policy, the normalisation statistics, checkpoints, end-to-end runs,
bad input, and long runs (stop signals, progress lines, checkpoint cadence). Training runs are tiny (4
iterations of 256 steps) and go in subprocesses with a temporary working directory; tests that need to reach
into the loop (a custom env, a signal at a chosen moment, a fake clock) run main() in-process."""

import math
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Optional

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Normal

from conftest import (REPO_ROOT, load_script, main_in_process, only_run_dir, read_scalars, run_script, run_scripts,
                      script_env)

SCRIPT = "ppo_continuous"
# 4 iterations of 256 steps, 4 minibatches of 64, 2 epochs: a Pendulum run logs 5 episodes of 200 steps.
TINY = ["--total-timesteps", 1024, "--num-steps", 256, "--num-minibatches", 4, "--update-epochs", 2]
PENDULUM = ["--env-id", "Pendulum-v1", *TINY]
ITERATION_STEPS = [256, 512, 768, 1024]


@pytest.fixture(scope="module")
def pc():
    return load_script(SCRIPT)


def run_main_in_process(pc, args, cwd, monkeypatch, capsys):
    """main() in this process: (exit code, stderr, stdout); conftest restores the signal handlers after it."""
    return main_in_process(pc, args, cwd, monkeypatch, capsys)


def _ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _values(scalars, tag):
    return [v for _, v in scalars[tag]]


def _steps(scalars, tag):
    return [s for s, _ in scalars[tag]]


# ----------------------------------------------------------------------------------------------
# Shared tiny runs (module scope: each is run once)
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pendulum_run(tmp_path_factory):
    """Seed-1 Pendulum run with --save-model; nothing modifies its directory afterwards."""
    cwd = tmp_path_factory.mktemp("pendulum")
    result = run_script(SCRIPT, *PENDULUM, "--seed", 1, "--save-model", cwd=cwd)
    _ok(result)
    run_dir = only_run_dir(cwd)
    return {"cwd": cwd, "result": result, "run_dir": run_dir, "ckpt": run_dir / "checkpoint.pt"}


def _copy_runs(pendulum_run, dest):
    """A private copy of the Pendulum run's runs/ tree, since a resumed run writes into its run directory."""
    shutil.copytree(pendulum_run["cwd"] / "runs", dest / "runs")
    return dest / "runs" / pendulum_run["run_dir"].name


@pytest.fixture(scope="module")
def resumed_run(pendulum_run, tmp_path_factory):
    """Resume from a copy of the finished checkpoint set back to iteration 2 (global step 512)."""
    cwd = tmp_path_factory.mktemp("resume_back")
    run_dir = _copy_runs(pendulum_run, cwd)
    saved = _load(pendulum_run["ckpt"])
    back = dict(saved, iteration=2, global_step=512)
    torch.save(back, cwd / "back.pt")
    (run_dir / "checkpoint.pt").rename(run_dir / "final.pt")  # else the older one may not resume over it
    result = run_script(SCRIPT, "--resume", cwd / "back.pt", "--save-model", cwd=cwd)
    _ok(result)
    return {"cwd": cwd, "result": result, "run_dir": run_dir, "saved": saved}


@pytest.fixture(scope="module")
def finished_resume(pendulum_run, tmp_path_factory):
    """Resume the finished checkpoint (no iterations left), in a copy of its run folder, with --save-model,
    from an empty working directory."""
    copy, cwd = tmp_path_factory.mktemp("finished_copy"), tmp_path_factory.mktemp("resume_finished")
    run_dir = _copy_runs(pendulum_run, copy)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    result = run_script(SCRIPT, "--resume", run_dir / "checkpoint.pt", "--save-model", cwd=cwd)
    return {"result": result, "cwd": cwd, "run_dir": run_dir, "before": before}


# ----------------------------------------------------------------------------------------------
# 1. The Gaussian policy and the initialisation [cont-1..4], [core-2]
# ----------------------------------------------------------------------------------------------


def test_log_prob_and_entropy_are_sums_of_per_dimension_normals(pc):
    torch.manual_seed(0)
    agent = pc.Agent(5, 3)
    # [cont-2] a learned, state-independent log-std per dimension, starting at 0 (std 1)
    assert isinstance(agent.actor_logstd, torch.nn.Parameter) and agent.actor_logstd.requires_grad
    assert agent.actor_logstd.shape == (1, 3)
    assert torch.equal(agent.actor_logstd.detach(), torch.zeros(1, 3))
    with torch.no_grad():  # distinct stds per dimension, so a mix-up between dimensions would show
        agent.actor_logstd.copy_(torch.tensor([[-0.5, 0.2, 1.0]]))
    obs = torch.randn(8, 5)
    with torch.no_grad():
        action, logprob, entropy, value = agent.get_action_and_value(obs)
        mean, logstd = agent.actor_mean(obs), agent.actor_logstd[0].detach()
    std = logstd.exp()
    assert action.shape == (8, 3) and logprob.shape == (8,) and entropy.shape == (8,) and value.shape == (8,)

    by_normal = sum(Normal(mean[:, d], std[d]).log_prob(action[:, d]) for d in range(3))
    by_hand = sum(-((action[:, d] - mean[:, d]) ** 2) / (2 * std[d] ** 2) - logstd[d] - 0.5 * math.log(2 * math.pi)
                  for d in range(3))
    torch.testing.assert_close(logprob, by_normal)
    torch.testing.assert_close(logprob, by_hand)
    entropy_by_normal = sum(Normal(mean[:, d], std[d]).entropy() for d in range(3))
    entropy_by_hand = torch.full((8,), float((0.5 + 0.5 * math.log(2 * math.pi) + logstd).sum()))
    torch.testing.assert_close(entropy, entropy_by_normal)
    torch.testing.assert_close(entropy, entropy_by_hand)
    torch.testing.assert_close(value, agent.critic(obs).squeeze(-1).detach())

    # A given action is evaluated, not replaced (the update re-scores the stored samples).
    given = torch.randn(8, 3) * 5
    with torch.no_grad():
        same, logprob_given, _, _ = agent.get_action_and_value(obs, given)
    assert torch.equal(same, given)
    torch.testing.assert_close(
        logprob_given, sum(Normal(mean[:, d], std[d]).log_prob(given[:, d]) for d in range(3)))

    # The samples really come from N(mean, std): per-dimension spread around the mean is std.
    many = torch.randn(1, 5).expand(20000, 5)
    with torch.no_grad():
        samples = agent.get_action_and_value(many)[0]
        spread = (samples - agent.actor_mean(many)).std(0)
    torch.testing.assert_close(spread, std, rtol=0.03, atol=0.0)


def test_initialisation_orthogonal_with_ppo2_gains_and_separate_networks(pc):
    torch.manual_seed(0)
    agent = pc.Agent(17, 6)
    sqrt2 = math.sqrt(2)
    layers = [(agent.critic[0], sqrt2), (agent.critic[2], sqrt2), (agent.critic[4], 1.0),
              (agent.actor_mean[0], sqrt2), (agent.actor_mean[2], sqrt2), (agent.actor_mean[4], 0.01)]
    assert agent.critic[4].out_features == 1 and agent.actor_mean[4].out_features == 6
    assert all(layer.out_features == 64 for layer in (agent.critic[0], agent.critic[2],
                                                       agent.actor_mean[0], agent.actor_mean[2]))
    for layer, gain in layers:
        w = layer.weight.detach().double()
        gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w  # on the smaller dimension
        torch.testing.assert_close(gram / gain**2, torch.eye(min(w.shape), dtype=torch.float64),
                                   atol=1e-5, rtol=0)
        assert torch.count_nonzero(layer.bias) == 0
    assert isinstance(agent.critic[1], torch.nn.Tanh) and isinstance(agent.actor_mean[3], torch.nn.Tanh)
    # [cont-4] separate networks: no parameter shared between the policy and the value function
    assert not {id(p) for p in agent.critic.parameters()} & {id(p) for p in agent.actor_mean.parameters()}


# ----------------------------------------------------------------------------------------------
# 2. [cont-5] The env gets the clipped action; the buffer keeps (and the update re-scores) the sample
# ----------------------------------------------------------------------------------------------

_BOUND = 0.1
_ENV_ID = "ContinuousTestBoundedActions-v0"


class _BoundedActionEnv(gym.Env):
    """Actions in [-0.1, 0.1]^2: a std-1 Gaussian sample almost always exceeds them. Records what it receives."""

    instances = []

    def __init__(self):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Box(-_BOUND, _BOUND, (2,), np.float32)
        self.received = []
        type(self).instances.append(self)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.normal(size=3).astype(np.float32), {}

    def step(self, action):
        self.received.append(np.array(action, copy=True))
        obs = self.np_random.normal(size=3).astype(np.float32)
        return obs, float(-np.square(action).sum()), False, False, {}


def test_env_gets_clipped_action_buffer_keeps_unclipped_sample(pc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(gym.envs.registry, _ENV_ID, gym.envs.registration.EnvSpec(
        id=_ENV_ID, entry_point=_BoundedActionEnv, max_episode_steps=20))
    monkeypatch.setattr(_BoundedActionEnv, "instances", [])
    # main() changes process-wide torch settings: put them back afterwards.
    threads = torch.get_num_threads()

    sampled, rescored = [], []
    original = pc.Agent.get_action_and_value

    def spy(self, obs, action=None):
        out = original(self, obs, action)
        (sampled if action is None else rescored).append(out[0].detach().cpu().numpy().copy())
        return out

    monkeypatch.setattr(pc.Agent, "get_action_and_value", spy)
    monkeypatch.setattr(sys, "argv", [
        "ppo_continuous.py", "--env-id", _ENV_ID, "--num-envs", "2", "--num-steps", "32",
        "--total-timesteps", "128", "--num-minibatches", "2", "--update-epochs", "2", "--no-progress"])
    try:
        pc.main()
    finally:
        torch.set_num_threads(threads)

    sampled = np.stack(sampled)  # 2 iterations of 32 steps, 2 envs, 2 dims
    assert sampled.shape == (64, 2, 2)
    stepped = [env for env in _BoundedActionEnv.instances if env.received]
    assert len(stepped) == 2
    for i, env in enumerate(stepped):
        received = np.stack(env.received)
        assert np.all(np.abs(received) <= _BOUND)
        # exactly the clipped sample, step by step
        np.testing.assert_array_equal(received, np.clip(sampled[:, i], -_BOUND, _BOUND))
    assert np.mean(np.abs(sampled) > _BOUND) > 0.5  # clipping really happened

    # The update re-scores the unclipped samples: every stored row, and nothing else.
    rescored = np.concatenate(rescored)
    assert rescored.shape == (2 * 2 * 64, 2)  # 2 iterations of 64 samples, 2 epochs each
    assert np.mean(np.abs(rescored) > _BOUND) > 0.5
    np.testing.assert_array_equal(np.unique(rescored, axis=0), np.unique(sampled.reshape(-1, 2), axis=0))


# ----------------------------------------------------------------------------------------------
# 3. [cont-6, cont-7] Observation statistics and normalisation
# ----------------------------------------------------------------------------------------------


def _with_prior(xs, prior_count=1e-4):
    """Exact mean and variance of the data pooled with the initial pseudo-sample (mean 0, var 1, weight 1e-4)."""
    n = prior_count + len(xs)
    mean = xs.sum(axis=0) / n
    var = (prior_count * (1.0 + mean**2) + ((xs - mean) ** 2).sum(axis=0)) / n
    return mean, var


def test_running_mean_std_matches_numpy_over_a_stream(pc):
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (1, 7, 3, 50, 2)]
    rms = pc.RunningMeanStd((4,))
    assert np.all(rms.mean == 0) and np.all(rms.var == 1) and rms.count == pytest.approx(1e-4)
    for batch in batches:
        rms.update(batch)
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, np.mean(data, axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rms.var, np.var(data, axis=0), rtol=1e-5, atol=1e-6)
    mean, var = _with_prior(data)  # and exactly, counting the initial 1e-4
    np.testing.assert_allclose(rms.mean, mean, rtol=1e-10)
    np.testing.assert_allclose(rms.var, var, rtol=1e-10)
    assert rms.count == pytest.approx(len(data) + 1e-4, abs=1e-9)

    scalar = pc.RunningMeanStd()  # the return statistics: shape ()
    for batch in batches:
        scalar.update(batch[:, 0])
    assert np.shape(scalar.mean) == () and np.shape(scalar.var) == ()
    np.testing.assert_allclose(scalar.var, np.var(data[:, 0]), rtol=1e-5)


def test_running_mean_std_is_shared_across_envs(pc):
    rng = np.random.default_rng(1)
    warmup, batch = rng.normal(size=(5, 3)), rng.normal(-1.0, 3.0, size=(4, 3))  # (num_envs, obs)
    together, row_by_row = pc.RunningMeanStd((3,)), pc.RunningMeanStd((3,))
    together.update(warmup)
    row_by_row.update(warmup)
    together.update(batch)
    for row in batch:
        row_by_row.update(row[None])
    assert together.mean.shape == (3,) and together.var.shape == (3,)  # one set of statistics, not one per env
    np.testing.assert_allclose(together.mean, row_by_row.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(together.var, row_by_row.var, rtol=1e-12, atol=1e-12)
    assert together.count == pytest.approx(row_by_row.count)
    state = together.state_dict()
    restored = pc.RunningMeanStd((3,))
    restored.load_state_dict(state)
    np.testing.assert_array_equal(restored.mean, together.mean)
    np.testing.assert_array_equal(restored.var, together.var)
    assert restored.count == together.count


def test_normalize_obs_scales_then_clips(pc):
    rms = pc.RunningMeanStd((3,))
    rms.mean, rms.var = np.array([1.0, -2.0, 0.0]), np.array([4.0, 0.25, 1e-6])
    obs = np.array([[3.0, -2.5, 1e-4], [-100.0, 100.0, -1.0], [1.0, -2.0, 1.0]])
    out = pc.normalize_obs(obs, rms, 10.0)
    expected = np.array([[1.0, -1.0, 1e-4 / math.sqrt(1e-6 + 1e-8)], [-10.0, 10.0, -10.0], [0.0, 0.0, 10.0]])
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(pc.normalize_obs(obs, rms, 0.5),
                               np.clip(expected, -0.5, 0.5), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# 4. [cont-8, cont-9] Reward scaling
# ----------------------------------------------------------------------------------------------


def test_scale_reward_by_running_std_of_discounted_return(pc):
    gamma = 0.9
    rewards = [np.array([1.0, 2.0]), np.array([0.5, -1.0]), np.array([2.0, 1.0])]
    dones = [np.array([False, False]), np.array([True, False]), np.array([False, False])]
    # Discounted returns by hand (env 0's episode ends at step 2, so step 3 starts again from 0).
    returns_seen = [np.array([1.0, 2.0]), np.array([1.4, 0.8]), np.array([2.0, 1.72])]
    carried = [np.array([1.0, 2.0]), np.array([0.0, 0.8]), np.array([2.0, 1.72])]

    rms, discounted = pc.RunningMeanStd(), np.zeros(2)
    buffer = discounted
    for t in range(3):
        scaled = pc.scale_reward(rewards[t], dones[t], discounted, rms, gamma, 10.0)
        assert discounted is buffer  # updated in place
        np.testing.assert_allclose(discounted, carried[t], rtol=1e-12, atol=1e-12)
        _, var = _with_prior(np.concatenate(returns_seen[:t + 1]))
        np.testing.assert_allclose(rms.var, var, rtol=1e-10)
        # divided by the std, mean not subtracted: the sign of each reward is kept
        np.testing.assert_allclose(scaled, rewards[t] / np.sqrt(var + 1e-8), rtol=1e-10)
        assert np.array_equal(np.sign(scaled), np.sign(rewards[t]))
    assert rms.count == pytest.approx(6 + 1e-4)


def test_scale_reward_clips(pc):
    rms = pc.RunningMeanStd()
    rms.count, rms.var = 1e9, np.array(1e-2)  # tiny, nearly frozen variance: std about 0.1
    scaled = pc.scale_reward(np.array([100.0, -100.0, 0.5]), np.zeros(3, dtype=bool), np.zeros(3), rms, 0.99, 10.0)
    np.testing.assert_allclose(scaled[:2], [10.0, -10.0])
    np.testing.assert_allclose(scaled[2], 0.5 / np.sqrt(rms.var + 1e-8), rtol=1e-10)
    assert 1.0 < scaled[2] < 10.0
    rms.count, rms.var = 1e9, np.array(1e-2)
    scaled = pc.scale_reward(np.array([100.0]), np.zeros(1, dtype=bool), np.zeros(1), rms, 0.99, 3.0)
    np.testing.assert_allclose(scaled, [3.0])


# ----------------------------------------------------------------------------------------------
# 5. Checkpoints: the statistics are saved, frozen in evaluation, and carried on by resume
# ----------------------------------------------------------------------------------------------


def test_checkpoint_holds_normalisation_statistics(pendulum_run):
    assert "checkpoint saved to" in pendulum_run["result"].stdout
    ckpt = _load(pendulum_run["ckpt"])
    assert ckpt["script"] == "ppo_continuous" and ckpt["args"]["env_id"] == "Pendulum-v1"
    assert ckpt["iteration"] == 4 and ckpt["global_step"] == 1024
    obs_rms, return_rms = ckpt["obs_rms"], ckpt["return_rms"]
    assert obs_rms["mean"].shape == (3,) and obs_rms["var"].shape == (3,)
    assert return_rms["mean"].shape == () and return_rms["var"].shape == ()
    assert torch.all(obs_rms["var"] > 0) and return_rms["var"] > 0
    # Every observation the envs returned (the first reset plus one per step; Pendulum's truncations return
    # the next episode's first observation in the same step) and nothing else, e.g. no final observations.
    assert obs_rms["count"] == pytest.approx(1e-4 + 1 + 1024, abs=1e-6)
    assert return_rms["count"] == pytest.approx(1e-4 + 1024, abs=1e-6)  # one return per step
    assert {k: v.shape for k, v in ckpt["model"].items()}["actor_logstd"] == (1, 1)


def test_evaluate_uses_and_never_updates_the_saved_statistics(pc, pendulum_run, tmp_path):
    ckpt = _load(pendulum_run["ckpt"])
    before = pendulum_run["ckpt"].read_bytes()
    result = run_script(SCRIPT, "--eval-checkpoint", pendulum_run["ckpt"], "--eval-episodes", 2, cwd=tmp_path)
    _ok(result)
    assert "+-" in result.stdout and "over 2 episodes (deterministic)" in result.stdout
    assert not (tmp_path / "runs").exists()
    assert pendulum_run["ckpt"].read_bytes() == before

    calls = []

    class SpyRunningMeanStd(pc.RunningMeanStd):
        def update(self, batch):
            calls.append(batch)
            super().update(batch)

    obs_rms = SpyRunningMeanStd((3,))
    obs_rms.load_state_dict(ckpt["obs_rms"])
    mean, var, count = obs_rms.mean.copy(), obs_rms.var.copy(), obs_rms.count
    agent = pc.Agent(3, 1)
    agent.load_state_dict(ckpt["model"])
    args = pc.Args(env_id="Pendulum-v1", eval_episodes=2)
    returns = [r for r, _ in pc.play_episodes(agent, obs_rms, args, torch.device("cpu"))]
    assert calls == []
    np.testing.assert_array_equal(obs_rms.mean, mean)
    np.testing.assert_array_equal(obs_rms.var, var)
    assert obs_rms.count == count
    assert len(returns) == 2 and all(-16.3 * 200 <= r <= 0 for r in returns)
    # the subprocess printed the same numbers: it evaluated with the same saved statistics
    printed_mean = float([line for line in result.stdout.splitlines() if "+-" in line][0].split(":")[1].split("+-")[0])
    assert printed_mean == pytest.approx(np.mean(returns), abs=0.011)
    # and the statistics matter: fresh ones give a different policy input, so different returns
    assert [r for r, _ in pc.play_episodes(agent, pc.RunningMeanStd((3,)), args, torch.device("cpu"))] != returns


def test_resume_continues_from_the_saved_statistics(resumed_run):
    saved, result = resumed_run["saved"], resumed_run["result"]
    assert "checkpoint saved to" in result.stdout
    assert only_run_dir(resumed_run["cwd"]) == resumed_run["run_dir"]  # same run, no new directory
    final = _load(resumed_run["run_dir"] / "checkpoint.pt")
    assert final["iteration"] == 4 and final["global_step"] == 1024 and final["run_name"] == saved["run_name"]
    # Two more iterations of 256 steps on top of the saved counts (the resumed run's first reset
    # observation is not counted): statistics restarted from scratch would count 1e-4 + 513.
    assert final["obs_rms"]["count"] == pytest.approx(saved["obs_rms"]["count"] + 512, abs=1e-6)
    assert final["return_rms"]["count"] == pytest.approx(saved["return_rms"]["count"] + 512, abs=1e-6)
    assert not torch.equal(final["obs_rms"]["mean"], saved["obs_rms"]["mean"])
    # pooled with the saved statistics, the new mean stays close to the saved one (2/3 of the weight)
    assert torch.allclose(final["obs_rms"]["mean"][:2], saved["obs_rms"]["mean"][:2], atol=0.5)
    for name in ("learning_rate", "num_steps", "seed", "env_id", "total_timesteps"):
        assert final["args"][name] == saved["args"][name]
    assert final["args"]["save_model"] is True


def test_resume_keeps_the_charts_logged_up_to_the_checkpoint_and_continues_them(resumed_run):
    scalars = read_scalars(resumed_run["run_dir"])
    # iterations 1-2 from the first run (logged before its checkpoint), 3-4 from the resumed one: nothing
    # hidden, nothing twice (a purge at the checkpoint's own step would lose 512)
    assert _steps(scalars, "losses/value_loss") == ITERATION_STEPS
    assert _steps(scalars, "charts/learning_rate") == ITERATION_STEPS
    np.testing.assert_allclose(_values(scalars, "charts/learning_rate"), [3e-4, 2.25e-4, 1.5e-4, 7.5e-5], rtol=1e-5)
    # episodes the first run ended after step 512 are hidden; the resumed run starts fresh episodes there
    assert _steps(scalars, "charts/episodic_return") == [200, 400, 512 + 200, 512 + 400]


def test_resume_finished_checkpoint_says_so_and_writes_nothing(finished_resume):
    result = finished_resume["result"]
    _ok(result)
    assert "already finished" in result.stdout and "larger --total-timesteps" in result.stdout
    assert result.stderr == ""
    assert list(finished_resume["cwd"].iterdir()) == []
    # the run folder is untouched: same files, same bytes (no new event file, checkpoint not rewritten)
    after = {p.name: p.read_bytes() for p in finished_resume["run_dir"].iterdir()}
    assert after == finished_resume["before"]


# ----------------------------------------------------------------------------------------------
# 6. End-to-end runs
# ----------------------------------------------------------------------------------------------


def test_pendulum_end_to_end_logs(pendulum_run):
    scalars = read_scalars(pendulum_run["run_dir"])
    assert _steps(scalars, "charts/episodic_return") == [200, 400, 600, 800, 1000]
    assert _values(scalars, "charts/episodic_length") == [200] * 5
    assert all(-16.3 * 200 <= r <= 0 for r in _values(scalars, "charts/episodic_return"))  # raw env units
    for tag in ("losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/approx_kl",
                "losses/old_approx_kl", "losses/clipfrac", "losses/explained_variance", "charts/SPS"):
        assert _steps(scalars, tag) == ITERATION_STEPS, tag
        assert all(math.isfinite(v) for v in _values(scalars, tag)), tag
    # [core-4] annealed linearly from 3e-4: logged after setting it for iterations 1..4
    np.testing.assert_allclose(_values(scalars, "charts/learning_rate"), [3e-4, 2.25e-4, 1.5e-4, 7.5e-5], rtol=1e-5)
    # [cont-3] entropy of a 1-D Gaussian with log-std near 0: about 1.419
    assert abs(_values(scalars, "losses/entropy")[0] - 0.5 * (1 + math.log(2 * math.pi))) < 0.05


def test_mujoco_end_to_end(tmp_path):
    result = run_script(SCRIPT, "--env-id", "Hopper-v5", *TINY, cwd=tmp_path)
    _ok(result)
    scalars = read_scalars(only_run_dir(tmp_path))
    lengths = _values(scalars, "charts/episodic_length")
    assert lengths and min(lengths) < 1000  # Hopper terminates when it falls
    assert _steps(scalars, "losses/value_loss") == ITERATION_STEPS
    assert all(math.isfinite(v) for v in _values(scalars, "losses/value_loss") + _values(scalars, "losses/policy_loss"))
    assert abs(_values(scalars, "losses/entropy")[0] - 3 * 0.5 * (1 + math.log(2 * math.pi))) < 0.1  # 3 dims


def test_same_seed_same_curve_other_seed_differs(pendulum_run, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    same, other = run_scripts([(SCRIPT, [*PENDULUM, "--seed", 1], tmp_path / "a"),
                               (SCRIPT, [*PENDULUM, "--seed", 2], tmp_path / "b")], max_workers=2)
    _ok(same)
    _ok(other)
    reference = read_scalars(pendulum_run["run_dir"])
    same, other = read_scalars(only_run_dir(tmp_path / "a")), read_scalars(only_run_dir(tmp_path / "b"))
    assert len(reference["charts/episodic_return"]) >= 1
    assert same["charts/episodic_return"] == reference["charts/episodic_return"]
    assert same["losses/value_loss"] == reference["losses/value_loss"]
    assert same["losses/approx_kl"] == reference["losses/approx_kl"]
    assert len(other["charts/episodic_return"]) >= 1
    assert _values(other, "charts/episodic_return") != _values(reference, "charts/episodic_return")


def test_capture_video_writes_mp4_in_training_and_of_every_evaluated_episode(tmp_path):
    env = script_env()
    env.pop("MUJOCO_GL", None)  # the script picks headless EGL itself
    result = run_script(SCRIPT, "--env-id", "InvertedPendulum-v5", *TINY, "--capture-video", "--save-model",
                        cwd=tmp_path, env=env)
    if result.returncode != 0 and ("EGL" in result.stderr or "egl" in result.stderr) and not os.environ.get("CI"):
        pytest.skip(f"headless MuJoCo rendering (EGL) unavailable here: {result.stderr.strip().splitlines()[-1]}")
    _ok(result)
    assert result.stderr == ""
    run_dir = only_run_dir(tmp_path)
    videos = tmp_path / "videos" / run_dir.name
    trained = list(videos.glob("*.mp4"))
    assert any(v.name == "rl-video-episode-0.mp4" for v in trained), trained
    assert all(v.stat().st_size > 0 for v in trained)
    # gymnasium's schedule in training: the cubes (0, 1, 8, 27, 64, ...), never episode 2
    assert {int(v.stem.rsplit("-", 1)[1]) for v in trained} <= {0, 1, 8, 27, 64, 125, 216}

    # --eval-checkpoint --capture-video: every evaluated episode, in a folder of its own
    evaluation = run_script(SCRIPT, "--eval-checkpoint", run_dir / "checkpoint.pt", "--eval-episodes", 2,
                            "--capture-video", cwd=tmp_path, env=env)
    _ok(evaluation)
    assert evaluation.stderr == ""
    evaluated = videos / "eval-at-step-1024"
    assert sorted(p.name for p in evaluated.glob("*.mp4")) == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4"]
    assert f"videos of the 2 episodes in videos/{run_dir.name}/eval-at-step-1024" in evaluation.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "videos"]


# ----------------------------------------------------------------------------------------------
# 7. Bad input: one "error:" line, non-zero exit, no traceback, no runs/ directory
# ----------------------------------------------------------------------------------------------


def _bad_case(case, cwd, ckpt):
    """Arguments for each bad-input case (building the checkpoint files it needs in cwd), and the text
    the error line must contain."""
    if case == "discrete_env":
        return ["--env-id", "CartPole-v1", *TINY], ["ppo_discrete.py"]
    if case == "unknown_env":
        return ["--env-id", "NoSuchEnv-v0", *TINY], ["NoSuchEnv-v0"]
    if case == "minibatches_do_not_divide":
        return ["--env-id", "Pendulum-v1", "--num-steps", 100, "--num-minibatches", 3], ["100", "3 minibatches"]
    if case == "less_than_one_rollout":
        return ["--env-id", "Pendulum-v1", "--total-timesteps", 100, "--num-steps", 256, "--num-minibatches", 4], \
            ["100", "256"]
    if case == "missing_checkpoint":
        return ["--eval-checkpoint", cwd / "missing.pt"], ["not found", "missing.pt"]
    if case == "corrupt_checkpoint":
        data = ckpt.read_bytes()
        (cwd / "corrupt.pt").write_bytes(data[:len(data) // 2])  # a truncated write
        return ["--eval-checkpoint", cwd / "corrupt.pt"], ["cannot read checkpoint", "corrupt.pt"]
    if case == "other_script_checkpoint":
        torch.save({"script": "ppo_discrete", "args": {"env_id": "CartPole-v1"}}, cwd / "discrete.pt")
        return ["--eval-checkpoint", cwd / "discrete.pt"], ["ppo_discrete.py"]
    if case == "observation_shape_mismatch":
        modified = _load(ckpt)
        modified["args"] = dict(modified["args"], env_id="InvertedPendulum-v5")  # obs size 4, saved 3
        torch.save(modified, cwd / "mismatch.pt")
        return ["--eval-checkpoint", cwd / "mismatch.pt"], ["shape", "(3,)", "(4,)"]
    if case == "checkpoint_for_other_env":
        shutil.copy(ckpt, cwd / "pendulum.pt")
        return ["--eval-checkpoint", cwd / "pendulum.pt", "--env-id", "Hopper-v5"], ["Pendulum-v1", "Hopper-v5"]
    if case == "resume_with_other_hyperparameter":
        shutil.copy(ckpt, cwd / "pendulum.pt")
        return ["--resume", cwd / "pendulum.pt", "--learning-rate", 0.1], ["--learning-rate", "checkpoint"]
    raise AssertionError(case)


BAD_CASES = [
    "discrete_env", "unknown_env", "minibatches_do_not_divide", "less_than_one_rollout", "missing_checkpoint",
    "corrupt_checkpoint", "other_script_checkpoint", "observation_shape_mismatch", "checkpoint_for_other_env",
    "resume_with_other_hyperparameter"]


@pytest.fixture(scope="module")
def bad_runs(pendulum_run, tmp_path_factory):
    """All bad-input cases, each in its own working directory, run concurrently (they only start up)."""
    cases = {}
    for case in BAD_CASES:
        cwd = tmp_path_factory.mktemp(case)
        args, expected = _bad_case(case, cwd, pendulum_run["ckpt"])
        cases[case] = (cwd, [*args, "--no-progress"], expected)
    results = run_scripts([(SCRIPT, args, cwd) for cwd, args, _ in cases.values()], max_workers=3, timeout=120)
    return {case: (cwd, expected, result) for (case, (cwd, _, expected)), result in zip(cases.items(), results)}


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_fails_with_one_error_line(case, bad_runs):
    cwd, expected, result = bad_runs[case]
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and error_lines[0].startswith("error: "), result.stderr
    assert result.stderr.strip().splitlines()[-1] == error_lines[0]
    for text in expected:
        assert text in error_lines[0], (text, error_lines[0])
    assert "weights_only" not in error_lines[0]  # torch's unsafe advice is not the user's business
    assert not (cwd / "runs").exists()


@pytest.fixture(scope="module")
def range_cases(pendulum_run, tmp_path_factory):
    """Settings refused before any work: name -> (arguments, words the error line must contain). The bad
    setting comes last (the last of a repeated flag wins); PENDULUM keeps a case that wrongly passes short."""
    files = tmp_path_factory.mktemp("range_files")
    real = pendulum_run["ckpt"]
    return {
        "gamma_above_one": ([*PENDULUM, "--gamma", 1.5], ["--gamma 1.5 is out of range: it must be in [0, 1]"]),
        "negative_lambda": ([*PENDULUM, "--gae-lambda", -0.1], ["--gae-lambda", "[0, 1]"]),
        "negative_clip": ([*PENDULUM, "--clip-coef", -0.2], ["--clip-coef", "> 0"]),
        "negative_learning_rate": ([*PENDULUM, "--learning-rate", -1], ["--learning-rate", "> 0"]),
        "nan_learning_rate": ([*PENDULUM, "--learning-rate", "nan"], ["--learning-rate"]),
        "negative_ent_coef": ([*PENDULUM, "--ent-coef", -0.01], ["--ent-coef", ">= 0"]),
        "zero_vf_coef": ([*PENDULUM, "--vf-coef", 0], ["--vf-coef", "> 0"]),
        "infinite_max_grad_norm": ([*PENDULUM, "--max-grad-norm", "inf"], ["--max-grad-norm"]),
        "zero_target_kl": ([*PENDULUM, "--target-kl", 0], ["--target-kl"]),
        "zero_epochs": ([*PENDULUM, "--update-epochs", 0], ["--update-epochs", ">= 1"]),
        "zero_envs": ([*PENDULUM, "--num-envs", 0], ["--num-envs", ">= 1"]),
        "zero_steps": (["--num-steps", 0, "--env-id", "Pendulum-v1"], ["--num-steps", ">= 1"]),
        "zero_minibatches": (["--num-minibatches", 0, "--env-id", "Pendulum-v1"], ["--num-minibatches", ">= 1"]),
        "zero_threads": ([*PENDULUM, "--threads", 0], ["--threads", ">= 1"]),
        "negative_checkpoint_every": ([*PENDULUM, "--checkpoint-every", -1], ["--checkpoint-every", ">= 0"]),
        "negative_checkpoint_minutes": ([*PENDULUM, "--checkpoint-minutes", -5], ["--checkpoint-minutes"]),
        "negative_progress_interval": ([*PENDULUM, "--progress-interval", -1], ["--progress-interval"]),
        "zero_eval_episodes": ([*PENDULUM, "--eval-episodes", 0], ["--eval-episodes"]),
        "negative_seed": ([*PENDULUM, "--seed", -1], ["--seed", "[0, "]),
        "huge_seed": ([*PENDULUM, "--seed", 2**64], ["--seed", "[0, "]),
        # [cont-7] [cont-9] a clipping bound of 0 would zero every observation or reward
        "zero_clip_obs": ([*PENDULUM, "--clip-obs", 0], ["--clip-obs", "> 0"]),
        "negative_clip_reward": ([*PENDULUM, "--clip-reward", -10], ["--clip-reward", "> 0"]),
        "nan_clip_obs": ([*PENDULUM, "--clip-obs", "nan"], ["--clip-obs"]),
        "nested_exp_name": ([*PENDULUM, "--exp-name", "x/y"], ["--exp-name", "x/y"]),
        "empty_exp_name": ([*PENDULUM, "--exp-name", ""], ["--exp-name"]),
        "exp_name_with_separator": ([*PENDULUM, "--exp-name", "a__b"], ["--exp-name", "__"]),
        "eval_and_resume": (["--eval-checkpoint", real, "--resume", real], ["--eval-checkpoint", "--resume"]),
        "folder_as_checkpoint": (["--eval-checkpoint", files], ["folder"]),
        "text_file_as_checkpoint": (["--eval-checkpoint", Path(__file__)], ["cannot read"]),
        "extend_finished_run": (["--resume", real, "--total-timesteps", 2048],
                                ["--total-timesteps", "learning-rate schedule", "new run"]),
        "resume_changes_reward_clip": (["--resume", real, "--clip-reward", 5], ["--clip-reward", "checkpoint"]),
    }


RANGE_CASES = [
    "gamma_above_one", "negative_lambda", "negative_clip", "negative_learning_rate", "nan_learning_rate",
    "negative_ent_coef", "zero_vf_coef", "infinite_max_grad_norm", "zero_target_kl", "zero_epochs", "zero_envs",
    "zero_steps", "zero_minibatches", "zero_threads", "negative_checkpoint_every", "negative_checkpoint_minutes",
    "negative_progress_interval", "zero_eval_episodes", "negative_seed", "zero_clip_obs", "negative_clip_reward",
    "nan_clip_obs", "nested_exp_name", "empty_exp_name", "exp_name_with_separator", "eval_and_resume",
    "folder_as_checkpoint", "text_file_as_checkpoint", "extend_finished_run", "resume_changes_reward_clip",
]


@pytest.mark.parametrize("case", RANGE_CASES)
def test_out_of_range_setting_fails_before_any_work(pc, range_cases, case, tmp_path, monkeypatch, capsys):
    args, expected = range_cases[case]
    code, err, out = run_main_in_process(pc, args, tmp_path, monkeypatch, capsys)
    assert code == 2, (code, err, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for text in expected:
        assert text in lines[0], (text, lines[0])
    assert "weights_only" not in lines[0]
    assert out == "" and list(tmp_path.iterdir()) == []  # nothing said, nothing written


def test_every_numeric_setting_is_range_checked(pc, tmp_path, monkeypatch, capsys):
    """Each numeric field of Args given a value far outside any sensible range is refused, naming its flag:
    a field added later without a check fails here."""
    numeric = [f.name for f in fields(pc.Args) if f.type in (int, float, Optional[float])]
    assert {"clip_obs", "clip_reward", "eval_episodes", "checkpoint_minutes", "target_kl"} <= set(numeric)
    for name in numeric:
        flag = f"--{name.replace('_', '-')}"
        code, err, _ = run_main_in_process(pc, [flag, -5, "--env-id", "Pendulum-v1"], tmp_path, monkeypatch, capsys)
        assert code == 2 and err.startswith(f"error: {flag} -5"), (name, err)


# ----------------------------------------------------------------------------------------------
# 8. Truncation bootstrapping
# ----------------------------------------------------------------------------------------------


def test_no_bootstrap_truncation_runs_and_changes_the_targets(pendulum_run, tmp_path):
    result = run_script(SCRIPT, *PENDULUM, "--seed", 1, "--no-bootstrap-truncation", cwd=tmp_path)
    _ok(result)
    scalars, reference = read_scalars(only_run_dir(tmp_path)), read_scalars(pendulum_run["run_dir"])
    assert _steps(scalars, "losses/value_loss") == ITERATION_STEPS
    # same seed: the first episode (before any update) is the same; the truncation at step 200 is then
    # a plain end instead of reward + gamma V(final obs), so the value targets and losses differ
    assert scalars["charts/episodic_return"][0] == reference["charts/episodic_return"][0]
    assert _values(scalars, "losses/value_loss")[0] != _values(reference, "losses/value_loss")[0]


# ----------------------------------------------------------------------------------------------
# 9. Long runs: what the log says, stop signals, and a resumed run's checkpoint cadence
# ----------------------------------------------------------------------------------------------

PER_ITERATION_TAGS = ["charts/learning_rate", "charts/SPS", "losses/value_loss", "losses/policy_loss",
                      "losses/entropy", "losses/old_approx_kl", "losses/approx_kl", "losses/clipfrac",
                      "losses/explained_variance"]


def test_output_to_a_file_says_what_the_run_does(pendulum_run):
    """stdout is a pipe here, as in a Slurm log: a start line, plain progress lines, a summary line."""
    out = pendulum_run["result"].stdout
    lines = out.splitlines()
    assert lines[0].startswith(f"{SCRIPT}: Pendulum-v1, seed 1, 1024 steps on cpu; logs in runs/"), lines
    progress = [line for line in lines if line.startswith("step ")]
    # The first line comes after the first iteration, then one per --progress-interval (60 s by default).
    assert progress and progress[0].startswith("step 256/1024 (25%)"), lines
    assert re.search(r"\d+ steps/s +return\(last 100\) -?[\d.]+ +elapsed \d+:\d\d:\d\d", progress[0]), progress[0]
    assert "\r" not in out  # the live terminal line is for terminals only
    end = lines[-1]
    assert end.startswith(f"{SCRIPT}: done, 1024 steps in "), end
    assert f"logs in runs/{pendulum_run['run_dir'].name}" in end
    assert end.endswith(f"checkpoint saved to runs/{pendulum_run['run_dir'].name}/checkpoint.pt")
    # the mean of the last 100 episodes, in the env's own units: Pendulum's 5 episodes of the run
    returns = [v for _, v in read_scalars(pendulum_run["run_dir"])["charts/episodic_return"]]
    assert float(re.search(r"return\(last 100\) (-?[\d.]+)", end)[1]) == pytest.approx(np.mean(returns), abs=0.006)


def test_mujoco_default_budget_rounding_is_announced(pc, capsys):
    """The MuJoCo default, 1M steps in rollouts of 2048, trains 488 whole rollouts: 999,424 steps."""
    args = pc.Args()
    steps = args.total_timesteps // (args.num_envs * args.num_steps) * args.num_envs * args.num_steps
    pc.announce_start(args, "runs/x", "cpu", steps, 0)
    line = capsys.readouterr().out
    assert "HalfCheetah-v5, seed 1, 999424 steps (--total-timesteps 1000000 rounded down to whole rollouts of " \
           "2048 steps) on cpu; logs in runs/x" in line


def test_budget_rounded_to_whole_rollouts_trains_what_it_announces(pc, tmp_path, monkeypatch, capsys):
    code, err, out = run_main_in_process(pc, ["--env-id", "Pendulum-v1", "--total-timesteps", 600, "--num-steps", 128,
                                              "--num-minibatches", 2, "--update-epochs", 1], tmp_path, monkeypatch,
                                         capsys)
    assert code == 0, err
    assert "512 steps (--total-timesteps 600 rounded down to whole rollouts of 128 steps)" in out.splitlines()[0]
    assert "done, 512 steps" in out.splitlines()[-1]
    assert _steps(read_scalars(only_run_dir(tmp_path)), "losses/value_loss") == [128, 256, 384, 512]


def signal_on_call(monkeypatch, owner, name, call, sig):
    """Make the `call`-th call of owner.name send `sig` to this process first: a signal at that moment."""
    original, calls = getattr(owner, name), [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


# Pendulum, 2 envs x 32 steps = 64 per rollout, 10 iterations; per iteration the rollout calls the policy 32
# times and the update 2 epochs x 2 minibatches = 4 times.
BATCH = 64
TEN = ["--env-id", "Pendulum-v1", "--total-timesteps", 640, "--num-envs", 2, "--num-steps", 32,
       "--num-minibatches", 2, "--update-epochs", 2]
STOP_MOMENTS = {
    # name: (where the signal lands, extra args, signal, the last whole iteration the checkpoint must hold)
    "mid_rollout": (lambda pc, mp: signal_on_call(mp, pc.Agent, "get_action_and_value", 2 * 36 + 10, signal.SIGTERM),
                    ["--checkpoint-every", 4], signal.SIGTERM, 2),
    # A stop during an update lets the update finish: a checkpoint never holds a half-updated network.
    "mid_update": (lambda pc, mp: signal_on_call(mp, pc, "clipped_surrogate", 2 * 4 + 2, signal.SIGINT),
                   [], signal.SIGINT, 3),
    # Slurm's warning arrives while the periodic checkpoint of iteration 2 is being written.
    "during_checkpoint_write": (lambda pc, mp: signal_on_call(mp, torch, "save", 2, signal.SIGUSR1),
                                ["--checkpoint-every", 1], signal.SIGUSR1, 2),
}


@pytest.fixture
def stopped_run(request, pc, tmp_path, monkeypatch, capsys):
    arrange, extra, sig, iteration = STOP_MOMENTS[request.param]
    arrange(pc, monkeypatch)
    code, err, out = run_main_in_process(pc, [*TEN, *extra], tmp_path, monkeypatch, capsys)
    monkeypatch.undo()
    return {"code": code, "err": err, "out": out, "sig": sig, "iteration": iteration, "cwd": tmp_path,
            "run_dir": only_run_dir(tmp_path)}


@pytest.mark.parametrize("stopped_run", list(STOP_MOMENTS), indirect=True)
def test_signal_stops_with_a_checkpoint_of_the_last_whole_iteration(stopped_run):
    run_dir, iteration, sig = stopped_run["run_dir"], stopped_run["iteration"], stopped_run["sig"]
    assert stopped_run["code"] == 128 + sig, stopped_run["err"]
    assert stopped_run["err"] == ""
    rel = run_dir.relative_to(stopped_run["cwd"])
    stop_lines = [line for line in stopped_run["out"].splitlines() if "stopped by" in line]
    assert stop_lines == [f"{SCRIPT}: stopped by {sig.name} at step {iteration * BATCH}; checkpoint saved to "
                          f"{rel}/checkpoint.pt; resume with: python {SCRIPT}.py --resume {rel}/checkpoint.pt"]
    ckpt = _load(run_dir / "checkpoint.pt")
    assert ckpt["iteration"] == iteration and ckpt["global_step"] == iteration * BATCH
    assert not (run_dir / "checkpoint.pt.tmp").exists()
    # [cont-6, cont-8] The statistics are those of the last whole rollout too: the first reset of the 2 envs
    # plus one observation and one discounted return per env step it trained on, none from a dropped partial
    # rollout (mid_rollout has taken 10 more steps per env, which the running statistics have seen).
    assert ckpt["obs_rms"]["count"] == pytest.approx(1e-4 + 2 + iteration * BATCH, abs=1e-6)
    assert ckpt["return_rms"]["count"] == pytest.approx(1e-4 + iteration * BATCH, abs=1e-6)
    # The logs are intact up to the checkpoint: every iteration it holds is logged, once.
    scalars = read_scalars(run_dir)
    for tag in PER_ITERATION_TAGS:
        assert _steps(scalars, tag) == [BATCH * i for i in range(1, iteration + 1)], tag


@pytest.mark.parametrize("stopped_run", ["mid_rollout"], indirect=True)
def test_run_stopped_mid_rollout_resumes_with_its_statistics_schedule_and_cadence(pc, stopped_run, tmp_path_factory,
                                                                                  monkeypatch, capsys):
    run_dir = stopped_run["run_dir"]
    stopped = _load(run_dir / "checkpoint.pt")
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # resumed from another folder, by absolute path
    saves, save = [], pc.save_checkpoint

    def counting_save(path, agent, optimizer, stats, args, run_name, global_step, iteration, rng, *rest):
        saves.append(iteration)
        return save(path, agent, optimizer, stats, args, run_name, global_step, iteration, rng, *rest)

    monkeypatch.setattr(pc, "save_checkpoint", counting_save)
    code, err, out = run_main_in_process(pc, ["--resume", run_dir / "checkpoint.pt"], elsewhere, monkeypatch, capsys)
    assert code == 0, err
    assert list(elsewhere.iterdir()) == []  # it logs into the checkpoint's run folder, not here
    assert "resuming at step 128" in out.splitlines()[0]
    scalars = read_scalars(run_dir)
    for tag in PER_ITERATION_TAGS:
        assert _steps(scalars, tag) == [BATCH * i for i in range(1, 11)], tag
    np.testing.assert_allclose(_values(scalars, "charts/learning_rate"), [3e-4 * (1 - i / 10) for i in range(10)],
                               rtol=1e-5)
    # Started with --checkpoint-every 4 and no --save-model: the resumed part keeps checkpointing every 4, and
    # ends with a checkpoint of its final state (one from iteration 8 would be stale).
    assert saves == [4, 8, 10]
    ckpt = _load(run_dir / "checkpoint.pt")
    assert ckpt["iteration"] == 10 and ckpt["global_step"] == 10 * BATCH
    assert ckpt["args"]["checkpoint_every"] == 4 and ckpt["args"]["save_model"] is False
    # The closing line's figure is the run's own last 100 episodes, those before the stop among them.
    episodes = [v for _, v in read_scalars(run_dir)["charts/episodic_return"]]
    closing = float(re.search(r"return\(last 100\) (-?[\d.]+);", out.splitlines()[-1])[1])
    assert closing == pytest.approx(np.mean(episodes[-100:]), abs=0.006), (len(episodes), closing)
    # The statistics went on from the stopped checkpoint's: 8 more rollouts (the resumed reset is not counted).
    assert ckpt["obs_rms"]["count"] == pytest.approx(stopped["obs_rms"]["count"] + 8 * BATCH, abs=1e-6)
    assert ckpt["return_rms"]["count"] == pytest.approx(stopped["return_rms"]["count"] + 8 * BATCH, abs=1e-6)


@pytest.mark.parametrize("stopped_run", ["mid_rollout"], indirect=True)
def test_stop_mid_rollout_saves_the_generators_as_they_were_at_the_end_of_the_iteration(pc, stopped_run,
                                                                                      tmp_path_factory, monkeypatch,
                                                                                      capsys):
    """The partial rollout a stop drops has drawn actions; the checkpoint must not carry those draws on, so a
    resumed run draws from them as the uninterrupted run does from the same iteration (its episodes start fresh)."""
    states = {}
    save = pc.save_checkpoint

    def recording_save(path, agent, optimizer, stats, args, run_name, global_step, iteration, rng, *rest):
        states[iteration] = rng["torch"].clone()
        return save(path, agent, optimizer, stats, args, run_name, global_step, iteration, rng, *rest)

    monkeypatch.setattr(pc, "save_checkpoint", recording_save)
    uninterrupted = tmp_path_factory.mktemp("uninterrupted")
    code, err, _ = run_main_in_process(pc, [*TEN, "--checkpoint-every", 1], uninterrupted, monkeypatch, capsys)
    assert code == 0, err
    stopped = _load(stopped_run["run_dir"] / "checkpoint.pt")
    assert stopped["iteration"] == 2
    assert torch.equal(stopped["rng"]["torch"], states[2])  # the same seed, uninterrupted, at iteration 2's end
    assert not torch.equal(states[2], states[3])


def test_resume_may_repeat_some_hyperparameters(pc, tmp_path, monkeypatch, capsys):
    """Repeating only some of a run's hyperparameters on --resume is fine: they are checked together with the
    checkpoint's others, not with the script's defaults (3 minibatches do not split the default batch)."""
    code, err, _ = run_main_in_process(pc, ["--env-id", "Pendulum-v1", "--total-timesteps", 384, "--num-steps", 96,
                                            "--num-minibatches", 3, "--update-epochs", 1, "--checkpoint-every", 2],
                                       tmp_path, monkeypatch, capsys)
    assert code == 0, err
    ckpt_path = only_run_dir(tmp_path) / "checkpoint.pt"
    ckpt = _load(ckpt_path)
    ckpt["iteration"], ckpt["global_step"] = 2, 192
    torch.save(ckpt, ckpt_path)
    code, err, out = run_main_in_process(pc, ["--resume", ckpt_path, "--num-minibatches", 3], tmp_path, monkeypatch,
                                         capsys)
    assert code == 0, err
    assert "resuming at step 192" in out.splitlines()[0]
    assert _load(ckpt_path)["iteration"] == 4


def test_checkpoint_settings_given_on_resume_win(pc, pendulum_run, tmp_path, monkeypatch, capsys):
    ckpt = _load(pendulum_run["ckpt"])  # a --save-model run
    ckpt["iteration"], ckpt["global_step"] = 1, 256  # set back, so there is something to train
    run_dir = tmp_path / "runs" / ckpt["run_name"]
    run_dir.mkdir(parents=True)
    torch.save(ckpt, run_dir / "checkpoint.pt")
    code, err, _ = run_main_in_process(pc, ["--resume", run_dir / "checkpoint.pt", "--no-save-model",
                                            "--checkpoint-every", 3], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    saved = _load(run_dir / "checkpoint.pt")
    # --no-save-model, but the run checkpoints every 3: it ends with its final state, not iteration 3's.
    assert saved["iteration"] == 4 and saved["args"]["save_model"] is False
    assert saved["args"]["checkpoint_every"] == 3


def test_checkpoint_every_few_minutes(pc, tmp_path, monkeypatch, capsys):
    """--checkpoint-minutes: a checkpoint once that much wall time has passed since the last one."""
    clock = [1000.0]
    monkeypatch.setattr(pc.time, "time", lambda: clock[0])
    saves = []
    original = pc.save_checkpoint

    def counting_save(path, agent, optimizer, stats, args, run_name, global_step, iteration, rng, *rest):
        saves.append(iteration)
        return original(path, agent, optimizer, stats, args, run_name, global_step, iteration, rng, *rest)

    monkeypatch.setattr(pc, "save_checkpoint", counting_save)
    original_gae = pc.compute_gae

    def gae_and_tick(*args, **kwargs):  # each iteration takes 40 "seconds"
        clock[0] += 40.0
        return original_gae(*args, **kwargs)

    monkeypatch.setattr(pc, "compute_gae", gae_and_tick)
    code, err, _ = run_main_in_process(pc, [*TEN, "--checkpoint-minutes", 2], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert saves == [3, 6, 9, 10]  # 120 s reached after every third iteration, and the end


def test_stop_signals_handler_repeats_and_second_ctrl_c(pc, monkeypatch):
    stop = pc.StopSignals()
    assert not stop
    exits = []
    monkeypatch.setattr(pc.os, "_exit", lambda code: exits.append(code))
    stop._handle(signal.SIGUSR1, None)
    stop._handle(signal.SIGTERM, None)  # Slurm signals every process of a job: a repeat is not an emergency
    assert stop and stop.signum == signal.SIGUSR1 and exits == []
    stop._handle(signal.SIGINT, None)  # a second Ctrl-C: a person who will not wait
    assert exits == [130]


def test_sigterm_to_a_real_process(tmp_path):
    """The whole path through a real process, its output in a pipe: progress lines, then a clean stop."""
    cmd = [sys.executable, str(REPO_ROOT / f"{SCRIPT}.py"), "--env-id", "Pendulum-v1", "--total-timesteps",
           1_000_000, "--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2, "--update-epochs", 1,
           "--progress-interval", 0]
    proc = subprocess.Popen(list(map(str, cmd)), cwd=tmp_path, env=script_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()  # the start line
        assert first.startswith(f"{SCRIPT}: Pendulum-v1"), first + proc.stderr.read()
        assert proc.stdout.readline().startswith("step 64/")  # training: the handlers are in place
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err == "" and "Traceback" not in out
    stop = [line for line in out.splitlines() if "stopped by SIGTERM" in line]
    assert len(stop) == 1 and "--resume" in stop[0]
    step = int(re.search(r"at step (\d+)", stop[0])[1])
    ckpt = _load(only_run_dir(tmp_path) / "checkpoint.pt")
    assert ckpt["global_step"] == step and step % BATCH == 0 and 0 < step < 1_000_000


# ----------------------------------------------------------------------------------------------
# 10. Quiet runs: no MuJoCo or SDL noise, nothing left in the working folder, evaluation videos
# ----------------------------------------------------------------------------------------------


def test_halfcheetah_run_is_quiet_and_leaves_only_its_folders(tmp_path):
    """MuJoCo 4's compiler warns about gymnasium's HalfCheetah model ('settotalmass' is deprecated) from C, and
    appends it to MUJOCO_LOG.TXT in the working folder. A run (its env probe and its training env) and an
    evaluation print none of it and leave nothing but runs/."""
    tiny = ["--total-timesteps", 128, "--num-steps", 64, "--num-minibatches", 2, "--update-epochs", 1]
    train = run_script(SCRIPT, "--env-id", "HalfCheetah-v5", *tiny, "--save-model", cwd=tmp_path)
    _ok(train)
    assert "settotalmass" not in train.stdout + train.stderr and train.stderr == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    # (no video here: 1000 frames of HalfCheetah take minutes to render without a GPU)
    evaluation = run_script(SCRIPT, "--eval-checkpoint", only_run_dir(tmp_path) / "checkpoint.pt",
                            "--eval-episodes", 1, cwd=tmp_path)
    _ok(evaluation)
    assert "settotalmass" not in evaluation.stdout + evaluation.stderr and evaluation.stderr == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_make_env_restores_mujoco_warning_handling(pc, tmp_path, monkeypatch, capfd):
    """The hook that drops the compiler's deprecation warning is there only while the env is made."""
    import mujoco

    monkeypatch.chdir(tmp_path)
    before = mujoco.get_mju_user_warning()
    env = pc.make_env("HalfCheetah-v5", 0, False, None)()
    env.close()
    assert mujoco.get_mju_user_warning() is before
    captured = capfd.readouterr()  # the C-level file descriptors, not only Python's streams
    assert "settotalmass" not in captured.out + captured.err
    assert list(tmp_path.iterdir()) == []


def test_evaluation_records_every_episode_quietly(pendulum_run, tmp_path):
    """--eval-checkpoint --capture-video records each evaluated episode, without SDL's display noise
    (Pendulum draws with pygame)."""
    env = script_env()
    env.pop("SDL_VIDEODRIVER", None)
    env.pop("XDG_RUNTIME_DIR", None)
    result = run_script(SCRIPT, "--eval-checkpoint", pendulum_run["ckpt"], "--eval-episodes", 3, "--capture-video",
                        cwd=tmp_path, env=env)
    _ok(result)
    assert result.stderr == ""
    name = pendulum_run["run_dir"].name
    videos = tmp_path / "videos" / name / "eval-at-step-1024"
    assert sorted(p.name for p in videos.glob("*.mp4")) == [f"rl-video-episode-{i}.mp4" for i in range(3)]
    assert f"videos of the 3 episodes in videos/{name}/eval-at-step-1024" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["videos"]


def test_evaluating_twice_records_into_a_new_folder(pendulum_run, tmp_path):
    """Videos are never recorded over earlier ones: a second evaluation of the same checkpoint gets its own folder."""
    step = ITERATION_STEPS[-1]
    for _ in range(2):
        result = run_script(SCRIPT, "--eval-checkpoint", pendulum_run["ckpt"], "--eval-episodes", 1, "--capture-video",
                            cwd=tmp_path)
        _ok(result)
        assert f"of the policy at step {step}" in result.stdout
    videos = tmp_path / "videos" / pendulum_run["run_dir"].name
    assert sorted(p.name for p in videos.iterdir()) == [f"eval-at-step-{step}", f"eval-at-step-{step}-2"]
    assert f"videos of the 1 episode in videos/{pendulum_run['run_dir'].name}/eval-at-step-{step}-2" in result.stdout
    for folder in videos.iterdir():
        assert [p.name for p in folder.glob("*.mp4")] == ["rl-video-episode-0.mp4"]


def test_older_checkpoint_may_not_resume_over_a_newer_one(pc, pendulum_run, tmp_path, monkeypatch, capsys):
    """A copy kept from an earlier step, resumed, would overwrite the run's newer checkpoint.pt: refused."""
    run_dir = _copy_runs(pendulum_run, tmp_path)
    ckpt = _load(run_dir / "checkpoint.pt")
    ckpt["iteration"], ckpt["global_step"] = 1, 256
    for older in (run_dir / "ckpt-early.pt", tmp_path / "elsewhere.pt"):  # in the run folder, or a copy resuming there
        torch.save(ckpt, older)
        before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
        code, err, out = run_main_in_process(pc, ["--resume", older], tmp_path, monkeypatch, capsys)
        assert code == 2 and out == "", out
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "past the step 256 of" in errors[0] and "move it away" in errors[0], err
        assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_videos_of_mujoco_envs_follow_the_body(pc, tmp_path):
    """gymnasium's default free camera stays where the episode began; a walker's video uses its model's tracking
    camera. Envs without one (or not MuJoCo, like Pendulum) are made as before."""
    import mujoco

    env = pc.make_env("Hopper-v5", 0, True, str(tmp_path / "hopper"))()
    renderer = env.unwrapped.mujoco_renderer
    assert renderer.camera_id == mujoco.mj_name2id(env.unwrapped.model, mujoco.mjtObj.mjOBJ_CAMERA, "track") >= 0
    env.close()
    env = pc.make_env("Reacher-v5", 0, True, str(tmp_path / "reacher"))()  # no "track" camera: the free one
    assert env.unwrapped.mujoco_renderer.camera_id == -1
    env.close()
    env = pc.make_env("Pendulum-v1", 0, True, str(tmp_path / "pendulum"))()
    env.close()
