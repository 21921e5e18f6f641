"""The training loop of all three scripts, watched from inside: what reaches the loss, the optimizer and the
checkpoint. Tests that a realistic one-line bug in an update, an option, a resume or a checkpoint write fails.

Each in-process run wraps the script's own functions (main() looks them up in its module at call time) and
registers a hook on every optimizer step, so a test asserts on what the update really did: the ratio against
the stored log-probability, the learning rate and clip range of each iteration, the gradient norm after
clipping, the number of updates an early stop leaves, the state a resume starts from. `benchmarks/mutation_check.py`
applies the bugs these tests are meant to catch and checks that they do.
"""

import math
import json
import os
import re
import signal
import sys
from collections import deque
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from conftest import (REPO_ROOT, SCRIPTS, load_script, main_in_process, read_scalars, run_dirs, run_script, run_scripts,
                      script_env, video_frames)

# Tiny runs: 4 iterations of 128 steps, 4 epochs of 4 minibatches of 32 (16 updates an iteration).
TINY = {
    "ppo_discrete": ["--total-timesteps", 512, "--num-envs", 2, "--num-steps", 64],
    "ppo_continuous": ["--env-id", "Pendulum-v1", "--total-timesteps", 512, "--num-steps", 128,
                       "--num-minibatches", 4, "--update-epochs", 4],
    "ppo_atari": ["--env-id", "BreakoutNoFrameskip-v4", "--total-timesteps", 512, "--num-envs", 2,
                  "--num-steps", 64, "--no-cuda", "--threads", 1],
}
ITERATIONS, MINIBATCHES, EPOCHS, BATCH = 4, 4, 4, 128


class Watch:
    """Records every ppo_loss call (inputs and result) and every optimizer step (learning rate and the norm of
    the gradient it applies) of a main() run in this process."""

    def __init__(self, module, monkeypatch):
        self.losses, self.steps = [], []
        real_loss = module.ppo_loss

        def ppo_loss(new_logprob, entropy, new_value, old_logprob, old_value, advantages, returns, clip_coef, args,
                     *penalty):
            loss, metrics = real_loss(new_logprob, entropy, new_value, old_logprob, old_value, advantages, returns,
                                      clip_coef, args, *penalty)
            with torch.no_grad():
                self.losses.append(SimpleNamespace(
                    ratio=(new_logprob - old_logprob).exp().clone(), new_value=new_value.clone(),
                    old_value=old_value.clone(), advantages=advantages.clone(), returns=returns.clone(),
                    clip_coef=clip_coef, norm_adv=args.norm_adv, clip_vloss=args.clip_vloss, metrics=metrics,
                    step=len(self.steps)))
            return loss, metrics

        monkeypatch.setattr(module, "ppo_loss", ppo_loss)
        self.hook = register_optimizer_step_pre_hook(self._before_step)
        self.first_step = None

    def _before_step(self, optimizer, args, kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])).item()
        if self.first_step is None:  # the state the first update starts from
            self.first_step = {"params": [p.detach().clone() for p in params],
                               "adam": [{k: v.clone() for k, v in optimizer.state[p].items()} for p in params]}
        self.steps.append(SimpleNamespace(lr=optimizer.param_groups[0]["lr"], grad_norm=norm))

    def close(self):
        self.hook.remove()


@pytest.fixture
def watch(monkeypatch):
    watches = []

    def start(module):
        watches.append(Watch(module, monkeypatch))
        return watches[-1]

    yield start
    for w in watches:
        w.close()


