"""Tests of ppo_discrete.py: GAE's edge cases, the network, and tiny end-to-end runs (the math every script
shares is held to worked numbers in test_math.py, the training loop in test_training.py).

End-to-end runs are subprocesses with a fresh temporary directory as cwd (the script writes runs/ and
videos/ relative to it). Independent runs are started together to keep the file fast on two cores.
"""

import math
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn

from conftest import (REPO_ROOT, load_script, main_in_process, only_run_dir, read_scalars, run_script, run_scripts,
                      script_env)

SCRIPT = "ppo_discrete"
pd = load_script(SCRIPT)

GAMMA, LAMBDA = 0.99, 0.95
LR = 2.5e-4  # the script's default learning rate
# Tiny runs: 2 envs x 64 steps = 128 per rollout, 4 iterations, 4 minibatches of 32.
TINY = ["--total-timesteps", 512, "--num-envs", 2, "--num-steps", 64]
BATCH, ITERATIONS = 128, 4
ITERATION_STEPS = [BATCH * i for i in range(1, ITERATIONS + 1)]  # global_step logged after each update

ALL_TAGS = [
    "charts/episodic_return", "charts/episodic_length", "charts/learning_rate", "charts/SPS",
    "losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/old_approx_kl",
    "losses/approx_kl", "losses/clipfrac", "losses/explained_variance",
]
PER_ITERATION_TAGS = [t for t in ALL_TAGS if not t.startswith("charts/episodic")]


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def run_main_in_process(args, cwd, monkeypatch, capsys):
    """main() in this process: (exit code, stderr, stdout)."""
    return main_in_process(pd, args, cwd, monkeypatch, capsys)


def assert_ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


# ----------------------------------------------------------------------------------------------
# GAE [core-5]
# ----------------------------------------------------------------------------------------------


def test_gae_episode_boundary_inside_rollout_cuts_bootstrap():
    # One env, 4 steps; the episode ends at step 1 and a new one runs on past the rollout's end.
    rewards = t([[1.0], [1.0], [1.0], [1.0]])
    values = t([[0.5], [0.4], [0.3], [0.2]])
    dones = t([[0.0], [1.0], [0.0], [0.0]])
    last_value = t([0.7])
    adv, ret = pd.compute_gae(rewards, values, dones, last_value, GAMMA, LAMBDA)
    # By hand (gl = gamma * lambda = 0.9405):
    # t=3: delta = 1 + 0.99*0.7 - 0.2 = 1.493                        adv = 1.493
    # t=2: delta = 1 + 0.99*0.2 - 0.3 = 0.898                        adv = 0.898 + 0.9405*1.493 = 2.3021665
    # t=1: done, so no V(s_2) and no carried advantage: 1 - 0.4 = 0.6 adv = 0.6
    # t=0: delta = 1 + 0.99*0.4 - 0.5 = 0.896                        adv = 0.896 + 0.9405*0.6 = 1.4603
    torch.testing.assert_close(adv[:, 0], t([1.4603, 0.6, 2.3021665, 1.493]), atol=1e-5, rtol=0)
    torch.testing.assert_close(ret[:, 0], t([1.9603, 1.0, 2.6021665, 1.693]), atol=1e-5, rtol=0)


def test_gae_bootstraps_last_value_when_rollout_ends_mid_episode():
    rewards, values, dones = t([[0.0], [1.0]]), t([[0.0], [0.5]]), t([[0.0], [0.0]])
    adv0, _ = pd.compute_gae(rewards, values, dones, t([0.0]), GAMMA, LAMBDA)
    adv1, _ = pd.compute_gae(rewards, values, dones, t([2.0]), GAMMA, LAMBDA)
    # t=1: delta = 1 + 0.99*V_last - 0.5 ; t=0: delta = 0 + 0.99*0.5 - 0 = 0.495, adv = 0.495 + 0.9405*adv_1
    torch.testing.assert_close(adv0[:, 0], t([0.495 + 0.9405 * 0.5, 0.5]), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv1[:, 0], t([0.495 + 0.9405 * 2.48, 2.48]), atol=1e-6, rtol=0)
    # ... and when the last step is done, last_value changes nothing.
    dones_end = t([[0.0], [1.0]])
    a, _ = pd.compute_gae(rewards, values, dones_end, t([0.0]), GAMMA, LAMBDA)
    b, _ = pd.compute_gae(rewards, values, dones_end, t([50.0]), GAMMA, LAMBDA)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------
# Truncation
# ----------------------------------------------------------------------------------------------


def test_truncated_step_target_includes_final_value_terminated_does_not():
    # One step, two envs: env 0 hits the time limit, env 1 really terminates. Both are "done" for GAE.
    reward = np.array([1.0, 1.0])
    truncated = np.array([True, False])
    final_values = np.array([3.0, 0.0])  # V(final obs) is only computed where truncated
    boot = pd.bootstrap_truncated(reward, truncated, final_values, GAMMA)
    rewards = t(boot[None])
    values = t([[0.5, 0.5]])
    dones = t([[1.0, 1.0]])
    adv, ret = pd.compute_gae(rewards, values, dones, t([100.0, 100.0]), GAMMA, LAMBDA)
    torch.testing.assert_close(ret[0], t([1.0 + 0.99 * 3.0, 1.0]))
    torch.testing.assert_close(adv[0], t([1.0 + 0.99 * 3.0 - 0.5, 0.5]))


@pytest.fixture
def short_time_limit_env():
    env_id = "CartPoleTenStepLimit-v0"
    gym.register(id=env_id, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=10)
    yield env_id
    gym.envs.registry.pop(env_id, None)


