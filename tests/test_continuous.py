"""Tests of ppo_continuous.py: the Gaussian policy, the normalisation statistics, checkpoints, end-to-end runs
and bad input. Training runs are tiny (4 iterations of 256 steps) and go in subprocesses with a temporary
working directory; one test runs main() in-process with a custom env to see the actions at loop level."""

import math
import shutil
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Normal

from conftest import load_script, only_run_dir, read_scalars, run_script, run_scripts

SCRIPT = "ppo_continuous"
# 4 iterations of 256 steps, 4 minibatches of 64, 2 epochs: a Pendulum run logs 5 episodes of 200 steps.
TINY = ["--total-timesteps", 1024, "--num-steps", 256, "--num-minibatches", 4, "--update-epochs", 2]
PENDULUM = ["--env-id", "Pendulum-v1", *TINY]
ITERATION_STEPS = [256, 512, 768, 1024]


@pytest.fixture(scope="module")
def pc():
    return load_script(SCRIPT)


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
    result = run_script(SCRIPT, "--resume", cwd / "back.pt", "--save-model", cwd=cwd)
    _ok(result)
    return {"cwd": cwd, "result": result, "run_dir": run_dir, "saved": saved}


@pytest.fixture(scope="module")
def finished_resume(pendulum_run, tmp_path_factory):
    """Resume the finished checkpoint (no iterations left) with --save-model."""
    cwd = tmp_path_factory.mktemp("resume_finished")
    run_dir = _copy_runs(pendulum_run, cwd)
    shutil.copy(pendulum_run["ckpt"], cwd / "finished.pt")
    result = run_script(SCRIPT, "--resume", cwd / "finished.pt", "--save-model", cwd=cwd)
    _ok(result)
    return {"saved": _load(cwd / "finished.pt"), "written": _load(run_dir / "checkpoint.pt"), "cwd": cwd}


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
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args",
                        torch.distributions.Distribution._validate_args)
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
    returns = pc.evaluate(agent, obs_rms, args, torch.device("cpu"))
    assert calls == []
    np.testing.assert_array_equal(obs_rms.mean, mean)
    np.testing.assert_array_equal(obs_rms.var, var)
    assert obs_rms.count == count
    assert len(returns) == 2 and all(-16.3 * 200 <= r <= 0 for r in returns)
    # the subprocess printed the same numbers: it evaluated with the same saved statistics
    printed_mean = float(result.stdout.split(":")[1].split("+-")[0])
    assert printed_mean == pytest.approx(np.mean(returns), abs=0.011)
    # and the statistics matter: fresh ones give a different policy input, so different returns
    assert pc.evaluate(agent, pc.RunningMeanStd((3,)), args, torch.device("cpu")) != returns


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


def test_resume_finished_checkpoint_keeps_model_and_return_statistics(finished_resume):
    saved, written = finished_resume["saved"], finished_resume["written"]
    assert written["iteration"] == saved["iteration"] == 4
    assert written["global_step"] == saved["global_step"] == 1024
    assert written["model"].keys() == saved["model"].keys()
    assert all(torch.equal(written["model"][k], saved["model"][k]) for k in saved["model"])
    assert torch.equal(written["return_rms"]["mean"], saved["return_rms"]["mean"])
    assert torch.equal(written["return_rms"]["var"], saved["return_rms"]["var"])
    assert written["return_rms"]["count"] == saved["return_rms"]["count"]


def test_resume_finished_checkpoint_writes_back_the_same_observation_statistics(finished_resume):
    saved, written = finished_resume["saved"], finished_resume["written"]
    assert written["obs_rms"]["count"] == saved["obs_rms"]["count"]
    assert torch.equal(written["obs_rms"]["mean"], saved["obs_rms"]["mean"])
    assert torch.equal(written["obs_rms"]["var"], saved["obs_rms"]["var"])


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


def test_capture_video_writes_mp4(tmp_path):
    result = run_script(SCRIPT, "--env-id", "InvertedPendulum-v5", *TINY, "--capture-video", cwd=tmp_path)
    if result.returncode != 0 and ("EGL" in result.stderr or "egl" in result.stderr):
        pytest.skip(f"headless MuJoCo rendering (EGL) unavailable here: {result.stderr.strip().splitlines()[-1]}")
    _ok(result)
    videos = list((tmp_path / "videos" / only_run_dir(tmp_path).name).glob("*.mp4"))
    assert any(v.name == "rl-video-episode-0.mp4" for v in videos), videos
    assert all(v.stat().st_size > 0 for v in videos)


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
    assert not (cwd / "runs").exists()


# ----------------------------------------------------------------------------------------------
# 8. Truncation bootstrapping
# ----------------------------------------------------------------------------------------------


def test_bootstrap_truncated_adds_gamma_v_only_where_truncated(pc):
    rewards = np.array([1.0, 2.0, 3.0, 4.0])
    truncated = np.array([True, False, False, True])
    final_values = np.array([10.0, 20.0, 30.0, -5.0])  # values where not truncated must be ignored
    out = pc.bootstrap_truncated(rewards, truncated, final_values, 0.9)
    np.testing.assert_allclose(out, [1.0 + 9.0, 2.0, 3.0, 4.0 - 4.5])
    np.testing.assert_array_equal(rewards, [1.0, 2.0, 3.0, 4.0])  # input left alone
    out = pc.bootstrap_truncated(torch.tensor(rewards), torch.tensor(truncated, dtype=torch.float64),
                                 torch.tensor(final_values), 0.5)
    torch.testing.assert_close(out, torch.tensor([6.0, 2.0, 3.0, 1.5], dtype=torch.float64))


def test_no_bootstrap_truncation_runs_and_changes_the_targets(pendulum_run, tmp_path):
    result = run_script(SCRIPT, *PENDULUM, "--seed", 1, "--no-bootstrap-truncation", cwd=tmp_path)
    _ok(result)
    scalars, reference = read_scalars(only_run_dir(tmp_path)), read_scalars(pendulum_run["run_dir"])
    assert _steps(scalars, "losses/value_loss") == ITERATION_STEPS
    # same seed: the first episode (before any update) is the same; the truncation at step 200 is then
    # a plain end instead of reward + gamma V(final obs), so the value targets and losses differ
    assert scalars["charts/episodic_return"][0] == reference["charts/episodic_return"][0]
    assert _values(scalars, "losses/value_loss")[0] != _values(reference, "losses/value_loss")[0]