def watched_run(script, extra, tmp_path, monkeypatch, capsys, watch):
    module = load_script(script)
    w = watch(module)
    code, err, out = main_in_process(module, [*TINY[script], "--no-progress", *extra], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    return module, w


def default_lr(module):
    return module.Args.learning_rate


# ----------------------------------------------------------------------------------------------
# One run per script on its defaults (with a gradient clip small enough to act on every update, and an
# early-stop threshold that never stops), asserted from several sides
# ----------------------------------------------------------------------------------------------


@pytest.fixture(params=SCRIPTS)
def default_run(request, tmp_path, monkeypatch, capsys, watch):
    module, w = watched_run(request.param, ["--max-grad-norm", 0.01, "--target-kl", 1e9, "--save-model"],
                            tmp_path, monkeypatch, capsys, watch)
    return SimpleNamespace(script=request.param, module=module, watch=w, cwd=tmp_path)


def test_the_update_takes_the_ratio_against_the_stored_log_prob(default_run):
    """The first minibatch of each iteration meets the policy that acted: ratio 1 (to rounding), nothing
    clipped. Later minibatches meet an updated policy: the ratio has moved."""
    losses = default_run.watch.losses
    assert len(losses) == ITERATIONS * EPOCHS * MINIBATCHES
    for first in losses[::EPOCHS * MINIBATCHES]:
        assert (first.ratio - 1).abs().max().item() <= 1e-5
        assert first.metrics["clipfrac"].item() == 0.0
    for iteration in range(ITERATIONS):
        later = losses[iteration * EPOCHS * MINIBATCHES + 1:(iteration + 1) * EPOCHS * MINIBATCHES]
        assert max((call.ratio - 1).abs().max().item() for call in later) > 1e-3, f"iteration {iteration + 1}"


def test_the_gradient_norm_is_clipped(default_run):
    norms = [s.grad_norm for s in default_run.watch.steps]
    assert len(norms) == ITERATIONS * EPOCHS * MINIBATCHES
    assert max(norms) <= 0.01 * (1 + 1e-4)
    assert min(norms) >= 0.01 * (1 - 1e-3)  # every raw gradient is larger: the clip acted on each update


def test_the_learning_rate_anneals_and_the_clip_range_does_not(default_run):
    lr, clip = default_lr(default_run.module), default_run.module.Args.clip_coef
    steps, losses = default_run.watch.steps, default_run.watch.losses
    for i in range(ITERATIONS):
        updates = steps[i * EPOCHS * MINIBATCHES:(i + 1) * EPOCHS * MINIBATCHES]
        assert all(s.lr == pytest.approx(lr * (1 - i / ITERATIONS)) for s in updates), f"iteration {i + 1}"
    assert {call.clip_coef for call in losses} == {clip}
    assert all(call.norm_adv and call.clip_vloss for call in losses)


def test_a_large_target_kl_never_stops_the_epochs(default_run):
    assert len(default_run.watch.steps) == ITERATIONS * EPOCHS * MINIBATCHES


def test_logged_diagnostics_are_the_last_minibatchs(default_run):
    """What the run logs is what the loss computed (the last minibatch's), and the KL is positive."""
    scalars = read_scalars(run_dirs(default_run.cwd)[0])
    last = default_run.watch.losses[EPOCHS * MINIBATCHES - 1::EPOCHS * MINIBATCHES]
    for name in ("policy_loss", "value_loss", "entropy", "approx_kl", "old_approx_kl"):
        logged = [v for _, v in scalars[f"losses/{name}"]]
        np.testing.assert_allclose(logged, [call.metrics[name].item() for call in last], rtol=1e-6, err_msg=name)
    assert all(v > 0 for _, v in scalars["losses/approx_kl"])


# ----------------------------------------------------------------------------------------------
# Options, each with its effect
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS)
def test_options_constant_lr_annealed_clip_early_stop_no_value_clip_no_advantage_norm(script, tmp_path, monkeypatch,
                                                                                       capsys, watch):
    module, w = watched_run(script, ["--no-anneal-lr", "--anneal-clip", "--target-kl", 1e-12, "--no-clip-vloss",
                                     "--no-norm-adv"], tmp_path, monkeypatch, capsys, watch)
    lr, clip = default_lr(module), module.Args.clip_coef
    # --target-kl: the first epoch always runs; after it the KL is above any tiny target, so each iteration stops.
    assert len(w.steps) == ITERATIONS * MINIBATCHES
    assert len(w.losses) == ITERATIONS * MINIBATCHES
    # --no-anneal-lr: the same learning rate for every update.
    assert {s.lr for s in w.steps} == {lr}
    # --anneal-clip: the clip range falls with the iterations, as the learning rate otherwise does.
    for i in range(ITERATIONS):
        calls = w.losses[i * MINIBATCHES:(i + 1) * MINIBATCHES]
        assert all(c.clip_coef == pytest.approx(clip * (1 - i / ITERATIONS)) for c in calls), f"iteration {i + 1}"
    for call in w.losses:
        assert not call.norm_adv and not call.clip_vloss
        # The loss the run used: raw advantages in the surrogate, the plain squared error for the value.
        r, a, c = call.ratio, call.advantages, call.clip_coef
        expected_pg = -torch.min(r * a, r.clamp(1 - c, 1 + c) * a).mean()
        assert call.metrics["policy_loss"].item() == pytest.approx(expected_pg.item(), rel=1e-5, abs=1e-7)
        expected_v = 0.5 * ((call.new_value - call.returns) ** 2).mean()
        assert call.metrics["value_loss"].item() == pytest.approx(expected_v.item(), rel=1e-5)
    assert any(call.advantages.std().item() > 1.5 or abs(call.advantages.mean().item()) > 0.1 for call in w.losses)