@pytest.mark.parametrize("bootstrap", [True, False])
def test_training_loop_bootstraps_truncations_with_final_obs(bootstrap, short_time_limit_env, tmp_path, monkeypatch,
                                                             capsys):
    """Run main() in-process on CartPole with a 10-step time limit and watch what reaches the math."""
    agents, infos, truncations, ends, boot_calls, gae_calls = [], [], [], [], [], []
    real_bootstrap, real_gae = pd.bootstrap_truncated, pd.compute_gae

    class RecordingAgent(pd.Agent):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            agents.append(self)

    base_stats = gym.wrappers.vector.RecordEpisodeStatistics

    class RecordingStats(base_stats):
        def step(self, actions):
            result = super().step(actions)
            _, _, terminated, truncated, info = result
            infos.append(info)
            truncations.append(truncated & ~terminated)
            ends.append(terminated | truncated)
            return result

    def spy_bootstrap(rewards, truncated, final_values, gamma):
        info = infos[-1]
        final_obs = torch.as_tensor(np.stack(info["final_obs"][truncated]), dtype=torch.float32)
        with torch.inference_mode():
            expected = agents[-1].get_value(final_obs).numpy()
        boot_calls.append((rewards.copy(), truncated.copy(), np.array(final_values, copy=True), expected))
        return real_bootstrap(rewards, truncated, final_values, gamma)

    def spy_gae(rewards, values, dones, last_value, gamma, gae_lambda):
        gae_calls.append((rewards.clone(), dones.clone()))
        return real_gae(rewards, values, dones, last_value, gamma, gae_lambda)

    # main() looks these names up in its module globals at call time.
    monkeypatch.setattr(pd, "Agent", RecordingAgent)
    monkeypatch.setattr(pd, "bootstrap_truncated", spy_bootstrap)
    monkeypatch.setattr(pd, "compute_gae", spy_gae)
    monkeypatch.setattr(gym.wrappers.vector, "RecordEpisodeStatistics", RecordingStats)
    flag = "--bootstrap-truncation" if bootstrap else "--no-bootstrap-truncation"
    argv = ["--env-id", short_time_limit_env, "--total-timesteps", 256, "--num-envs", 2, "--num-steps", 128,
            "--no-progress", flag]
    code, err, _ = run_main_in_process(argv, tmp_path, monkeypatch, capsys)
    assert code == 0, err

    assert len(gae_calls) == 1
    rewards, dones = gae_calls[0]
    n_truncated = sum(int(mask.sum()) for mask in truncations)
    # Every episode lasts at most 10 steps: in 2 x 128 steps at least 24 episodes end, most by the time limit.
    assert int(dones.sum()) == sum(int(e.sum()) for e in ends) >= 24
    assert n_truncated >= 12
    if not bootstrap:
        assert boot_calls == []
        assert torch.all(rewards == 1.0)  # truncations treated as terminations: raw CartPole rewards
        return

    assert boot_calls, "no truncation was bootstrapped"
    boosted = 0
    for raw, truncated, final_values, expected in boot_calls:
        assert np.all(final_values[~truncated] == 0)
        # V(final obs) of the agent as it is during the rollout, on info["final_obs"], not on the reset obs.
        np.testing.assert_allclose(final_values[truncated], expected, rtol=0, atol=1e-6)
        boosted += int(truncated.sum())
    assert boosted == n_truncated
    # What reaches GAE: exactly the truncated steps carry 1 + gamma * V(final obs), and they are done.
    changed = rewards != 1.0
    assert int(changed.sum()) == n_truncated
    assert torch.all(dones[changed] == 1.0)
    got = np.sort(rewards[changed].numpy())
    want = np.sort(np.concatenate([1.0 + GAMMA * e for *_, e in boot_calls]).astype(np.float32))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Losses [core-8, core-9]
# ----------------------------------------------------------------------------------------------


def test_clipped_surrogate_batch_gradients():
    r = torch.tensor([1.5, 0.7, 1.3, 0.9, 1.1], requires_grad=True)
    a = torch.tensor([2.0, -1.0, 0.5, -2.0, 3.0])
    out = pd.clipped_surrogate(r, a, 0.2)
    torch.testing.assert_close(out.detach(), t([2.4, -0.8, 0.6, -1.8, 3.3]))
    out.sum().backward()
    assert r.grad.tolist() == [0.0, 0.0, 0.0, -2.0, 3.0]


# ----------------------------------------------------------------------------------------------
# Network and initialisation [core-2, core-13]
# ----------------------------------------------------------------------------------------------


def assert_orthogonal_with_gain(weight, gain):
    w = weight.detach().double()
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    expected = gain ** 2 * torch.eye(gram.shape[0], dtype=torch.float64)
    torch.testing.assert_close(gram, expected, atol=1e-5 * max(gain ** 2, 1e-2), rtol=0)


@pytest.mark.parametrize("shape", [(4, 64), (64, 64), (64, 2), (64, 1)])
@pytest.mark.parametrize("gain", [np.sqrt(2), 1.0, 0.01])
def test_layer_init_orthogonal_gain_and_zero_bias(shape, gain):
    layer = pd.layer_init(nn.Linear(*shape), gain)
    assert_orthogonal_with_gain(layer.weight, gain)
    assert torch.all(layer.bias == 0)


def test_layer_init_default_gain_is_sqrt2():
    assert_orthogonal_with_gain(pd.layer_init(nn.Linear(8, 64)).weight, np.sqrt(2))


@pytest.mark.parametrize("obs_size, n_actions", [(4, 2), (6, 3)])
def test_agent_initialisation(obs_size, n_actions):
    torch.manual_seed(0)
    agent = pd.Agent(obs_size, n_actions)
    for net, out_size, out_gain in [(agent.critic, 1, 1.0), (agent.actor, n_actions, 0.01)]:
        linears = [m for m in net if isinstance(m, nn.Linear)]
        assert [(lin.in_features, lin.out_features) for lin in linears] == [(obs_size, 64), (64, 64), (64, out_size)]
        assert sum(isinstance(m, nn.Tanh) for m in net) == 2
        for lin, gain in zip(linears, [np.sqrt(2), np.sqrt(2), out_gain]):
            assert_orthogonal_with_gain(lin.weight, gain)
            assert torch.all(lin.bias == 0)
    # Separate networks: no parameter is shared between policy and value.
    assert not {id(p) for p in agent.actor.parameters()} & {id(p) for p in agent.critic.parameters()}
    # Policy gain 0.01: near-uniform action probabilities at the start.
    probs = torch.softmax(agent.actor(torch.randn(32, obs_size)), -1)
    torch.testing.assert_close(probs, torch.full_like(probs, 1.0 / n_actions), atol=0.02, rtol=0)