@pytest.mark.parametrize("flags, normalised_obs, scaled_rewards", [
    ([], True, True), (["--no-norm-obs"], False, True), (["--no-norm-reward"], True, False),
])
def test_continuous_normalisation_flags(flags, normalised_obs, scaled_rewards, tmp_path, monkeypatch, capsys, watch):
    pc = load_script("ppo_continuous")
    calls = {"normalize_obs": 0, "scale_reward": 0}
    for name in calls:
        real = getattr(pc, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(pc, name, counted)
    watched_run("ppo_continuous", [*flags, "--save-model"], tmp_path, monkeypatch, capsys, watch)
    assert (calls["normalize_obs"] > 0) == normalised_obs and (calls["scale_reward"] > 0) == scaled_rewards
    ckpt = torch.load(run_dirs(tmp_path)[0] / "checkpoint.pt", map_location="cpu", weights_only=True)
    # Statistics that are not used do not move from their start (count 1e-4, mean 0, var 1).
    assert (ckpt["obs_rms"]["count"] > 1) == normalised_obs
    assert (ckpt["return_rms"]["count"] > 1) == scaled_rewards


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_loss_that_is_not_finite_stops_the_run_with_one_error_line(script, tmp_path, monkeypatch, capsys):
    module = load_script(script)
    real, calls = module.ppo_loss, [0]

    def diverging(*a):
        loss, metrics = real(*a)
        calls[0] += 1
        return (loss * float("nan") if calls[0] == 2 * EPOCHS * MINIBATCHES + 3 else loss), metrics

    monkeypatch.setattr(module, "ppo_loss", diverging)
    code, err, out = main_in_process(module, [*TINY[script], "--no-progress"], tmp_path, monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "loss" in lines[0], err
    assert "step 384" in lines[0]  # in the third iteration
    assert calls[0] == 3 * EPOCHS * MINIBATCHES  # checked after the epochs: no iteration after it
    # The logs that explain the divergence are kept: the two finished iterations are on disk.
    assert [s for s, _ in read_scalars(run_dirs(tmp_path)[0])["losses/approx_kl"]] == [BATCH, 2 * BATCH]


# ----------------------------------------------------------------------------------------------
# Evaluation follows --no-eval-deterministic
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One tiny finished run per script, with its checkpoint."""
    jobs = {s: (s, [*TINY[s], "--no-progress", "--save-model"], tmp_path_factory.mktemp(s)) for s in SCRIPTS}
    results = run_scripts(list(jobs.values()))
    for (script, _, cwd), result in zip(jobs.values(), results):
        assert result.returncode == 0, result.stderr
    return {s: run_dirs(cwd)[0] / "checkpoint.pt" for s, (_, _, cwd) in jobs.items()}


EVAL_FLAG = {"ppo_discrete": "eval-deterministic", "ppo_continuous": "eval-deterministic",
             "ppo_atari": "eval-deterministic"}


def record_actions(module, script, monkeypatch):
    """Patch the script's agent so that each action it plays is recorded, beside the most likely action (the
    mean, for the Gaussian policy): a list of (best, played) pairs, filled as it plays."""
    played = []
    if script == "ppo_continuous":
        real_mean = module.Agent.get_action_and_value

        def record(self, obs, action=None):
            result = real_mean(self, obs, action)
            played.append((self.actor_mean(obs).detach().clone(), result[0].detach().clone()))
            return result

        monkeypatch.setattr(module.Agent, "get_action_and_value", record)
    else:
        real_act = module.Agent.act

        def record(self, obs, greedy):
            action = real_act(self, obs, greedy)
            logits = self.actor(self.features(obs)) if script == "ppo_atari" else self.actor(obs)
            played.append((logits.argmax(-1).clone(), action.clone()))
            return action

        monkeypatch.setattr(module.Agent, "act", record)
    return played


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("best", [True, False])
def test_evaluation_takes_the_best_action_or_samples(script, best, checkpoints, tmp_path, monkeypatch, capsys):
    """Greedy (deterministic) evaluation plays the most likely action (the mean) at every step; with the flag
    off it samples, and then not every action is the most likely one."""
    module = load_script(script)
    played = record_actions(module, script, monkeypatch)
    flag = f"--{EVAL_FLAG[script]}" if best else f"--no-{EVAL_FLAG[script]}"
    episodes = 1 if script == "ppo_atari" else 2
    code, err, out = main_in_process(module, ["--eval-checkpoint", checkpoints[script], "--eval-episodes", episodes,
                                              flag], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert ("(greedy)" in out or "(deterministic)" in out) == best and ("(sampled)" in out) != best
    if script == "ppo_continuous":
        # Deterministic evaluation never samples; sampled evaluation draws every action around the mean.
        assert (len(played) == 0) == best
        if not best:
            assert all(not torch.equal(mean, action) for mean, action in played)
        return
    assert played
    same = [bool(torch.equal(best_action, action)) for best_action, action in played]
    assert all(same) if best else not all(same)


@pytest.mark.parametrize("stop", ["Ctrl-C", "SIGTERM"])
@pytest.mark.parametrize("script", SCRIPTS)
def test_ctrl_c_during_evaluation_reports_the_episodes_played(script, stop, checkpoints, tmp_path, monkeypatch,
                                                              capsys):
    """Ctrl-C (or SIGTERM: `kill`, Slurm's time limit) in the middle of --eval-checkpoint's second episode: no
    traceback but a line saying so, the first episode's line and the mean +- std of it alone (the one cut short
    does not count), the video of what was played of the second kept, and exit status 130 (143). A line per
    episode is printed as it ends."""
    module = load_script(script)
    on_sigterm = signal.getsignal(signal.SIGTERM)
    steps, interrupt_at = [], []

    def interrupting_make_env(*args, **kwargs):
        thunk = real_make_env(*args, **kwargs)

        def make():
            env = thunk()
            real_step = env.step

            def step(action):
                steps.append(action)
                if len(steps) == sum(interrupt_at) and stop == "SIGTERM":
                    os.kill(os.getpid(), signal.SIGTERM)
                elif len(steps) == sum(interrupt_at):
                    raise KeyboardInterrupt  # where Python raises it: as the env step returns to the interpreter
                return real_step(action)

            env.step = step
            return env

        return make

    real_make_env = module.make_env
    monkeypatch.setattr(module, "make_env", interrupting_make_env)
    unit = "game" if script == "ppo_atari" else "episode"
    whole = main_in_process(module, ["--eval-checkpoint", checkpoints[script], "--eval-episodes", 1], tmp_path,
                            monkeypatch, capsys)
    assert whole[0] == 0, whole[1]
    first_line, summary = whole[2].splitlines()
    assert first_line.startswith(f"{unit} 1/1: ") and "+-" in summary
    if script != "ppo_atari":  # the Atari line counts frames (4 a step), not steps
        assert first_line.endswith(f" in {len(steps)} steps")
    first_episode_steps = len(steps)
    steps.clear()
    interrupt_at.append(first_episode_steps + 3)  # the greedy policy plays the first episode again, step for step
    code, err, out = main_in_process(module, ["--eval-checkpoint", checkpoints[script], "--eval-episodes", 3,
                                              "--capture-video"], tmp_path, monkeypatch, capsys)
    assert code == (130 if stop == "Ctrl-C" else 143)
    assert err.strip() == f"stopped by {stop} with 1 of 3 {unit}s played whole: only those count"
    assert signal.getsignal(signal.SIGTERM) is on_sigterm  # put back as it was
    lines = out.splitlines()
    assert lines[0] == first_line.replace("/1:", "/3:") and lines[1] == summary  # the first one's, alone
    assert len(lines) == 3 and lines[2].startswith("videos of the games played in" if script == "ppo_atari" else
                                                   "videos of the episodes played in")
    videos = sorted((tmp_path / "videos").rglob("*.mp4"))
    assert [v.name for v in videos] == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4"]
    assert video_frames(videos[1]) >= 3  # the reset's frame and the two steps' played before Ctrl-C, at least


@pytest.mark.parametrize("script", SCRIPTS)
def test_sampled_evaluation_draws_its_actions_from_the_seed(script, checkpoints, tmp_path, monkeypatch, capsys):
    """--no-eval-deterministic samples from torch's generator seeded with --seed: the same seed plays the same
    actions again, whatever was drawn before it in the process, and another seed plays others."""
    module = load_script(script)
    played = record_actions(module, script, monkeypatch)

    def actions(seed):
        played.clear()
        code, err, _ = main_in_process(module, ["--eval-checkpoint", checkpoints[script], "--eval-episodes", 1,
                                                "--no-eval-deterministic", "--seed", seed], tmp_path, monkeypatch,
                                       capsys)
        assert code == 0, err
        assert torch.initial_seed() == seed  # seeded with --seed, not with a constant
        return torch.cat([action.flatten() for _, action in played])

    first = actions(1)
    torch.rand(1000)  # draws that a generator left unseeded would carry into the next evaluation
    again, other = actions(1), actions(2)
    assert torch.equal(first, again)
    assert not torch.equal(first[:len(other)], other[:len(first)])


# ----------------------------------------------------------------------------------------------
# Truncation: bootstrapped from V(final observation), never from the next episode's first
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def short_episodes(monkeypatch):
    """Envs whose episodes end by a time limit within a few steps: CartPole and Pendulum after 10 steps, and
    Breakout after 80 frames (20 agent steps) through ALE's own frame limit."""
    gym.register(id="CartPoleTenSteps-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                 max_episode_steps=10)
    gym.register(id="PendulumTenSteps-v0", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
                 max_episode_steps=10)
    atari = load_script("ppo_atari")
    real_make = atari.gym.make

    def make(env_id, **kwargs):
        if "NoFrameskip" in env_id:  # ppo_atari's gym is everyone's gym
            kwargs["max_num_frames_per_episode"] = 80
        return real_make(env_id, **kwargs)

    monkeypatch.setattr(atari.gym, "make", make)
    yield {"ppo_discrete": ["--env-id", "CartPoleTenSteps-v0"],
           "ppo_continuous": ["--env-id", "PendulumTenSteps-v0", "--no-norm-obs"],
           "ppo_atari": []}
    for env_id in ("CartPoleTenSteps-v0", "PendulumTenSteps-v0"):
        gym.envs.registry.pop(env_id, None)


@pytest.mark.parametrize("script", SCRIPTS)
def test_truncations_are_bootstrapped_from_the_final_observation(script, short_episodes, tmp_path, monkeypatch,
                                                                 capsys):
    module = load_script(script)
    infos, value_calls, boots = [], [], []
    real_step, real_value, real_boot = gym.vector.SyncVectorEnv.step, module.Agent.get_value, module.bootstrap_truncated

    def step(self, actions):
        result = real_step(self, actions)
        infos.append((result[0], result[4]))
        return result

    def get_value(self, obs):
        value = real_value(self, obs)
        value_calls.append((obs.clone(), value.clone()))
        return value

    def bootstrap(rewards, truncated, final_values, gamma):
        boots.append((truncated.copy(), np.array(final_values, copy=True), infos[-1], value_calls[-1]))
        return real_boot(rewards, truncated, final_values, gamma)

    monkeypatch.setattr(gym.vector.SyncVectorEnv, "step", step)
    monkeypatch.setattr(module.Agent, "get_value", get_value)
    monkeypatch.setattr(module, "bootstrap_truncated", bootstrap)
    tiny = TINY[script][2:] if script == "ppo_continuous" else TINY[script]  # without its --env-id
    code, err, _ = main_in_process(module, [*tiny, *short_episodes[script], "--no-progress"], tmp_path,
                                   monkeypatch, capsys)
    assert code == 0, err
    assert len(boots) >= 5, "the truncation branch hardly ran"
    differs_from_reset = 0
    for truncated, final_values, (next_obs, info), (value_input, value_output) in boots:
        final_obs = np.stack(info["final_obs"][truncated])
        # V was computed on the final observations of the truncated episodes, not on the reset observations.
        np.testing.assert_array_equal(value_input.numpy(), final_obs.astype(value_input.numpy().dtype))
        differs_from_reset += not np.array_equal(final_obs, next_obs[truncated])
        np.testing.assert_allclose(final_values[truncated], value_output.numpy(), rtol=0, atol=1e-6)
        assert np.all(final_values[~truncated] == 0)
    assert differs_from_reset == len(boots)  # so the check above tells the two apart


# ----------------------------------------------------------------------------------------------
# An update moves the policy the way its advantages say, and the entropy bonus raises entropy
# ----------------------------------------------------------------------------------------------


def policy_head(script, agent):
    return {"ppo_discrete": lambda: agent.actor[-1], "ppo_continuous": lambda: agent.actor_mean[-1],
            "ppo_atari": lambda: agent.actor}[script]()


def agent_and_batch(script, n=64, seed=0):
    """A fresh network of the script and a batch of observations with actions sampled from it."""
    module = load_script(script)
    torch.manual_seed(seed)
    if script == "ppo_discrete":
        agent, obs = module.Agent(4, 3), torch.randn(n, 4)
    elif script == "ppo_continuous":
        agent, obs = module.Agent(3, 2), torch.randn(n, 3)
    else:
        agent, obs = module.Agent(4), torch.randint(0, 256, (n, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        action, logprob, _, value = agent.get_action_and_value(obs)
    return module, agent, obs, action, logprob, value


def one_update(module, agent, obs, action, logprob, value, advantages, **settings):
    optimizer = torch.optim.SGD(agent.parameters(), lr=settings.pop("lr", 0.05))
    args = SimpleNamespace(**{**dict(norm_adv=True, clip_policy=True, clip_vloss=True, ent_coef=0.0, vf_coef=0.0),
                              **settings})
    _, new_logprob, entropy, new_value = agent.get_action_and_value(obs, action)
    loss, _ = module.ppo_loss(new_logprob, entropy, new_value, logprob, value, advantages, value + advantages,
                              module.Args.clip_coef, args)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        _, after, entropy_after, _ = agent.get_action_and_value(obs, action)
    return after, entropy.detach(), entropy_after


@pytest.mark.parametrize("script", SCRIPTS)
def test_one_update_raises_the_log_prob_of_good_actions_and_lowers_that_of_bad_ones(script):
    module, agent, obs, action, logprob, value = agent_and_batch(script)
    advantages = torch.where(torch.arange(len(obs)) % 2 == 0, 1.0, -1.0)
    after, _, _ = one_update(module, agent, obs, action, logprob, value, advantages)
    change = after - logprob
    assert change[advantages > 0].mean() > 0 > change[advantages < 0].mean()
    assert (change * advantages).sum() > 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_entropy_bonus_raises_entropy(script):
    module, agent, obs, action, logprob, value = agent_and_batch(script)
    if script != "ppo_continuous":  # away from the near-uniform start, where entropy is already at its maximum
        with torch.no_grad():
            policy_head(script, agent).weight.mul_(300)
    _, before, after = one_update(module, agent, obs, action, logprob, value, torch.zeros(len(obs)),
                                  norm_adv=False, ent_coef=1.0, lr=1e-4)
    assert after.mean() > before.mean()


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_value_loss_moves_the_value_towards_its_target(script):
    module, agent, obs, action, logprob, value = agent_and_batch(script)
    advantages = torch.full((len(obs),), 0.1)  # targets 0.1 above the current values: within the clip range
    one_update(module, agent, obs, action, logprob, value, advantages, norm_adv=False, vf_coef=1.0, lr=1e-4)
    with torch.no_grad():
        new_value = agent.get_value(obs)
    assert ((new_value - (value + advantages)).abs().mean() < advantages.abs().mean())


@pytest.mark.parametrize("script", SCRIPTS)
def test_initial_policy_output_gain_is_001_and_value_output_gain_1(script):
    """[core-2] Orthogonal output layers: every singular value of the policy head is 0.01, of the value head 1."""
    module, agent, *_ = agent_and_batch(script)
    policy, value = policy_head(script, agent), agent.critic if script == "ppo_atari" else agent.critic[-1]
    for layer, gain in ((policy, 0.01), (value, 1.0)):
        singular = torch.linalg.svdvals(layer.weight.detach())
        torch.testing.assert_close(singular, torch.full_like(singular, gain), rtol=1e-4, atol=0)
        assert torch.all(layer.bias == 0)


# ----------------------------------------------------------------------------------------------
# Checkpoints: atomic, synced; a resume starts from exactly the saved state
# ----------------------------------------------------------------------------------------------


def tiny_state(script, seed):
    module, agent, obs, action, logprob, value = agent_and_batch(script, n=16, seed=seed)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-3, eps=1e-5)
    _, new_logprob, entropy, new_value = agent.get_action_and_value(obs, action)
    (-(new_logprob * torch.randn(16)).mean() + new_value.pow(2).mean()).backward()
    optimizer.step()  # Adam has moments and a step count now
    return module, agent, optimizer


def save(module, path, agent, optimizer, rng, step, recent_returns=()):
    args = module.Args()
    if module.SCRIPT == "ppo_continuous":
        stats = {"obs_rms": module.RunningMeanStd((3,)).state_dict(), "return_rms": module.RunningMeanStd().state_dict(),
                 "kl_coef": 0.0}
        module.save_checkpoint(path, agent, optimizer, stats, args, "run", step, step // 128, rng, recent_returns)
    else:
        module.save_checkpoint(path, agent, optimizer, 0.0, args, "run", step, step // 128, rng, recent_returns)


@pytest.mark.parametrize("script", SCRIPTS)
def test_restore_puts_back_weights_adam_moments_generators_and_returns(script, tmp_path):
    module, agent, optimizer = tiny_state(script, seed=1)
    torch.manual_seed(77)
    rng = module.rng_states()
    expected_draw = torch.rand(5)
    path = tmp_path / "checkpoint.pt"
    save(module, str(path), agent, optimizer, rng, 256, deque([3.0, -1.5, 20.25], maxlen=100))

    _, fresh_agent, fresh_optimizer = tiny_state(script, seed=2)  # other weights, other moments
    torch.manual_seed(5)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    # and the returns of the episodes before it, for the run's last-100 figure
    assert module.restore_checkpoint(ckpt, fresh_agent, fresh_optimizer) == (256 // 128 + 1, 256, [3.0, -1.5, 20.25])
    assert json.loads((tmp_path / "checkpoint.json").read_text()) == {
        "global_step": 256, "iteration": 256 // 128, "total_timesteps": ckpt["args"]["total_timesteps"]}
    for p, q in zip(agent.parameters(), fresh_agent.parameters()):
        assert torch.equal(p, q)
    for p, q in zip(agent.parameters(), fresh_agent.parameters()):
        saved, restored = optimizer.state[p], fresh_optimizer.state[q]
        assert saved.keys() == restored.keys() and {"exp_avg", "exp_avg_sq", "step"} <= saved.keys()
        for key in saved:
            assert torch.equal(saved[key], restored[key]), key
    assert torch.equal(torch.rand(5), expected_draw)  # the generator goes on from where it was saved


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_crash_during_a_checkpoint_write_leaves_the_previous_one(script, tmp_path, monkeypatch):
    module, agent, optimizer = tiny_state(script, seed=1)
    path = str(tmp_path / "checkpoint.pt")
    save(module, path, agent, optimizer, module.rng_states(), 128)
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(module.os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                        real_fsync(fd)))
    monkeypatch.setattr(module.os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))),
                                                            real_replace(a, b)))
    save(module, path, agent, optimizer, module.rng_states(), 256)
    # The new checkpoint went to another file, was synced, and only then renamed over the old one; then the
    # few bytes that say how far it got, also renamed into place.
    assert [e[0] for e in events] == ["fsync", "replace", "replace"]
    assert events[0][1] == os.path.realpath(events[1][1]) != os.path.realpath(path)
    assert events[1][2] == path and events[2][2] == str(tmp_path / "checkpoint.json")

    def crash(obj, f, *a, **k):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(module.torch, "save", crash)
    with pytest.raises(OSError):
        save(module, path, agent, optimizer, module.rng_states(), 384)
    assert torch.load(path, map_location="cpu", weights_only=True)["global_step"] == 256
    assert json.loads((tmp_path / "checkpoint.json").read_text())["global_step"] == 256  # and says so


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_resumed_run_starts_its_first_update_from_the_saved_state(script, checkpoints, tmp_path, monkeypatch,
                                                                    capsys, watch):
    """A finished run's checkpoint, set back to iteration 2 of 4: the resumed run trains iterations 3 and 4,
    and its first update starts from the saved weights and Adam moments, after a rollout drawn from the saved
    generator state."""
    module = load_script(script)
    ckpt = torch.load(checkpoints[script], map_location="cpu", weights_only=True)
    ckpt["iteration"], ckpt["global_step"] = 2, 2 * BATCH
    run_dir = tmp_path / "runs" / ckpt["run_name"]
    run_dir.mkdir(parents=True)
    torch.save(ckpt, run_dir / "checkpoint.pt")
    restored_rng = []
    real_restore = module.restore_checkpoint

    def restore(*a):
        result = real_restore(*a)
        restored_rng.append(torch.get_rng_state())
        return result

    monkeypatch.setattr(module, "restore_checkpoint", restore)
    w = watch(module)
    code, err, _ = main_in_process(module, ["--resume", run_dir / "checkpoint.pt", "--no-progress"], tmp_path,
                                   monkeypatch, capsys)
    assert code == 0, err
    assert len(w.steps) == 2 * EPOCHS * MINIBATCHES
    assert torch.equal(restored_rng[0], ckpt["rng"]["torch"])
    saved = list(ckpt["model"].values())  # the parameters, in the order the optimizer holds them
    assert len(saved) == len(w.first_step["params"])
    for restored, saved_param in zip(w.first_step["params"], saved):
        assert torch.equal(restored, saved_param)
    saved_adam = ckpt["optimizer"]["state"]
    for i, state in enumerate(w.first_step["adam"]):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[key], saved_adam[i][key]), (i, key)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_resumed_run_carries_its_last_100_episodes_on(script, checkpoints, tmp_path, monkeypatch, capsys):
    """A resumed run's closing figure is the mean of the run's own last 100 episodes, those before the
    checkpoint among them (as compare.py reads them from the events), and its checkpoint keeps them on."""
    module = load_script(script)
    ckpt = torch.load(checkpoints[script], map_location="cpu", weights_only=True)
    ckpt["iteration"], ckpt["global_step"] = 2, 2 * BATCH
    before = [float(r) for r in range(150, 250)]  # 100 returns that none of these tiny runs' episodes reaches
    ckpt["recent_returns"] = before
    run_dir = tmp_path / "runs" / ckpt["run_name"]
    run_dir.mkdir(parents=True)
    torch.save(ckpt, run_dir / "checkpoint.pt")
    code, err, out = main_in_process(module, ["--resume", run_dir / "checkpoint.pt", "--no-progress"], tmp_path,
                                     monkeypatch, capsys)
    assert code == 0, err
    after = [v for _, v in read_scalars(run_dir).get("charts/episodic_return", [])]  # an Atari game may not end
    last_100 = (before + after)[-100:]
    closing = float(re.search(r"(?:return|score)\(last 100\) (-?[\d.]+);", out.splitlines()[-1])[1])
    assert closing == pytest.approx(np.mean(last_100), abs=0.006), (len(after), closing)
    saved = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["recent_returns"]
    assert saved == pytest.approx(last_100)


# ----------------------------------------------------------------------------------------------
# torchrun: each process steps its own envs
# ----------------------------------------------------------------------------------------------


def test_torchrun_processes_step_disjoint_envs_that_cover_the_run(monkeypatch):
    atari = load_script("ppo_atari")
    monkeypatch.setattr(atari, "WORLD_SIZE", 4)
    shares = []
    for rank in range(4):
        monkeypatch.setattr(atari, "RANK", rank)
        count, first = atari.envs_of_this_process(8)
        shares += list(range(first, first + count))
    assert sorted(shares) == list(range(8))


# ----------------------------------------------------------------------------------------------
# Learning: a short run clearly beats a random policy
# ----------------------------------------------------------------------------------------------


def test_short_runs_learn(tmp_path):
    """Behaviour, not speed: CartPole-v1 (uniform random actions score 23.7 over 100 episodes) and
    InvertedPendulum-v5 (5.2)
    after 16k steps, 3 seeds each, score far above random. A flipped sign, a stale ratio that never clips or a
    broken advantage fails this."""
    jobs = []
    for seed in (1, 2, 3):
        jobs.append(("ppo_discrete", ["--total-timesteps", 16384, "--learning-rate", 1e-3, "--seed", seed,
                                      "--no-progress"], tmp_path / f"cartpole{seed}"))
        jobs.append(("ppo_continuous", ["--env-id", "InvertedPendulum-v5", "--total-timesteps", 16384, "--seed", seed,
                                        "--no-progress"], tmp_path / f"pendulum{seed}"))
    for _, _, cwd in jobs:
        cwd.mkdir()
    scores = {}
    for (script, args, cwd), result in zip(jobs, run_scripts(jobs, max_workers=2)):
        assert result.returncode == 0, result.stderr
        returns = [v for _, v in read_scalars(run_dirs(cwd)[0])["charts/episodic_return"]]
        scores[cwd.name] = float(np.mean(returns[-20:]))
    cartpole = [scores[f"cartpole{s}"] for s in (1, 2, 3)]
    pendulum = [scores[f"pendulum{s}"] for s in (1, 2, 3)]
    assert min(cartpole) > 100, scores
    assert min(pendulum) > 40, scores


# ----------------------------------------------------------------------------------------------
# [kl-1] The KL-penalty objective
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS)
def test_adaptive_kl_penalty_follows_the_papers_rule_and_is_kept_by_the_checkpoint(script, tmp_path, monkeypatch,
                                                                                    capsys, watch):
    m = load_script(script)
    _, w = watched_run(script, ["--no-clip-policy", "--kl-penalty-target", 0.01, "--save-model"], tmp_path,
                       monkeypatch, capsys, watch)
    scalars = read_scalars(run_dirs(tmp_path)[0])
    betas = [v for _, v in scalars["losses/kl_coef"]]
    kls = [v for _, v in scalars["losses/policy_kl"]]
    assert len(betas) == len(kls) == ITERATIONS and betas[0] == 1.0
    for i in range(ITERATIONS - 1):  # beta after iteration i's update is the beta iteration i + 1 trains with
        assert betas[i + 1] == pytest.approx(m.adapt_kl_coef(betas[i], kls[i], 0.01), rel=1e-6)
    assert all(kl > 0 for kl in kls)
    ckpt = torch.load(run_dirs(tmp_path)[0] / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["kl_coef"] == pytest.approx(m.adapt_kl_coef(betas[-1], kls[-1], 0.01))
    assert m.KLPenalty(m.Args(kl_penalty_target=0.01), ckpt).coef == ckpt["kl_coef"]
    # Every update paid beta * KL, with the KL of the minibatch against the rollout policy: 0 on the first.
    first = w.losses[::EPOCHS * MINIBATCHES]
    assert all(abs(call.metrics["kl_penalty"].item()) < 1e-6 for call in first)
    assert max(call.metrics["kl_penalty"].item() for call in w.losses) > 1e-5


@pytest.mark.parametrize("script", SCRIPTS)
def test_fixed_kl_penalty_and_no_penalty(script, tmp_path, monkeypatch, capsys, watch):
    (tmp_path / "fixed").mkdir()
    watched_run(script, ["--kl-penalty", 3.0], tmp_path / "fixed", monkeypatch, capsys, watch)
    fixed = read_scalars(run_dirs(tmp_path / "fixed")[0])
    assert [v for _, v in fixed["losses/kl_coef"]] == [3.0] * ITERATIONS
    (tmp_path / "plain").mkdir()
    _, w = watched_run(script, [], tmp_path / "plain", monkeypatch, capsys, watch)
    assert "losses/kl_coef" not in read_scalars(run_dirs(tmp_path / "plain")[0])
    assert all("kl_penalty" not in call.metrics for call in w.losses)


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag, value", [("--kl-penalty", -1), ("--kl-penalty", "nan"), ("--kl-penalty-target", 0),
                                         ("--kl-penalty-target", "inf")])
def test_kl_penalty_settings_are_range_checked(script, flag, value, tmp_path, monkeypatch, capsys):
    m = load_script(script)
    code, err, out = main_in_process(m, [*TINY[script], flag, value], tmp_path, monkeypatch, capsys)
    assert code == 2 and err.startswith(f"error: {flag} ") and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_adapted_kl_penalty_cannot_start_at_zero(script, tmp_path, monkeypatch, capsys):
    m = load_script(script)
    code, err, out = main_in_process(m, [*TINY[script], "--kl-penalty", "0", "--kl-penalty-target", "0.01"],
                                     tmp_path, monkeypatch, capsys)
    assert code == 2 and err.startswith("error: --kl-penalty 0 with --kl-penalty-target"), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()
    # A fixed beta of 0 is allowed (the penalty's diagnostics without its pull), as is an adapted one from 0.5.
    for flags in (["--kl-penalty", "0"], ["--kl-penalty", "0.5", "--kl-penalty-target", "0.01"]):
        m.check_args(m.Args(**{f[2:].replace("-", "_"): float(v) for f, v in zip(flags[::2], flags[1::2])}))


def test_gaussian_kl_worked_numbers():
    pc = load_script("ppo_continuous")
    # KL[N(0, 1) || N(1, 2^2)] = log 2 + (1 + 1) / (2 * 4) - 1/2 = 0.443147; a second, unchanged dimension adds 0.
    old_mean, old_logstd = torch.tensor([[0.0, 0.5]]), torch.tensor([[0.0, 0.3]])
    new_mean, new_logstd = torch.tensor([[1.0, 0.5]]), torch.tensor([[math.log(2.0), 0.3]])
    assert pc.gaussian_kl(old_mean, old_logstd, new_mean, new_logstd).item() == pytest.approx(0.443147, abs=1e-6)
    # ... and it is torch's exact KL, summed over dimensions, on arbitrary numbers.
    g = torch.Generator().manual_seed(0)
    a, b, c, d = (torch.randn(5, 3, generator=g) for _ in range(4))
    expected = torch.distributions.kl_divergence(torch.distributions.Normal(a, b.exp()),
                                                 torch.distributions.Normal(c, d.exp())).sum(-1)
    torch.testing.assert_close(pc.gaussian_kl(a, b, c, d), expected)