def test_agent_act_greedy_is_argmax():
    torch.manual_seed(0)
    agent = pd.Agent(4, 3)
    x = torch.randn(16, 4)
    assert torch.equal(agent.act(x, greedy=True), agent.actor(x).argmax(-1))
    sampled = agent.act(x, greedy=False)
    assert sampled.shape == (16,) and sampled.min() >= 0 and sampled.max() < 3


# ----------------------------------------------------------------------------------------------
# End to end: independent tiny runs, started together
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    jobs = {
        "base": ["--seed", 1, *TINY, "--save-model"],
        # Same seed and settings; only checkpointing differs (it must not touch the random streams).
        # Iteration 3 of 4 leaves a mid-way checkpoint, as if the run had been killed during iteration 4.
        "repeat": ["--seed", 1, *TINY, "--checkpoint-every", 3],
        "seed2": ["--seed", 2, *TINY],
        "no_bootstrap_video": ["--seed", 1, *TINY, "--no-bootstrap-truncation", "--capture-video"],
    }
    cwds = {name: tmp_path_factory.mktemp(name) for name in jobs}
    results = run_scripts([(SCRIPT, args, cwds[name]) for name, args in jobs.items()], max_workers=4)
    return {name: (result, cwds[name]) for name, result in zip(jobs, results)}


@pytest.fixture(scope="module")
def base(runs):
    result, cwd = runs["base"]
    assert_ok(result)
    run_dir = only_run_dir(cwd)
    return {"cwd": cwd, "run_dir": run_dir, "checkpoint": run_dir / "checkpoint.pt", "result": result,
            "scalars": read_scalars(run_dir)}


def test_run_writes_every_tensorboard_tag(base):
    scalars = base["scalars"]
    missing = [tag for tag in ALL_TAGS if tag not in scalars]
    assert not missing, f"missing tags {missing}; have {sorted(scalars)}"
    for tag in PER_ITERATION_TAGS:
        assert [s for s, _ in scalars[tag]] == ITERATION_STEPS, tag
        assert all(math.isfinite(v) for _, v in scalars[tag]), tag
    returns, lengths = scalars["charts/episodic_return"], scalars["charts/episodic_length"]
    assert len(returns) >= 8  # a random CartPole policy ends an episode every ~20 steps
    assert [s for s, _ in returns] == [s for s, _ in lengths]
    assert all(0 < s <= ITERATION_STEPS[-1] for s, _ in returns)
    # CartPole pays 1 per step: the logged return is the episode length (raw rewards, not bootstrapped ones).
    assert [v for _, v in returns] == [v for _, v in lengths]
    assert all(v >= 1 and v == int(v) for _, v in lengths)
    assert all(v > 0 for _, v in scalars["charts/SPS"])
    assert all(0.0 <= v <= 1.0 for _, v in scalars["losses/clipfrac"])
    assert all(v > 0.0 for _, v in scalars["losses/approx_kl"])  # the policy moved in every update
    # [core-2] gain 0.01: the policy starts near uniform over CartPole's 2 actions, and sharpens as it learns.
    entropies = [v for _, v in scalars["losses/entropy"]]
    assert abs(entropies[0] - math.log(2)) < 0.01 and entropies[-1] < entropies[0]
    assert "checkpoint saved to" in base["result"].stdout


def test_learning_rate_anneals_linearly(base):
    lrs = base["scalars"]["charts/learning_rate"]
    expected = [LR * (1 - (i - 1) / ITERATIONS) for i in range(1, ITERATIONS + 1)]  # 2.5e-4, 1.875e-4, ...
    assert [s for s, _ in lrs] == ITERATION_STEPS
    np.testing.assert_allclose([v for _, v in lrs], expected, rtol=1e-6)
    np.testing.assert_allclose(np.diff([v for _, v in lrs]), -LR / ITERATIONS, rtol=1e-5)


def test_checkpoint_contents_and_adam_epsilon(base):
    ckpt = torch.load(base["checkpoint"], map_location="cpu", weights_only=True)
    assert ckpt["script"] == SCRIPT
    assert ckpt["run_name"] == base["run_dir"].name
    assert ckpt["global_step"] == ITERATION_STEPS[-1] and ckpt["iteration"] == ITERATIONS
    assert ckpt["args"]["env_id"] == "CartPole-v1" and ckpt["args"]["num_envs"] == 2
    assert ckpt["args"]["bootstrap_truncation"] is True
    assert ckpt["optimizer"]["param_groups"][0]["eps"] == 1e-5  # [core-3], not torch's 1e-8
    agent = pd.Agent(4, 2)
    agent.load_state_dict(ckpt["model"])  # the saved model fits the script's network
    assert not (base["run_dir"] / "checkpoint.pt.tmp").exists()


def test_checkpoint_every_writes_mid_run_checkpoint(runs):
    result, cwd = runs["repeat"]
    assert_ok(result)
    ckpt = torch.load(only_run_dir(cwd) / "checkpoint.pt", map_location="cpu", weights_only=True)
    # 4 iterations, every 3rd saved, and the end too: no --save-model, but a checkpointing run never leaves
    # iteration 3's policy behind as if it were the run's
    assert ckpt["iteration"] == 4 and ckpt["global_step"] == 4 * BATCH
    assert "checkpoint saved to" in result.stdout.splitlines()[-1]


def test_same_seed_same_curve_other_seed_other_curve(base, runs):
    repeat, seed2 = runs["repeat"], runs["seed2"]
    assert_ok(repeat[0])
    assert_ok(seed2[0])
    a = base["scalars"]
    b = read_scalars(only_run_dir(repeat[1]))
    c = read_scalars(only_run_dir(seed2[1]))
    assert a["charts/episodic_return"] == b["charts/episodic_return"]  # values and steps
    assert a["losses/value_loss"] == b["losses/value_loss"]
    assert a["charts/episodic_return"] != c["charts/episodic_return"]


def test_no_bootstrap_truncation_flag_and_capture_video(base, runs):
    result, cwd = runs["no_bootstrap_video"]
    assert_ok(result)
    run_dir = only_run_dir(cwd)
    scalars = read_scalars(run_dir)
    assert set(ALL_TAGS) <= set(scalars)
    # CartPole-v1 truncates only at 500 steps, which a tiny run never reaches: the flag changes nothing here,
    # and neither does rendering env 0.
    assert scalars["charts/episodic_return"] == base["scalars"]["charts/episodic_return"]
    videos = list((cwd / "videos").rglob("*.mp4"))
    assert videos, f"no mp4 under {cwd / 'videos'}"
    assert all(v.stat().st_size > 0 for v in videos)
    assert {v.parent.name for v in videos} == {run_dir.name}


# ----------------------------------------------------------------------------------------------
# Save -> evaluate -> resume
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def followups(base, runs, bad_cases, tmp_path_factory):
    """Every run that needs a checkpoint of the first batch, started together: evaluation (greedy and sampled),
    resuming a finished run, resuming a crafted mid-run checkpoint, and the bad-input cases run as processes."""
    jobs = {
        "eval_greedy": ["--eval-checkpoint", base["checkpoint"], "--eval-episodes", 3],
        "eval_sampled": ["--eval-checkpoint", base["checkpoint"], "--eval-episodes", 3, "--no-eval-deterministic"],
        "resume_finished": ["--resume", base["checkpoint"]],
    }
    cwds = {name: tmp_path_factory.mktemp(name) for name in jobs}

    # The mid-way checkpoint of the `repeat` run, moved back to iteration 1 (global step 128), resumed in a
    # copy of that run's directory: iterations 2-4 are trained again.
    result, src = runs["repeat"]
    assert_ok(result)
    cwd = cwds["crafted_resume"] = tmp_path_factory.mktemp("crafted_resume")
    shutil.copytree(src / "runs", cwd / "runs")
    run_dir = only_run_dir(cwd)
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    ckpt["iteration"], ckpt["global_step"] = 1, BATCH
    crafted = cwd / "crafted.pt"
    torch.save(ckpt, crafted)
    (run_dir / "checkpoint.pt").rename(run_dir / "final.pt")  # else the older one may not resume over it
    events_before = set(run_dir.glob("events.out.tfevents.*"))
    jobs["crafted_resume"] = ["--resume", crafted, "--save-model"]

    for name in SUBPROCESS_CASES:
        jobs[f"bad:{name}"] = bad_cases[name][0]
        cwds[f"bad:{name}"] = tmp_path_factory.mktemp(name)

    results = run_scripts([(SCRIPT, args, cwds[name]) for name, args in jobs.items()], max_workers=4)
    out = {name: (result, cwds[name]) for name, result in zip(jobs, results)}
    out["crafted_resume_info"] = {"run_dir": run_dir,
                                  "new_files": sorted(set(run_dir.glob("events.out.tfevents.*")) - events_before)}
    return out


@pytest.mark.parametrize("greedy", [True, False])
def test_evaluate_checkpoint(followups, greedy):
    result, cwd = followups["eval_greedy" if greedy else "eval_sampled"]
    assert_ok(result)
    lines = [line for line in result.stdout.splitlines() if "+-" in line]
    assert len(lines) == 1, result.stdout
    match = re.search(r"(-?[\d.]+) \+- ([\d.]+) over 3 episodes", lines[0])
    assert match, lines[0]
    # What a greedy or sampled evaluation plays is tested in test_training.py (test_evaluation_takes_...).
    assert ("(greedy)" if greedy else "(sampled)") in lines[0]
    assert not (cwd / "runs").exists()  # evaluation does not start a run


def test_resume_finished_run_exits_cleanly(base, followups):
    result, cwd = followups["resume_finished"]
    assert_ok(result)
    # Nothing left to train: it says so, and writes nothing (no run folder here, no new events in the run's own).
    assert "already finished" in result.stdout and "--total-timesteps" in result.stdout
    assert not (cwd / "runs").exists()
    assert len(list(base["run_dir"].glob("events.out.tfevents.*"))) == 1


@pytest.fixture(scope="module")
def crafted_resume(followups):
    result, cwd = followups["crafted_resume"]
    return {"result": result, "cwd": cwd, **followups["crafted_resume_info"]}