@pytest.mark.parametrize("script", ["ppo_discrete", "ppo_atari"])
def test_categorical_kl_worked_numbers(script):
    m = load_script(script)
    # KL[(1/2, 1/2) || (1/4, 3/4)] = 1/2 log 2 + 1/2 log(2/3) = 1/2 log(4/3) = 0.143841 (logits (5, 5) are
    # (1/2, 1/2): they count up to a constant); the other way round, 1/4 log(1/2) + 3/4 log(3/2) = 0.130812.
    old, new = torch.tensor([[5.0, 5.0]]), torch.tensor([[0.0, math.log(3.0)]])
    assert m.categorical_kl(old, new).item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)
    assert m.categorical_kl(new, old).item() == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), abs=1e-6)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(7, 5, generator=g) * 2, torch.randn(7, 5, generator=g) * 2
    expected = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=a),
                                                 torch.distributions.Categorical(logits=b))
    torch.testing.assert_close(m.categorical_kl(a, b), expected)


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_kl_penalty_pulls_the_policy_back_to_the_rollout_policy(script):
    """KLPenalty's KL is of the rollout policy it stored to the network as it is now: 0 before the update moves
    the network, and a gradient step on it alone brings a moved policy back nearer."""
    module, agent, obs, _, _, _ = agent_and_batch(script, n=32, seed=3)
    penalty = module.KLPenalty(module.Args(kl_penalty=1.0))
    old = penalty.old_policy(agent, obs)
    assert penalty.kl(agent, obs, old).abs().max().item() < 1e-6
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moved = penalty.kl(agent, obs, old).mean()
    assert moved.item() > 1e-4
    with torch.no_grad():  # KL[old || new], in that order (it is not symmetric)
        if script == "ppo_continuous":
            exact = module.gaussian_kl(old[0], old[1], agent.actor_mean(obs), agent.actor_logstd)
        else:
            exact = module.categorical_kl(old, agent.logits(obs))
    torch.testing.assert_close(penalty.kl(agent, obs, old).detach(), exact)
    optimizer = torch.optim.SGD(agent.parameters(), lr=1e-3)
    moved.backward()
    optimizer.step()
    assert penalty.kl(agent, obs, old).mean().item() < moved.item()


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("mean_kl, beta", [(0.005, 0.5), (0.01 / 1.5, 1.0), (0.01, 1.0), (0.015, 1.0), (0.02, 2.0)])
def test_adapt_kl_coef_halves_below_the_band_and_doubles_above(script, mean_kl, beta):
    assert load_script(script).adapt_kl_coef(1.0, mean_kl, 0.01) == beta


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_checkpoint_from_before_the_added_settings_still_loads(script, checkpoints, tmp_path):
    """Settings added to Args since a checkpoint was written take the values that behave as the script did."""
    module = load_script(script)
    ckpt = torch.load(checkpoints[script], map_location="cpu", weights_only=True)
    for name in module.ADDED_SETTINGS:
        del ckpt["args"][name]
    torch.save(ckpt, tmp_path / "older.pt")
    loaded = module.load_checkpoint(str(tmp_path / "older.pt"), module.Args())
    assert {name: loaded["args"][name] for name in module.ADDED_SETTINGS} == module.ADDED_SETTINGS