def test_resume_continues_steps_and_learning_rate_schedule(crafted_resume):
    assert_ok(crafted_resume["result"])
    assert only_run_dir(crafted_resume["cwd"]) == crafted_resume["run_dir"]  # same run, no new one
    assert len(crafted_resume["new_files"]) == 1
    own = read_scalars(crafted_resume["new_files"][0])  # only what the resumed process logged
    # Iterations 2, 3, 4 at global steps continuing from the checkpoint's 128 (not restarting from 0).
    for tag in PER_ITERATION_TAGS:
        assert [s for s, _ in own[tag]] == ITERATION_STEPS[1:], tag
    np.testing.assert_allclose([v for _, v in own["charts/learning_rate"]],
                               [LR * (1 - i / ITERATIONS) for i in (1, 2, 3)], rtol=1e-6)
    assert all(BATCH < s <= ITERATION_STEPS[-1] for s, _ in own.get("charts/episodic_return", []))
    final = torch.load(crafted_resume["run_dir"] / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert final["iteration"] == ITERATIONS and final["global_step"] == ITERATION_STEPS[-1]
    assert final["run_name"] == crafted_resume["run_dir"].name


def test_resume_keeps_the_logs_of_the_checkpointed_iteration(crafted_resume):
    assert_ok(crafted_resume["result"])
    merged = read_scalars(crafted_resume["run_dir"])
    # Old process: 128 (before the checkpoint), 256, 384, 512 (after it: hidden); resumed: 256, 384, 512.
    assert [s for s, _ in merged["charts/learning_rate"]] == ITERATION_STEPS


# ----------------------------------------------------------------------------------------------
# Bad input: one "error:" line, no traceback, no runs/ left behind
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_cases(base, tmp_path_factory):
    files = tmp_path_factory.mktemp("bad_files")
    missing = files / "does_not_exist.pt"
    corrupt = files / "corrupt.pt"
    corrupt.write_bytes(np.random.default_rng(0).bytes(4096))
    foreign = files / "foreign.pt"
    torch.save({"script": "ppo_continuous", "args": {"env_id": "Pendulum-v1", "seed": 1}, "model": {}}, foreign)
    incomplete = files / "incomplete.pt"
    torch.save({"script": SCRIPT}, incomplete)
    real = base["checkpoint"]
    saved = torch.load(real, map_location="cpu", weights_only=True)
    other_env = files / "acrobot.pt"  # the same checkpoint, claimed for another env
    torch.save({**saved, "args": {**saved["args"], "env_id": "Acrobot-v1"}}, other_env)
    older = files / "older.pt"  # written before a setting existed
    torch.save({**saved, "args": {k: v for k, v in saved["args"].items() if k != "bootstrap_truncation"}}, older)
    # name: (arguments, words the error line must contain). TINY keeps a case that wrongly passes short.
    return {
        "continuous_env": (["--env-id", "Pendulum-v1", *TINY], ["Pendulum-v1", "ppo_continuous.py"]),
        "unknown_env": (["--env-id", "NoSuchEnv-v9", *TINY], ["NoSuchEnv-v9"]),
        "minibatches_do_not_divide": (["--num-envs", 3, "--num-steps", 5, "--num-minibatches", 4], ["minibatch"]),
        "total_below_one_rollout": (["--total-timesteps", 100, "--num-envs", 2, "--num-steps", 128],
                                    ["--total-timesteps"]),
        "missing_checkpoint_resume": (["--resume", missing], ["not found"]),
        "missing_checkpoint_eval": (["--eval-checkpoint", missing], ["not found"]),
        "corrupt_checkpoint_resume": (["--resume", corrupt], ["cannot read"]),
        "corrupt_checkpoint_eval": (["--eval-checkpoint", corrupt], ["cannot read"]),
        "foreign_checkpoint_resume": (["--resume", foreign], ["ppo_continuous.py"]),
        "foreign_checkpoint_eval": (["--eval-checkpoint", foreign], ["ppo_continuous.py"]),
        "other_env_resume": (["--resume", real, "--env-id", "Acrobot-v1"], ["CartPole-v1", "Acrobot-v1"]),
        "other_env_eval": (["--eval-checkpoint", real, "--env-id", "Acrobot-v1"], ["CartPole-v1", "Acrobot-v1"]),
        "changed_hyperparameter": (["--resume", real, "--learning-rate", 0.1], ["--learning-rate", "0.1"]),
        "incomplete_checkpoint": (["--resume", incomplete], []),
        "atari_env": (["--env-id", "BreakoutNoFrameskip-v4", *TINY], ["ppo_atari.py"]),
        "mujoco_env": (["--env-id", "HalfCheetah-v4", *TINY], ["HalfCheetah-v4", "ppo_continuous.py"]),
        "zero_threads": (["--threads", 0, *TINY], ["--threads"]),
        "one_sample_minibatches": (["--num-envs", 2, "--num-steps", 4, "--num-minibatches", 8], ["--no-norm-adv"]),
        "default_env_given_explicitly": (["--resume", other_env, "--env-id", "CartPole-v1"], ["Acrobot-v1"]),
        "checkpoint_from_older_version": (["--resume", older], ["another version"]),
        # [issue 9] every numeric setting range-checked before any work; [issue 12] names and modes
        "gamma_above_one": (["--gamma", 1.5, *TINY], ["--gamma", "1.5", "[0, 1]"]),
        "negative_lambda": (["--gae-lambda", -0.1, *TINY], ["--gae-lambda", "[0, 1]"]),
        "negative_clip": (["--clip-coef", -0.2, *TINY], ["--clip-coef", "> 0"]),
        "negative_learning_rate": (["--learning-rate", -1, *TINY], ["--learning-rate", "> 0"]),
        "nan_learning_rate": (["--learning-rate", "nan", *TINY], ["--learning-rate"]),
        "negative_ent_coef": (["--ent-coef", -0.01, *TINY], ["--ent-coef", ">= 0"]),
        "zero_vf_coef": (["--vf-coef", 0, *TINY], ["--vf-coef", "> 0"]),
        "zero_max_grad_norm": (["--max-grad-norm", 0, *TINY], ["--max-grad-norm"]),
        "zero_target_kl": (["--target-kl", 0, *TINY], ["--target-kl"]),
        "zero_epochs": (["--update-epochs", 0, *TINY], ["--update-epochs", ">= 1"]),
        "zero_envs": (["--num-envs", 0, *TINY[:2]], ["--num-envs", ">= 1"]),
        "negative_checkpoint_minutes": (["--checkpoint-minutes", -5, *TINY], ["--checkpoint-minutes"]),
        "negative_progress_interval": (["--progress-interval", -1, *TINY], ["--progress-interval"]),
        "zero_eval_episodes": (["--eval-episodes", 0, *TINY], ["--eval-episodes"]),
        "negative_seed": (["--seed", -1, *TINY], ["--seed", "[0, "]),
        "huge_seed": (["--seed", 2**64, *TINY], ["--seed", "[0, "]),
        "nested_exp_name": (["--exp-name", "x/y", *TINY], ["--exp-name", "x/y"]),
        "empty_exp_name": (["--exp-name", "", *TINY], ["--exp-name"]),
        "exp_name_with_separator": (["--exp-name", "a__b", *TINY], ["--exp-name", "__"]),
        "eval_and_resume": (["--eval-checkpoint", real, "--resume", real], ["--eval-checkpoint", "--resume"]),
        "folder_as_checkpoint": (["--eval-checkpoint", files], ["folder"]),
        "text_file_as_checkpoint": (["--eval-checkpoint", Path(__file__)], ["cannot read"]),
        "extend_finished_run": (["--resume", real, "--total-timesteps", 1024], ["--total-timesteps", "new run"]),
    }


def check_bad_input(returncode, stderr, stdout, cwd, must_mention):
    out = f"exit {returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert returncode not in (0, None), out
    assert "Traceback" not in stderr + stdout, out
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), out
    for word in must_mention:
        assert word in lines[0], out
    assert "weights_only" not in lines[0], out  # torch's unsafe advice is not the user's business
    assert not (Path(cwd) / "runs").exists(), out


BAD_CASES = [
    "continuous_env", "unknown_env", "minibatches_do_not_divide", "total_below_one_rollout",
    "missing_checkpoint_resume", "missing_checkpoint_eval", "corrupt_checkpoint_resume", "corrupt_checkpoint_eval",
    "foreign_checkpoint_resume", "foreign_checkpoint_eval", "other_env_resume", "other_env_eval",
    "changed_hyperparameter", "incomplete_checkpoint", "atari_env", "mujoco_env", "zero_threads",
    "one_sample_minibatches", "default_env_given_explicitly", "checkpoint_from_older_version",
    "gamma_above_one", "negative_lambda", "negative_clip", "negative_learning_rate", "nan_learning_rate",
    "negative_ent_coef", "zero_vf_coef", "zero_max_grad_norm", "zero_target_kl", "zero_epochs", "zero_envs",
    "negative_checkpoint_minutes", "negative_progress_interval", "zero_eval_episodes", "negative_seed",
    "nested_exp_name", "empty_exp_name", "exp_name_with_separator", "eval_and_resume", "folder_as_checkpoint",
    "text_file_as_checkpoint", "extend_finished_run",
]
# The same checks through a real process (exit status, stderr) for one case of each kind: env, checkpoint, resume.
# mujoco_env: nothing of MuJoCo's own (its compiler's deprecation warnings) comes before the error line.
SUBPROCESS_CASES = ["continuous_env", "corrupt_checkpoint_eval", "changed_hyperparameter", "mujoco_env"]


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_bad_input_subprocess_exits_with_one_error_line(bad_cases, followups, case):
    result, cwd = followups[f"bad:{case}"]
    check_bad_input(result.returncode, result.stderr, result.stdout, cwd, bad_cases[case][1])


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_fails_with_one_error_line(bad_cases, case, tmp_path, monkeypatch, capsys):
    args, must_mention = bad_cases[case]
    code, err, out = run_main_in_process(args, tmp_path, monkeypatch, capsys)
    check_bad_input(code, err, out, tmp_path, must_mention)
    # nothing at all is written (MuJoCo's compiler would drop a MUJOCO_LOG.TXT for HalfCheetah-v4)
    assert list(tmp_path.iterdir()) == []


def test_track_works_offline(tmp_path):
    """--track with WANDB_MODE=offline (no network) logs locally and exits cleanly."""
    result = run_script(SCRIPT, "--track", "--total-timesteps", 256, "--num-envs", 2, "--num-steps", 128,
                        "--num-minibatches", 2, "--update-epochs", 1, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "wandb").glob("offline-run-*")), result.stderr
    only_run_dir(tmp_path)
    # wandb says where its data went, in a few lines, not a summary that buries the run's own lines.
    wandb_lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("wandb:")]
    assert 1 <= len(wandb_lines) <= 3, wandb_lines