# Settings each script gained after its checkpoints were first written (long runs were under way): written down
# here, so that dropping one from ADDED_SETTINGS, which would refuse to resume those runs, fails a test.
ADDED_AFTER_THE_FIRST_CHECKPOINTS = {"ppo_discrete": {"clip_policy", "kl_penalty", "kl_penalty_target"},
                                     "ppo_continuous": {"clip_policy", "kl_penalty", "kl_penalty_target"},
                                     "ppo_atari": {"clip_policy", "bf16", "kl_penalty", "kl_penalty_target"}}


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_checkpoint_from_before_each_added_setting_resumes(script, checkpoints, tmp_path, monkeypatch):
    module = load_script(script)
    ckpt = torch.load(checkpoints[script], map_location="cpu", weights_only=True)
    for name in ADDED_AFTER_THE_FIRST_CHECKPOINTS[script]:
        del ckpt["args"][name]
    torch.save(ckpt, tmp_path / "older.pt")
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--resume", str(tmp_path / "older.pt")])
    loaded = module.load_checkpoint(str(tmp_path / "older.pt"), module.Args(resume=str(tmp_path / "older.pt")))
    assert set(module.HYPERPARAMETERS) <= set(loaded["args"])


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_checkpoint_without_a_setting_added_later_evaluates_but_does_not_resume(script, checkpoints, tmp_path,
                                                                                 monkeypatch, capsys):
    """A copy of the script with a new Args field evaluates the original's checkpoints with the field's default."""
    module = load_script(script)
    ckpt = torch.load(checkpoints[script], map_location="cpu", weights_only=True)
    del ckpt["args"]["ent_coef"]  # stands for a field the copy added
    torch.save(ckpt, tmp_path / "before_the_field.pt")
    code, err, out = main_in_process(module, ["--eval-checkpoint", tmp_path / "before_the_field.pt",
                                              "--eval-episodes", 1], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "predates the settings ['ent_coef']; they take their defaults for this evaluation" in out
    assert re.search(r" over 1 (episode|game) \(", out)  # one, not "1 episodes"
    code, err, _ = main_in_process(module, ["--resume", tmp_path / "before_the_field.pt"], tmp_path, monkeypatch,
                                   capsys)
    assert code != 0 and err.count("\n") == 1 and "lacks the settings ['ent_coef']" in err


@pytest.mark.parametrize("script", SCRIPTS)
def test_two_runs_started_in_the_same_second_get_folders_of_their_own(script, tmp_path, monkeypatch, capsys):
    module = load_script(script)
    monkeypatch.setattr(module.time, "time", lambda: 1_800_000_000.0)  # the clock stands still
    for lr in (1e-3, 3e-4):
        code, err, _ = main_in_process(module, [*TINY[script], "--no-progress", "--learning-rate", lr], tmp_path,
                                       monkeypatch, capsys)
        assert code == 0, err
    folders = run_dirs(tmp_path)
    assert [d.name.rsplit("__", 1)[1] for d in folders] == ["1800000000", "1800000001"]
    first_lrs = [read_scalars(d)["charts/learning_rate"][0][1] for d in folders]
    assert first_lrs == [pytest.approx(1e-3), pytest.approx(3e-4)]  # each folder holds its own run only


@pytest.mark.parametrize("script", SCRIPTS)
def test_track_without_a_wandb_login_is_one_error_line_before_any_work(script, tmp_path):
    env = script_env(HOME=tmp_path)  # a home with no wandb login
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        env.pop(name, None)
    result = run_script(script, *TINY[script], "--track", cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: --track: ") and "WANDB_MODE=offline" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "wandb").exists()


@pytest.mark.parametrize("script, env_id", [("ppo_continuous", "Hopper-v3"), ("ppo_discrete", "Taxi-v3")])
def test_an_id_gymnasium_retired_is_one_clean_error_line(script, env_id, tmp_path):
    result = run_script(script, "--env-id", env_id, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: unknown or unavailable env id '{env_id}'"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "\x1b[" not in result.stderr, result.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_run_folder_stands_for_its_checkpoint(script, checkpoints, tmp_path, monkeypatch, capsys):
    module = load_script(script)
    run_dir = checkpoints[script].parent
    assert module.checkpoint_file(str(run_dir)) == str(run_dir / "checkpoint.pt")
    assert module.checkpoint_file(str(tmp_path)) == str(tmp_path)  # no checkpoint.pt in it: left to be refused
    assert module.checkpoint_file(None) is None
    code, err, out = main_in_process(module, ["--resume", run_dir], tmp_path, monkeypatch, capsys)
    assert code == 0 and "already finished" in out, err


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag, suggestion", [("--lr", "--learning-rate"), ("--total-timestep", "--total-timesteps"),
                                              ("--bogus-flag", None)])
def test_an_unknown_flag_is_one_error_line_with_the_nearest_real_ones(script, flag, suggestion, tmp_path, monkeypatch,
                                                                      capsys):
    module = load_script(script)
    code, err, out = main_in_process(module, [flag, 3], tmp_path, monkeypatch, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: unknown flag {flag}")
    assert (f"did you mean {suggestion}?" in err) if suggestion else ("did you mean" not in err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag, now", [("--eval-greedy", "--eval-deterministic"),
                                       ("--no-eval-greedy", "--no-eval-deterministic")])
def test_a_renamed_flag_says_its_new_name(script, flag, now, tmp_path, monkeypatch, capsys):
    code, err, out = main_in_process(load_script(script), [flag], tmp_path, monkeypatch, capsys)
    assert code == 2 and out == "" and err == f"error: {flag} is now {now}\n"


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_gives_each_setting_one_unbroken_line_of_text(script):
    """tyro prints a field's docstring with its line breaks: a docstring that wraps in the source would break
    mid-sentence in --help, so each is one string (concatenated in parentheses where it is long)."""
    import ast

    tree = ast.parse((REPO_ROOT / f"{script}.py").read_text())
    args = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args")
    body = args.body
    helps = {a.target.id: b.value.value for a, b in zip(body, body[1:])
             if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}
    assert set(helps) == {a.target.id for a in body if isinstance(a, ast.AnnAssign)}  # every setting has one
    assert [name for name, text in helps.items() if "\n" in text or "  " in text] == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_known_flags_pass_the_flag_check_in_every_spelling(script):
    module = load_script(script)
    module.check_flags(["--learning-rate", "1e-3", "--learning_rate=1e-3", "--no-anneal-lr", "--anneal-lr", "--help",
                        "-h", "--seed", "-1"])  # no SystemExit


def test_a_custom_env_id_names_a_plain_folder(tmp_path, monkeypatch):
    """An id with a module path ("module:Env-v0") or a namespace ("ALE/Pong-v5") is one folder, not a path."""
    module = load_script("ppo_discrete")
    monkeypatch.chdir(tmp_path)
    name = module.new_run_name(module.Args(env_id="gymnasium.envs.classic_control.cartpole:CartPoleEnv"))
    assert ":" not in name and "/" not in name and (tmp_path / "runs" / name).is_dir()
    assert name.startswith("gymnasium.envs.classic_control.cartpole_CartPoleEnv__ppo_discrete__1__")