def test_resumed_run_records_video_in_its_own_folder(tmp_path):
    """Video ids restart at 0 in a resumed process: its videos must not overwrite the first process's."""
    tiny = ["--total-timesteps", 512, "--num-envs", 2, "--num-steps", 64, "--num-minibatches", 2, "--update-epochs", 1]
    first = run_script(SCRIPT, *tiny, "--capture-video", "--save-model", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = only_run_dir(tmp_path)
    videos = tmp_path / "videos" / run_dir.name
    before = {p: p.stat().st_mtime_ns for p in videos.glob("*.mp4")}
    assert before
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    ckpt["iteration"], ckpt["global_step"] = 1, 128  # set back, so the resumed run has iterations to do
    torch.save(ckpt, tmp_path / "set_back.pt")
    (run_dir / "checkpoint.pt").rename(run_dir / "final.pt")  # else the older one may not resume over it
    second = run_script(SCRIPT, "--resume", tmp_path / "set_back.pt", "--capture-video", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert list((videos / "resumed-at-step-128").glob("*.mp4"))
    assert {p: p.stat().st_mtime_ns for p in videos.glob("*.mp4")} == before


# ----------------------------------------------------------------------------------------------
# Long runs: what the log says, stop signals, and a resumed run's checkpoint cadence
# ----------------------------------------------------------------------------------------------


def test_output_to_a_file_says_what_the_run_does(base):
    """stdout is a pipe here, as in a Slurm log: a start line, plain progress lines, a summary line."""
    lines = base["result"].stdout.splitlines()
    assert lines[0].startswith(f"{SCRIPT}: CartPole-v1, seed 1, 512 steps on cpu; logs in runs/"), lines
    progress = [line for line in lines if line.startswith("step ")]
    # The first line comes after the first iteration, then one per --progress-interval (60 s by default).
    assert progress and progress[0].startswith("step 128/512 (25%)"), lines
    assert re.search(r"\d+ steps/s +return\(last 100\) [\d.]+ +elapsed \d+:\d\d:\d\d", progress[0]), progress[0]
    assert "\r" not in base["result"].stdout  # the live terminal line is for terminals only
    end = lines[-1]
    assert end.startswith(f"{SCRIPT}: done, 512 steps in "), end
    assert f"logs in runs/{base['run_dir'].name}" in end and "checkpoint saved to" in end
    assert float(re.search(r"return\(last 100\) ([\d.]+)", end)[1]) > 0


def test_budget_rounded_to_whole_rollouts_is_announced(tmp_path, monkeypatch, capsys):
    code, err, out = run_main_in_process(["--total-timesteps", 600, "--num-envs", 2, "--num-steps", 64,
                                          "--update-epochs", 1], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "512 steps (--total-timesteps 600 rounded down to whole rollouts of 128 steps)" in out.splitlines()[0]
    assert "done, 512 steps" in out.splitlines()[-1]


def signal_on_call(monkeypatch, owner, name, call, sig):
    """Make the `call`-th call of owner.name send `sig` to this process first: a signal at that moment."""
    original, calls = getattr(owner, name), [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


# 2 envs x 64 steps, 10 iterations; the rollout calls the policy 64 times, the update 16 times per iteration.
TEN = ["--total-timesteps", 1280, "--num-envs", 2, "--num-steps", 64]
STOP_MOMENTS = {
    # name: (where the signal lands, extra args, signal, the last whole iteration the checkpoint must hold)
    "mid_rollout": (lambda mp: signal_on_call(mp, pd.Agent, "get_action_and_value", 2 * 80 + 10, signal.SIGTERM),
                    ["--checkpoint-every", 4], signal.SIGTERM, 2),
    # A stop during an update lets the update finish: a checkpoint never holds a half-updated network.
    "mid_update": (lambda mp: signal_on_call(mp, pd, "clipped_surrogate", 2 * 16 + 5, signal.SIGINT),
                   [], signal.SIGINT, 3),
    # Slurm's warning arrives while the periodic checkpoint of iteration 2 is being written.
    "during_checkpoint_write": (lambda mp: signal_on_call(mp, torch, "save", 2, signal.SIGUSR1),
                                ["--checkpoint-every", 1], signal.SIGUSR1, 2),
}


@pytest.fixture
def stopped_run(request, tmp_path, monkeypatch, capsys):
    arrange, extra, sig, iteration = STOP_MOMENTS[request.param]
    arrange(monkeypatch)
    code, err, out = run_main_in_process([*TEN, *extra], tmp_path, monkeypatch, capsys)
    monkeypatch.undo()
    return {"code": code, "err": err, "out": out, "sig": sig, "iteration": iteration, "cwd": tmp_path,
            "run_dir": only_run_dir(tmp_path)}


@pytest.mark.parametrize("stopped_run", list(STOP_MOMENTS), indirect=True)
def test_signal_stops_with_a_checkpoint_of_the_last_whole_iteration(stopped_run):
    run_dir, iteration, sig = stopped_run["run_dir"], stopped_run["iteration"], stopped_run["sig"]
    assert stopped_run["code"] == 128 + sig, stopped_run["err"]
    assert stopped_run["err"] == ""
    stop_lines = [line for line in stopped_run["out"].splitlines() if "stopped by" in line]
    assert stop_lines == [f"{SCRIPT}: stopped by {sig.name} at step {iteration * BATCH}; checkpoint saved to "
                          f"{run_dir.relative_to(stopped_run['cwd'])}/checkpoint.pt; resume with: python "
                          f"{SCRIPT}.py --resume {run_dir.relative_to(stopped_run['cwd'])}/checkpoint.pt"]
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["iteration"] == iteration and ckpt["global_step"] == iteration * BATCH
    assert not (run_dir / "checkpoint.pt.tmp").exists()
    # The logs are intact up to the checkpoint: every iteration it holds is logged, once.
    scalars = read_scalars(run_dir)
    for tag in PER_ITERATION_TAGS:
        assert [s for s, _ in scalars[tag]] == [BATCH * i for i in range(1, iteration + 1)], tag
    # It keeps the returns of the episodes up to its step, not those of a partial rollout the stop dropped.
    episodes = [v for s, v in scalars["charts/episodic_return"] if s <= iteration * BATCH]
    assert ckpt["recent_returns"] == pytest.approx(episodes[-100:])


@pytest.mark.parametrize("stopped_run", ["mid_rollout"], indirect=True)
def test_resumed_run_continues_steps_schedule_and_checkpoint_cadence(stopped_run, tmp_path_factory, monkeypatch,
                                                                      capsys):
    run_dir = stopped_run["run_dir"]
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # resumed from another folder, by absolute path
    saves, save = [], pd.save_checkpoint

    def counting_save(path, agent, optimizer, kl_coef, args, run_name, global_step, iteration, rng, *rest):
        saves.append(iteration)
        return save(path, agent, optimizer, kl_coef, args, run_name, global_step, iteration, rng, *rest)

    monkeypatch.setattr(pd, "save_checkpoint", counting_save)
    code, err, out = run_main_in_process(["--resume", run_dir / "checkpoint.pt"], elsewhere, monkeypatch, capsys)
    assert code == 0, err
    assert list(elsewhere.iterdir()) == []  # it logs into the checkpoint's run folder, not here
    assert "resuming at step 256" in out.splitlines()[0]
    # The closing line's figure is the run's own last 100 episodes, those before the stop among them.
    episodes = [v for _, v in read_scalars(run_dir)["charts/episodic_return"]]
    closing = float(re.search(r"return\(last 100\) (-?[\d.]+);", out.splitlines()[-1])[1])
    assert closing == pytest.approx(np.mean(episodes[-100:]), abs=0.006), (len(episodes), closing)
    scalars = read_scalars(run_dir)
    for tag in PER_ITERATION_TAGS:
        assert [s for s, _ in scalars[tag]] == [BATCH * i for i in range(1, 11)], tag
    np.testing.assert_allclose([v for _, v in scalars["charts/learning_rate"]],
                               [LR * (1 - i / 10) for i in range(10)], rtol=1e-6)
    # Started with --checkpoint-every 4 and no --save-model: the resumed part keeps checkpointing every 4, and
    # ends with a checkpoint of its final state.
    assert saves == [4, 8, 10]
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["iteration"] == 10 and ckpt["global_step"] == 10 * BATCH
    assert ckpt["args"]["checkpoint_every"] == 4 and ckpt["args"]["save_model"] is False


def test_checkpoint_settings_given_on_resume_win(base, tmp_path, monkeypatch, capsys):
    ckpt = torch.load(base["checkpoint"], map_location="cpu", weights_only=True)
    ckpt["iteration"], ckpt["global_step"] = 1, BATCH  # set back, so there is something to train
    run_dir = tmp_path / "runs" / ckpt["run_name"]
    run_dir.mkdir(parents=True)
    torch.save(ckpt, run_dir / "checkpoint.pt")
    code, err, _ = run_main_in_process(["--resume", run_dir / "checkpoint.pt", "--no-save-model",
                                        "--checkpoint-every", 3], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    saved = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    # --no-save-model, but the run checkpoints every 3: it ends with its final state, not iteration 3's.
    assert saved["iteration"] == ITERATIONS and saved["args"]["save_model"] is False


def test_checkpoint_every_few_minutes(tmp_path, monkeypatch, capsys):
    """--checkpoint-minutes: a checkpoint once that much wall time has passed since the last one."""
    clock = [1000.0]
    monkeypatch.setattr(pd.time, "time", lambda: clock[0])
    saves = []
    original = pd.save_checkpoint

    def counting_save(path, agent, optimizer, kl_coef, args, run_name, global_step, iteration, rng, *rest):
        saves.append(iteration)
        return original(path, agent, optimizer, kl_coef, args, run_name, global_step, iteration, rng, *rest)

    monkeypatch.setattr(pd, "save_checkpoint", counting_save)
    calls = [0]
    original_gae = pd.compute_gae

    def gae_and_tick(*args, **kwargs):  # each iteration takes 40 "seconds"
        calls[0] += 1
        clock[0] += 40.0
        return original_gae(*args, **kwargs)

    monkeypatch.setattr(pd, "compute_gae", gae_and_tick)
    code, err, _ = run_main_in_process([*TEN, "--checkpoint-minutes", 2], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert saves == [3, 6, 9, 10]  # 120 s reached after every third iteration, and the end


def test_stop_signals_handler_repeats_and_second_ctrl_c(monkeypatch):
    stop = pd.StopSignals()
    assert not stop
    exits = []
    monkeypatch.setattr(pd.os, "_exit", lambda code: exits.append(code))
    stop._handle(signal.SIGUSR1, None)
    stop._handle(signal.SIGTERM, None)  # Slurm signals every process of a job: a repeat is not an emergency
    assert stop and stop.signum == signal.SIGUSR1 and exits == []
    stop._handle(signal.SIGINT, None)  # a second Ctrl-C: a person who will not wait
    assert exits == [130]


def test_sigterm_to_a_real_process(tmp_path):
    """The whole path through a real process, its output in a pipe: progress lines, then a clean stop."""
    cmd = [sys.executable, str(REPO_ROOT / f"{SCRIPT}.py"), "--total-timesteps", 1_000_000, "--num-envs", 2,
           "--num-steps", 64, "--progress-interval", 0]
    proc = subprocess.Popen(list(map(str, cmd)), cwd=tmp_path, env=script_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()  # the start line
        assert first.startswith(f"{SCRIPT}: CartPole-v1"), first + proc.stderr.read()
        assert proc.stdout.readline().startswith("step 128/")  # training: the handlers are in place
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err == "" and "Traceback" not in out
    stop = [line for line in out.splitlines() if "stopped by SIGTERM" in line]
    assert len(stop) == 1 and "--resume" in stop[0]
    step = int(re.search(r"at step (\d+)", stop[0])[1])
    ckpt = torch.load(only_run_dir(tmp_path) / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == step and step % BATCH == 0 and step < 1_000_000


def test_evaluation_records_every_episode_quietly(base, tmp_path):
    """--eval-checkpoint --capture-video records each evaluated episode, without SDL's display noise."""
    env = script_env()
    env.pop("SDL_VIDEODRIVER", None)
    env.pop("XDG_RUNTIME_DIR", None)
    result = run_script(SCRIPT, "--eval-checkpoint", base["checkpoint"], "--eval-episodes", 3, "--capture-video",
                        cwd=tmp_path, env=env)
    assert_ok(result)
    assert result.stderr == ""
    videos = tmp_path / "videos" / base["run_dir"].name / f"eval-at-step-{ITERATION_STEPS[-1]}"
    assert sorted(p.name for p in videos.glob("*.mp4")) == [f"rl-video-episode-{i}.mp4" for i in range(3)]
    assert f"videos of the 3 episodes in videos/{base['run_dir'].name}" in result.stdout
    assert f"of the policy at step {ITERATION_STEPS[-1]}" in result.stdout
    assert not (tmp_path / "runs").exists()
    # A second evaluation records into a folder of its own: videos are never recorded over earlier ones.
    again = run_script(SCRIPT, "--eval-checkpoint", base["checkpoint"], "--eval-episodes", 1, "--capture-video",
                       cwd=tmp_path, env=env)
    assert_ok(again)
    second = videos.parent / f"{videos.name}-2"
    assert [p.name for p in second.glob("*.mp4")] == ["rl-video-episode-0.mp4"]
    assert len(list(videos.glob("*.mp4"))) == 3


def test_older_checkpoint_may_not_resume_over_a_newer_one(base, tmp_path, monkeypatch, capsys):
    """A copy kept from an earlier step, resumed, would overwrite the run's newer checkpoint.pt: refused."""
    run_dir = tmp_path / "runs" / base["run_dir"].name
    shutil.copytree(base["run_dir"], run_dir)
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    ckpt["iteration"], ckpt["global_step"] = 1, BATCH
    for older in (run_dir / "ckpt-early.pt", tmp_path / "elsewhere.pt"):  # in the run folder, or a copy resuming there
        torch.save(ckpt, older)
        before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
        code, err, out = run_main_in_process(["--resume", older], tmp_path, monkeypatch, capsys)
        assert code == 2 and out == "", out
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"past the step {BATCH} of" in errors[0], err
        assert "move it away" in errors[0]
        assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
