"""PPO for continuous actions (MuJoCo: HalfCheetah, Hopper, Walker2d, ...; also Pendulum-v1).

One file, read top to bottom: the settings, the math as small pure functions, the normalisation statistics, the
network, the environment and the training loop in `train()`: the algorithm, followed by the PPO paper's KL
penalty (off by default), its math and its beta. Then, below one banner, the operations a long run needs (input
checks, checkpoints and resume, stop signals, progress lines, evaluation), and a thin `main()`. Tags like
`[cont-6]` name the implementation details of Huang et al., "The 37 Implementation Details of PPO" (2022);
search for them.

    python ppo_continuous.py --env-id Hopper-v5 --seed 3
    python ppo_continuous.py --help

SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 stop a run at its next safe point with a checkpoint of its last whole
iteration (model, optimizer and normalisation statistics), and the command that resumes it.
"""


import difflib
import json
import math
import os
import re
import signal
import sys
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro


SCRIPT = "ppo_continuous"


@dataclass
class Args:
    # --- the algorithm (a resumed run keeps these from its checkpoint, and exp_name and seed) ---
    env_id: str = "HalfCheetah-v5"
    """gymnasium id of an env with a Box action space and a flat Box observation space"""
    total_timesteps: int = 1_000_000
    """total environment steps across all envs"""
    learning_rate: float = 3e-4
    """initial learning rate of Adam"""
    num_envs: int = 1
    """environments stepped together"""
    num_steps: int = 2048
    """steps per env in each rollout"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of generalized advantage estimation"""
    num_minibatches: int = 32
    """minibatches per epoch"""
    update_epochs: int = 10
    """passes over each rollout"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_policy: bool = True
    ("clip the policy's surrogate objective; --no-clip-policy optimises the plain ratio * advantage (the value loss "
     "keeps its own clipping: --clip-vloss, within +-clip_coef)")
    clip_coef: float = 0.2
    """clipping coefficient of the surrogate objective, and of the value loss (--clip-vloss)"""
    anneal_clip: bool = False
    """anneal the clipping coefficient linearly to 0, like the learning rate"""
    clip_vloss: bool = True
    """clip the value loss"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip"""
    target_kl: Optional[float] = None
    """stop the update epochs early once the approximate KL exceeds this (e.g. 0.015)"""
    kl_penalty: Optional[float] = None
    ("beta of the PPO paper's KL penalty: the loss adds beta * KL[old || new] of the policy (default: no penalty; 1 "
     "to start from with --kl-penalty-target). Not --target-kl, which stops the epochs early")
    kl_penalty_target: Optional[float] = None
    ("adapt beta after each update to keep the batch's mean KL near this (the paper's d_targ): halved below d_targ "
     "/ 1.5, doubled above 1.5 * d_targ")
    norm_obs: bool = True
    """normalise observations by their running mean and std"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return"""
    clip_obs: float = 10.0
    """clip normalised observations to +-this (inf: no clipping)"""
    clip_reward: float = 10.0
    """clip scaled rewards to +-this (inf: no clipping)"""
    bootstrap_truncation: bool = True
    ("bootstrap time-limit truncations with V(final obs); --no-bootstrap-truncation treats them as terminations, "
     "exactly like openai/baselines ppo2 and CleanRL")

    # --- experiment ---
    exp_name: str = SCRIPT
    """name of this experiment, part of the run name"""
    seed: int = 1
    """seed of the run: same seed on CPU, same curve"""
    torch_deterministic: bool = True
    """make cuDNN deterministic (only matters with --cuda)"""
    cuda: bool = False
    """train on the GPU if there is one (small MLPs are usually faster on the CPU)"""
    threads: int = 1
    ("torch CPU threads; one, as these 64-64 MLPs are too small to share out across threads, and a sweep can then "
     "run one seed per core")
    track: bool = False
    """log to Weights & Biases (works offline with WANDB_MODE=offline)"""
    wandb_project_name: str = "ppo-reference"
    """the wandb project"""
    wandb_entity: Optional[str] = None
    """the wandb entity (team)"""
    capture_video: bool = False
    ("record mp4s under videos/{run_name}: in training env 0's episodes 0, 1, 8, 27, 64, ... (gymnasium's schedule: "
     "the cubes up to 1000, then every 1000th); with --eval-checkpoint every evaluated episode (headless: "
     "MUJOCO_GL=egl unless set)")
    progress: bool = True
    """report progress: a live line in a terminal; a plain line every --progress-interval seconds otherwise"""
    progress_interval: float = 60.0
    """seconds between the plain progress lines printed when stdout is not a terminal (a log file)"""

    # --- checkpoints and evaluation ---
    save_model: bool = False
    """write runs/{run_name}/checkpoint.pt at the end of training (a run stopped by a signal always writes it)"""
    checkpoint_every: int = 0
    """also write it every N iterations, and at the end (0: never)"""
    checkpoint_minutes: float = 0.0
    ("also write it every M minutes of wall time, and at the end (0: never); on a cluster, a kill then costs at "
     "most M minutes")
    resume: Optional[str] = None
    ("continue training from this checkpoint, in its run directory (its hyperparameters are kept: a different one "
     "given here is refused; its checkpoint settings too, unless given here)")
    eval_checkpoint: Optional[str] = None
    """evaluate this checkpoint instead of training, and print mean +- std of the returns"""
    eval_episodes: int = 10
    """episodes to run in evaluation"""
    eval_deterministic: bool = True
    """evaluate with the Gaussian mean (--no-eval-deterministic samples from the policy)"""


# ----------------------------------------------------------------------------------------------
# The math, as pure functions of tensors
# ----------------------------------------------------------------------------------------------


def compute_gae(rewards, values, dones, last_value, gamma, gae_lambda):
    """[core-5] Generalized advantage estimation, backwards over a rollout of shape (steps, envs).

    `dones[t]` says the episode ended with step t, so V(s_{t+1}) must not be bootstrapped there
    (a time-limit truncation has already had gamma * V(final obs) added to its reward).
    `last_value` is V of the observation after the rollout: episodes carry over to the next rollout.
    Returns (advantages, value targets = advantages + values). The loop runs in numpy: the same float32
    arithmetic, several times cheaper per step than torch calls on num_envs numbers."""
    device = values.device
    rewards, values, dones, next_value = (x.cpu().numpy() for x in (rewards, values, dones, last_value))
    advantages = np.zeros_like(rewards)
    next_advantage = 0.0
    for t in reversed(range(rewards.shape[0])):
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        next_advantage = delta + gamma * gae_lambda * not_done * next_advantage
        advantages[t] = next_advantage
        next_value = values[t]
    advantages, values = torch.from_numpy(advantages).to(device), torch.from_numpy(values).to(device)
    return advantages, advantages + values


def bootstrap_truncated(rewards, truncated, final_values, gamma):
    """A time limit is not a real end: the agent would have gone on collecting V(final obs).
    Adding gamma * V(final obs) to the reward of a truncated (not terminated) step and then treating
    the step as done gives exactly the bootstrapped target; terminated steps get nothing."""
    return rewards + gamma * final_values * truncated


def normalize(x, eps=1e-8):
    """[core-7] Zero mean, unit std."""
    return (x - x.mean()) / (x.std() + eps)


def clipped_surrogate(ratio, advantages, clip_coef):
    """[core-8] Per-sample PPO objective (to maximise): min(r A, clip(r, 1-e, 1+e) A).

    Where the clipped term is the smaller one, it is constant in the policy's parameters, so the
    gradient is exactly zero: the sample has moved far enough in the direction its advantage wants."""
    return torch.min(ratio * advantages, torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * advantages)


def value_loss(new_values, old_values, returns, clip_coef, clip=True):
    """[core-9] 0.5 * squared error; clipped: the max of the plain error and the error of a value kept
    within +-clip_coef of the value at rollout time, so the critic cannot jump far in one update."""
    unclipped = (new_values - returns) ** 2
    if not clip:
        return 0.5 * unclipped.mean()
    clipped_values = old_values + torch.clamp(new_values - old_values, -clip_coef, clip_coef)
    return 0.5 * torch.max(unclipped, (clipped_values - returns) ** 2).mean()


def ppo_loss(new_logprob, entropy, new_value, old_logprob, old_value, advantages, returns, clip_coef, args,
             kl=None, kl_coef=0.0):
    """[core-10] The loss of one minibatch, to minimise: policy loss - ent_coef * entropy + vf_coef * value
    loss, one loss for one optimizer. old_logprob and old_value are what the rollout stored: the ratio is
    taken against the policy that acted. [kl-1] With `kl` (each sample's KL[old || new]), kl_coef * its mean
    is added. Returns (loss, diagnostics as detached scalars)."""
    logratio = new_logprob - old_logprob
    ratio = logratio.exp()
    if args.norm_adv:
        advantages = normalize(advantages)  # [core-7] the advantages, never the value targets
    surrogate = clipped_surrogate(ratio, advantages, clip_coef) if args.clip_policy else ratio * advantages
    pg_loss = -surrogate.mean()
    v_loss = value_loss(new_value, old_value, returns, clip_coef, args.clip_vloss)
    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss
    if kl is not None:
        loss = loss + kl_coef * kl.mean()
    with torch.no_grad():
        # [core-12] Two estimators of KL(old || new); the second is unbiased and lower-variance.
        metrics = {"policy_loss": pg_loss.detach(), "value_loss": v_loss.detach(), "entropy": entropy_loss.detach(),
                   "old_approx_kl": (-logratio).mean(), "approx_kl": ((ratio - 1) - logratio).mean(),
                   "clipfrac": ((ratio - 1.0).abs() > clip_coef).float().mean()}
        if kl is not None:
            metrics["kl_penalty"] = kl.mean().detach()
    return loss, metrics


def explained_variance(predicted, target):
    """[core-12] 1 - Var[target - predicted] / Var[target]: 1 is perfect, 0 no better than a constant."""
    var_target = np.var(target)
    return float("nan") if var_target == 0 else float(1 - np.var(target - predicted) / var_target)


def diagonal_gaussian(mean, std, action=None):
    """[cont-1] A diagonal Gaussian policy: (the action, sampled unless given; its log-probability; the
    entropy), [cont-3] each summed over the independent action dimensions. The arithmetic of
    torch.distributions.Normal, written out so that a rollout step does not build that object."""
    if action is None:
        with torch.no_grad():  # the sample is data to learn from, not a function of the parameters
            action = torch.normal(mean, std)
    log_std = std.log()
    logprob = -((action - mean) ** 2) / (2 * std**2) - log_std - math.log(math.sqrt(2 * math.pi))
    entropy = 0.5 + 0.5 * math.log(2 * math.pi) + log_std
    return action, logprob.sum(-1), entropy.sum(-1)


# ----------------------------------------------------------------------------------------------
# Normalisation statistics: part of the model, saved in every checkpoint
# ----------------------------------------------------------------------------------------------


class RunningMeanStd:
    """[cont-6] Running mean and variance of a stream of batches (Chan et al.'s parallel update, as in baselines).

    One instance serves the whole vector of envs: every env's sample updates the same statistics."""

    def __init__(self, shape=()):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, batch):
        batch_mean, batch_var, batch_count = batch.mean(axis=0), batch.var(axis=0), batch.shape[0]
        delta, total = batch_mean - self.mean, self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.var, self.count = m2 / total, total

    def state_dict(self):
        """A copy: it keeps these numbers while the statistics move on (a checkpoint may be written later)."""
        return {"mean": torch.tensor(self.mean), "var": torch.tensor(self.var), "count": self.count}

    def load_state_dict(self, state):
        self.mean, self.var, self.count = state["mean"].numpy(), state["var"].numpy(), state["count"]


def normalize_obs(obs, rms, clip, eps=1e-8):
    """[cont-6] Scale by the running statistics; [cont-7] then clip, so a rare state cannot blow up the input."""
    return np.clip((obs - rms.mean) / np.sqrt(rms.var + eps), -clip, clip)


def scale_reward(rewards, dones, discounted_return, rms, gamma, clip, eps=1e-8):
    """[cont-8] Divide rewards by the running std of the discounted return (no mean subtracted, so the
    sign of a reward is kept); [cont-9] then clip. `discounted_return` (one per env) is updated in place
    and reset where an episode ends. Returns the scaled rewards."""
    discounted_return[:] = discounted_return * gamma + rewards
    rms.update(discounted_return)
    scaled = np.clip(rewards / np.sqrt(rms.var + eps), -clip, clip)
    discounted_return[dones] = 0.0
    return scaled


# ----------------------------------------------------------------------------------------------
# The network
# ----------------------------------------------------------------------------------------------


def layer_init(layer, gain=np.sqrt(2), bias=0.0):
    """[core-2] Orthogonal weights with the given gain, constant bias."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_size, action_size):
        super().__init__()
        # [cont-4] [core-13] Separate 64-64 tanh networks for the value and the policy.
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_size, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), gain=1.0),  # [core-2] value output gain 1
        )
        # [cont-1] A diagonal Gaussian: the network outputs the mean of each action dimension.
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_size, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            # [core-2] Policy output gain 0.01: means start near 0.
            layer_init(nn.Linear(64, action_size), gain=0.01),
        )
        # [cont-2] The log-std does not depend on the state: one learned parameter per dimension, from 0 (std 1).
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_size))

    def get_value(self, obs):
        return self.critic(obs).squeeze(-1)

    def get_action_and_value(self, obs, action=None):
        mean = self.actor_mean(obs)
        action, logprob, entropy = diagonal_gaussian(mean, self.actor_logstd.expand_as(mean).exp(), action)
        return action, logprob, entropy, self.get_value(obs)


# ----------------------------------------------------------------------------------------------
# The environment
# ----------------------------------------------------------------------------------------------


def make_env(env_id, idx, capture_video, video_dir, every_episode=False):
    def thunk():
        if capture_video and idx == 0:
            return recording_env(env_id, video_dir, every_episode)  # --capture-video films env 0
        return gym_make_quietly(env_id)

    return thunk


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def train(args, ckpt, obs_size, action_size, obs_rms, return_rms, device):
    """PPO: collect a rollout of num_envs x num_steps, compute advantages, then epochs of minibatch updates;
    repeat until total_timesteps. `ckpt` is the checkpoint to resume from, or None; obs_rms and return_rms
    are the normalisation statistics (the checkpoint's on resume)."""
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size  # whole rollouts: a remainder is not trained
    run = open_run(args, ckpt, num_iterations)
    if run is None:
        return  # a finished run: nothing to train

    # Seeding: torch draws every action and shuffle; each env has its own generator, seeded with seed + its
    # index at its first reset. Nothing uses python's or numpy's global generators, so a checkpoint skips them.
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # [core-1] N envs stepped together. SAME_STEP autoreset: the step that ends an episode returns the
    # first observation of the next one, and the true last observation in info["final_obs"].
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, run.video_dir) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    # Episode statistics see the raw rewards: charts/episodic_return is in the env's own units.
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high

    agent = Agent(obs_size, action_size).to(device)
    # [core-3] Adam with epsilon 1e-5 (ppo2's value, not PyTorch's default 1e-8). The fused kernel does
    # Adam's update in one call per step instead of one per tensor; it rounds differently in the last bit.
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    start_iteration, global_step, returns_so_far = restore_checkpoint(ckpt, agent, optimizer) if ckpt else (1, 0, [])
    penalty = KLPenalty(args, ckpt)
    writer = open_logs(args, run, resumed_at=global_step if ckpt else None)

    # Rollout storage, allocated once.
    obs = torch.zeros((args.num_steps, args.num_envs, obs_size), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs, action_size), device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    # Rewards and dones, numpy from the envs to GAE's loop.
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    def observe(raw_obs, update=True):
        """The network's view of a batch of raw observations; only observations the envs really
        returned update the shared statistics (not the final observations of ended episodes)."""
        if not args.norm_obs:
            return torch.as_tensor(raw_obs, dtype=torch.float32, device=device)
        if update:
            obs_rms.update(raw_obs)
        return torch.as_tensor(normalize_obs(raw_obs, obs_rms, args.clip_obs), dtype=torch.float32, device=device)

    seed = args.seed + (start_iteration - 1) * args.num_envs  # a resumed run starts fresh episodes
    next_obs_raw, _ = envs.reset(seed=[seed + i for i in range(args.num_envs)])
    next_obs = observe(next_obs_raw, update=ckpt is None)  # resuming alone must not move the statistics
    discounted_return = np.zeros(args.num_envs)
    recent_returns = deque(returns_so_far, maxlen=100)  # carried over a resume, so the run's last 100 are its own
    control = RunControl(args, run, agent, optimizer, (obs_rms, return_rms, penalty), envs, writer, device,
                         num_iterations * batch_size, start_iteration, global_step, recent_returns)

    for iteration in range(start_iteration, num_iterations + 1):
        # [core-4] Learning rate annealed linearly to 0; [aux-1] optionally the clip range too.
        frac = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef

        # --- rollout ---
        for step in range(args.num_steps):
            if control.stop:
                break  # a partial rollout is dropped: the checkpoint keeps the last whole iteration
            global_step += args.num_envs
            obs[step] = next_obs
            with torch.inference_mode():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            # [cont-5] The env gets the action clipped to its bounds; the buffer keeps the unclipped
            # sample, whose log-prob is the one the policy really assigned.
            actions[step], logprobs[step], values[step] = action, logprob, value
            env_action = np.clip(action.cpu().numpy(), action_low, action_high)

            next_obs_raw, reward, terminated, truncated, info = envs.step(env_action)
            done = terminated | truncated
            truncated = truncated & ~terminated
            if args.norm_reward:
                reward = scale_reward(reward, done, discounted_return, return_rms, args.gamma, args.clip_reward)
            if args.bootstrap_truncation and truncated.any():
                # The final observation goes through the same (not updated) statistics as every other input.
                final_obs = observe(np.stack(info["final_obs"][truncated]), update=False)
                final_values = np.zeros(args.num_envs)
                with torch.inference_mode():
                    final_values[truncated] = agent.get_value(final_obs).cpu().numpy()
                reward = bootstrap_truncated(reward, truncated, final_values, args.gamma)
            rewards[step] = reward
            dones[step] = done
            next_obs = observe(next_obs_raw)

            if "_episode" in info:
                for i in np.flatnonzero(info["_episode"]):
                    episodic_return = float(info["episode"]["r"][i])
                    recent_returns.append(episodic_return)
                    writer.add_scalar("charts/episodic_return", episodic_return, global_step)
                    writer.add_scalar("charts/episodic_length", int(info["episode"]["l"][i]), global_step)
        if control.stop:
            break

        # --- advantages ---
        with torch.inference_mode():
            last_value = agent.get_value(next_obs)
        advantages, returns = compute_gae(torch.from_numpy(rewards), values, torch.from_numpy(dones), last_value,
                                          args.gamma, args.gae_lambda)

        # --- flatten the batch ---
        b_obs, b_actions = obs.reshape(batch_size, obs_size), actions.reshape(batch_size, action_size)
        b_logprobs = logprobs.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        old_policy = penalty.old_policy(agent, b_obs) if penalty.on else None  # [kl-1]

        # --- epochs of minibatch updates ---
        clipfracs = []
        for epoch in range(args.update_epochs):
            # [core-6] Each epoch shuffles all samples and splits them into minibatches that cover all.
            order = torch.randperm(batch_size, device=device)
            for start in range(0, batch_size, minibatch_size):
                mb = order[start:start + minibatch_size]
                _, new_logprob, entropy, new_value = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                kl = penalty.kl(agent, b_obs[mb], (old_policy[0][mb], old_policy[1])) if penalty.on else None
                loss, metrics = ppo_loss(new_logprob, entropy, new_value, b_logprobs[mb], b_values[mb],
                                         b_advantages[mb], b_returns[mb], clip_coef, args, kl, penalty.coef)
                clipfracs.append(metrics["clipfrac"])

                optimizer.zero_grad()
                loss.backward()
                # [core-11] Global gradient-norm clipping.
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            # [aux-3] Optional early stop once the policy has moved too far from the rollout policy.
            if args.target_kl is not None and metrics["approx_kl"] > args.target_kl:
                break
        control.check_finite(loss, global_step)
        if penalty.on:  # [kl-1] the batch's mean KL after the update moves beta
            with torch.no_grad():
                mean_kl = penalty.kl(agent, b_obs, old_policy).mean().item()
            writer.add_scalar("losses/kl_coef", penalty.coef, global_step)
            writer.add_scalar("losses/policy_kl", mean_kl, global_step)
            penalty.update(mean_kl)

        # --- log ---
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("charts/SPS", control.steps_per_second(global_step), global_step)
        for name in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl"):  # the last minibatch's
            writer.add_scalar(f"losses/{name}", metrics[name].item(), global_step)
        writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), global_step)
        writer.add_scalar("losses/explained_variance",
                          explained_variance(b_values.cpu().numpy(), b_returns.cpu().numpy()), global_step)
        if not control.end_iteration(iteration, global_step, recent_returns):
            break

    control.finish(global_step, recent_returns)


# ----------------------------------------------------------------------------------------------
# [kl-1] The KL penalty: its math and its beta, used by train() above
# ----------------------------------------------------------------------------------------------


def gaussian_kl(old_mean, old_logstd, new_mean, new_logstd):
    """[kl-1] KL[N(old) || N(new)] of diagonal Gaussians, exact, summed over the action dimensions."""
    old_var, new_var = (2 * old_logstd).exp(), (2 * new_logstd).exp()
    return (new_logstd - old_logstd + (old_var + (old_mean - new_mean) ** 2) / (2 * new_var) - 0.5).sum(-1)


def adapt_kl_coef(beta, mean_kl, target):
    """[kl-1] The PPO paper's rule after each policy update: halve beta when the mean KL d < target / 1.5, double
    it when d > 1.5 * target, else keep it."""
    if mean_kl < target / 1.5:
        return beta / 2
    if mean_kl > 1.5 * target:
        return beta * 2
    return beta


class KLPenalty:
    """[kl-1] The KL-penalty objective's beta and how it moves: fixed (--kl-penalty), or adapted to a target mean
    KL (--kl-penalty-target, from 1 unless --kl-penalty says otherwise). Off by default: the clip alone."""

    def __init__(self, args, ckpt=None):
        self.target = args.kl_penalty_target
        self.on = args.kl_penalty is not None or self.target is not None
        self.coef = args.kl_penalty if args.kl_penalty is not None else 1.0 if self.on else 0.0
        if ckpt is not None:
            self.coef = ckpt.get("kl_coef", self.coef)  # beta is state: a resumed run goes on with its own

    @staticmethod
    def old_policy(agent, obs):
        """The rollout policy's Gaussian on the batch, taken before the update moves it: (mean, log-std)."""
        with torch.no_grad():
            return agent.actor_mean(obs), agent.actor_logstd.detach().clone()

    @staticmethod
    def kl(agent, obs, old):
        """KL[old || current policy] on each observation, with gradients to the current policy."""
        return gaussian_kl(old[0], old[1], agent.actor_mean(obs), agent.actor_logstd)

    def update(self, mean_kl):
        if self.target is not None:
            self.coef = adapt_kl_coef(self.coef, mean_kl, self.target)


# ==============================================================================================
# Operations: input checks, checkpoints and resume, stop signals, progress, logs, evaluation
# ==============================================================================================


# Fields a resumed run takes from its checkpoint and must not change; the others (logging) may change.
_FIELD_NAMES = [f.name for f in fields(Args)]
HYPERPARAMETERS = _FIELD_NAMES[:_FIELD_NAMES.index("exp_name")] + ["exp_name", "seed"]
# Settings added since checkpoints were first written, at the values that behave as the script did before them:
# an older checkpoint resumes and evaluates with these.
ADDED_SETTINGS = {"clip_policy": True, "kl_penalty": None, "kl_penalty_target": None}
# A resumed run keeps checkpointing as the run it continues did, unless the command line says otherwise.
CHECKPOINT_SETTINGS = ["save_model", "checkpoint_every", "checkpoint_minutes"]
# Flags that were renamed, so that the old name says what it is now.
RENAMED_FLAGS = {"eval-greedy": "eval-deterministic"}
# One range of seeds for all three scripts: env i is seeded with seed + i (a resumed run's with more), and
# ppo_atari.py's ale-py vector env takes 32-bit seeds.
MAX_SEED = 2**30


def fail(message):
    """Bad input ends the program with one line and no traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def gym_make_quietly(env_id, **kwargs):
    """gym.make without MuJoCo's noise. MuJoCo 4's model compiler warns, from C, that gymnasium's own model
    files use deprecated attributes (HalfCheetah: "compiler attribute 'settotalmass' is deprecated"), and
    appends that to MUJOCO_LOG.TXT in the working directory: news about gymnasium's files, not about the run.
    While the env is made, MuJoCo's warnings go to a hook instead: deprecations are dropped, any other warning
    is still printed. Warnings while training (an unstable simulation) keep MuJoCo's own handling."""
    try:
        is_mujoco = "mujoco" in str(gym.spec(env_id).entry_point)
    except gym.error.Error:
        is_mujoco = False  # an unknown id: gym.make says so
    if not is_mujoco:
        return gym.make(env_id, **kwargs)
    import mujoco

    def hook(message):
        if "deprecated" not in message:
            print(f"MuJoCo warning: {message}", file=sys.stderr)

    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(hook)
    try:
        return gym.make(env_id, **kwargs)
    finally:
        mujoco.set_mju_user_warning(previous)


def check_env(env_id):
    """Fail early unless env_id is a registered env with Box actions and flat Box observations."""
    if "NoFrameskip" in env_id or env_id.startswith("ALE/"):
        fail(f"{env_id} is an Atari game: use ppo_atari.py")
    try:
        with warnings.catch_warnings():  # "out of date" would stand before the error line; training warns
            warnings.simplefilter("ignore", DeprecationWarning)
            env = gym_make_quietly(env_id)
    except (gym.error.Error, ImportError) as e:
        fail(f"unknown or unavailable env id '{env_id}': {e}")
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if isinstance(act_space, gym.spaces.Discrete):
        fail(f"{env_id} has discrete actions: use ppo_discrete.py")  # (Atari ids are caught above)
    if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) != 1:
        fail(f"{env_id} has a {act_space} action space; this script needs a 1-D Box")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        fail(f"{env_id} has observations {obs_space}; this script needs a flat Box")
    # Documented choice for unbounded actions: [cont-5] clipping to +-inf is a no-op, the sample goes as is.
    return obs_space.shape[0], act_space.shape[0]


def flags_given():
    """Names of the Args fields set on the command line (--no-x counts as x), to tell them from defaults."""
    names = {a[2:].split("=")[0].replace("-", "_") for a in sys.argv[1:] if a.startswith("--")}
    return names | {n[3:] for n in names if n.startswith("no_")}


def check_flags(argv):
    """An unknown flag gets one error line naming the nearest real ones (tyro would draw a box of them)."""
    known = [f.name.replace("_", "-") for f in fields(Args)]
    for arg in argv:
        name = arg[2:].split("=")[0].replace("_", "-") if arg.startswith("--") else None
        if name is None or name == "help" or name in known or (name.startswith("no-") and name[3:] in known):
            continue
        old = name[3:] if name.startswith("no-") else name
        if old in RENAMED_FLAGS:
            fail(f"--{name} is now --{name[:len(name) - len(old)]}{RENAMED_FLAGS[old]}")
        initials = [k for k in known if "".join(word[0] for word in k.split("-")) == name]  # --lr
        near = list(dict.fromkeys(initials + difflib.get_close_matches(name, known, n=2, cutoff=0.6)))
        hint = f"; did you mean {' or '.join('--' + k for k in near)}?" if near else ""
        fail(f"unknown flag --{name}{hint} (python {SCRIPT}.py --help lists them all)")


def check_args(args, merged=False):
    """Every setting in its range before any work starts: one error line naming the flag, nothing written."""
    def need(name, ok, allowed):
        if not ok:
            fail(f"--{name.replace('_', '-')} {getattr(args, name)} is out of range: it must be {allowed}")

    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes",
                 "threads"):
        need(name, getattr(args, name) >= 1, ">= 1")
    need("seed", 0 <= args.seed <= MAX_SEED, f"in [0, {MAX_SEED}]")
    need("checkpoint_every", args.checkpoint_every >= 0, ">= 0")
    for name in ("checkpoint_minutes", "progress_interval", "ent_coef"):
        need(name, math.isfinite(getattr(args, name)) and getattr(args, name) >= 0, ">= 0")
    for name in ("learning_rate", "clip_coef", "vf_coef", "max_grad_norm"):
        need(name, math.isfinite(getattr(args, name)) and getattr(args, name) > 0, "> 0")
    for name in ("gamma", "gae_lambda"):
        need(name, 0 <= getattr(args, name) <= 1, "in [0, 1]")
    for name in ("clip_obs", "clip_reward"):  # [cont-7] [cont-9] a bound of 0 would zero every input or reward
        need(name, getattr(args, name) > 0, "> 0 (inf: no clipping)")
    for name in ("target_kl", "kl_penalty_target"):
        if getattr(args, name) is not None:
            need(name, math.isfinite(getattr(args, name)) and getattr(args, name) > 0, "> 0 (or not given)")
    if args.kl_penalty is not None:
        need("kl_penalty", math.isfinite(args.kl_penalty) and args.kl_penalty >= 0, ">= 0 (or not given)")
    if args.kl_penalty == 0 and args.kl_penalty_target is not None:  # halving and doubling keep a beta of 0
        fail("--kl-penalty 0 with --kl-penalty-target would stay 0: start the adapted beta above 0 (default 1)")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.exp_name) or "__" in args.exp_name:
        fail(f"--exp-name '{args.exp_name}' names the run folder: use letters, digits, '.', '_', '-' "
             "(not empty, no '/', no '__', which separates the fields of a run name)")
    if args.eval_checkpoint and args.resume:
        fail("--eval-checkpoint evaluates and --resume trains: give one of them")
    # Resuming, the checkpoint's settings fill in what the command line leaves out, so these checks of settings
    # together wait for them (merge_resumed_args checks again, merged); evaluation does not use them.
    batch_size = args.num_envs * args.num_steps
    if merged or not (args.resume or args.eval_checkpoint):
        if batch_size % args.num_minibatches:
            fail(f"num_envs * num_steps = {batch_size} does not split into {args.num_minibatches} minibatches; "
                 "choose --num-minibatches that divides it")
        if args.total_timesteps < batch_size:
            fail(f"--total-timesteps {args.total_timesteps} is smaller than one rollout ({batch_size} steps)")
        if args.norm_adv and batch_size // args.num_minibatches < 2:
            fail("minibatches of one sample cannot be normalised: use fewer --num-minibatches or --no-norm-adv")


def check_tracking(args):
    """--track needs a Weights & Biases login, or WANDB_MODE=offline: said before any work, in one line."""
    if not args.track or os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun", "disabled"):
        return
    import wandb

    try:
        logged_in = wandb.login(prompt=False, verify=False)  # reads the key; asks nothing, sends nothing
    except Exception as e:  # a malformed key
        fail(f"--track: {e}")
    if not logged_in:
        fail("--track: no Weights & Biases login here: run `wandb login`, or set WANDB_MODE=offline to log offline")


def checkpoint_file(path):
    """A run folder given for a checkpoint stands for the checkpoint.pt in it."""
    inside = os.path.join(path, "checkpoint.pt") if path else None
    return inside if inside and os.path.isdir(path) and os.path.isfile(inside) else path


def load_checkpoint(path, args):
    """Read a checkpoint and check it belongs to this script and to the env asked for."""
    if os.path.isdir(path):
        fail(f"{path} is a folder without a checkpoint.pt (a run's checkpoint is RUN_DIR/checkpoint.pt)")
    if not os.path.isfile(path):
        fail(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        script, saved_env_id = ckpt["script"], ckpt["args"]["env_id"]
    except Exception as e:  # a truncated or foreign file can fail in many ways; torch's own advice does not apply
        fail(f"cannot read checkpoint {path}: it is not a checkpoint of these scripts, or it is damaged "
             f"({type(e).__name__})")
    if script != SCRIPT:
        fail(f"{path} was written by {script}.py, not {SCRIPT}.py: use {script}.py")
    ckpt["args"] = {**ADDED_SETTINGS, **ckpt["args"]}
    # A setting added to Args later (a copy of this script with a new field) is not in older checkpoints.
    missing = sorted(set(HYPERPARAMETERS) - set(ckpt["args"]))
    if missing and args.resume:
        fail(f"{path} lacks the settings {missing}: it was written by another version of {SCRIPT}.py, and a resumed "
             "run keeps the settings it had (ADDED_SETTINGS can say which values behave as that version did)")
    if missing:
        print(f"note: {path} predates the settings {missing}; they take their defaults for this evaluation")
        ckpt["args"] = {**asdict(Args()), **ckpt["args"]}
    if "env_id" in flags_given() and args.env_id != saved_env_id:
        fail(f"{path} was trained on {saved_env_id}, not {args.env_id}")
    return ckpt


def merge_resumed_args(args, ckpt):
    """A resumed run is the same run: it keeps the checkpoint's hyperparameters, and its checkpoint settings
    unless the command line gives new ones."""
    given = flags_given()
    for name in HYPERPARAMETERS:
        saved = ckpt["args"][name]
        if name in given and getattr(args, name) != saved:
            why = (" (its learning-rate schedule anneals over the budget, so a run cannot be extended: start a new "
                   "run with the budget you want)" if name == "total_timesteps" else "")
            fail(f"--{name.replace('_', '-')} {getattr(args, name)} differs from the checkpoint's {saved}: a resumed "
                 f"run keeps the hyperparameters it was started with{why}")
        setattr(args, name, saved)
    for name in CHECKPOINT_SETTINGS:
        if name not in given and name in ckpt["args"]:
            setattr(args, name, ckpt["args"][name])
    check_args(args, merged=True)  # the merged settings, as they will run


@dataclass
class Run:
    """Where a run lives: runs/{name}/ holds its logs and checkpoint.pt; its videos go to video_dir."""
    name: str
    dir: str
    video_dir: str

    @property
    def checkpoint(self):
        return os.path.join(self.dir, "checkpoint.pt")


def open_run(args, ckpt, num_iterations):
    """The run to train: a new one, or the checkpoint's (None, said so, if it has nothing left to train)."""
    if ckpt is None:
        name = new_run_name(args)
        return Run(name, os.path.join("runs", name), f"videos/{name}")
    if ckpt["iteration"] >= num_iterations:
        print(f"{ckpt['run_name']} already finished ({ckpt['global_step']} of {args.total_timesteps} steps): nothing "
              f"to train. To train longer, start a new run with a larger --total-timesteps.")
        return None
    # A resumed run records into a folder of its own: video ids restart at 0 and would overwrite.
    video_dir = unused_folder(f"videos/{ckpt['run_name']}/resumed-at-step-{ckpt['global_step']}")
    return Run(ckpt["run_name"], resumed_run_dir(args.resume, ckpt), video_dir)


def new_run_name(args):
    """{env}__{exp_name}__{seed}__{unix time} ("ALE/Pong-v5" and "module:Env-v0" written with "_"), its folder
    made at once: of two runs started in the same second with the same settings, the second takes the next
    second's name instead of writing into the first's."""
    os.makedirs("runs", exist_ok=True)
    stamp = int(time.time())
    while True:
        name = f"{re.sub('[/:]', '_', args.env_id)}__{args.exp_name}__{args.seed}__{stamp}"  # a folder, not a path
        try:
            os.mkdir(os.path.join("runs", name))
            return name
        except FileExistsError:
            stamp += 1


def unused_folder(path):
    """path, or path-2, path-3, ... where that exists: videos are never recorded over earlier ones."""
    candidate, n = path, 1
    while os.path.exists(candidate):
        n += 1
        candidate = f"{path}-{n}"
    return candidate


def resumed_run_dir(checkpoint_path, ckpt):
    """A checkpoint in its own run folder resumes there, from wherever it is started; a copy kept elsewhere
    resumes into runs/{run_name} under the working directory. Either way the run's checkpoint.pt there will be
    overwritten, so an older checkpoint (a copy kept from step M) may not resume over a newer one."""
    run_name = ckpt["run_name"]
    folder = os.path.dirname(os.path.abspath(checkpoint_path))
    run_dir = folder if os.path.basename(folder) == run_name else os.path.join("runs", run_name)
    current = os.path.join(run_dir, "checkpoint.pt")
    if os.path.isfile(current) and not os.path.samefile(current, checkpoint_path):
        try:
            current_step = torch.load(current, map_location="cpu", weights_only=True)["global_step"]
        except Exception:  # a damaged checkpoint holds nothing to keep
            current_step = -1
        if current_step > ckpt["global_step"]:
            fail(f"{current} is at step {current_step}, past the step {ckpt['global_step']} of {checkpoint_path}: "
                 f"resuming from the older one would overwrite it. Resume from {current}, or move it away first "
                 f"to train again from step {ckpt['global_step']}")
    return run_dir


def save_checkpoint(path, agent, optimizer, stats, args, run_name, global_step, iteration, rng, recent_returns=(),
                    writer=None):
    """Write atomically (a temporary file, synced, then renamed over the old one): a kill at any moment,
    even during the write, leaves the previous checkpoint intact. The logs are flushed first, so everything
    up to the checkpoint's step is on disk when the checkpoint says it was done.

    `stats` holds the normalisation statistics as they were at the end of that iteration's rollout: what an
    uninterrupted run goes on with. A stop drops a partial rollout, but its observations and rewards have
    already moved the running statistics; saving those would count steps the checkpoint never trained on."""
    if writer is not None:
        writer.flush()
    ckpt = {
        "script": SCRIPT, "args": asdict(args), "run_name": run_name, "model": agent.state_dict(),
        "obs_rms": stats["obs_rms"], "return_rms": stats["return_rms"], "kl_coef": stats["kl_coef"],
        "optimizer": optimizer.state_dict(), "global_step": global_step, "iteration": iteration,
        "rng": rng, "recent_returns": [float(r) for r in recent_returns],
    }
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(ckpt, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    # Beside it, in a few bytes, how far it got: a sweep reads this instead of loading torch or scraping logs.
    status = os.path.join(os.path.dirname(path), "checkpoint.json")
    with open(f"{status}.tmp", "w") as f:
        json.dump({"global_step": global_step, "iteration": iteration, "total_timesteps": args.total_timesteps}, f)
    os.replace(f"{status}.tmp", status)


def restore_checkpoint(ckpt, agent, optimizer):
    """What save_checkpoint wrote, put back: the network, Adam's moments and step counts, and the generators.
    Returns (the first iteration still to train, the step reached, the returns of the last 100 episodes before
    it; none from a checkpoint written before they were kept)."""
    agent.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    if ckpt["rng"].get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
    return ckpt["iteration"] + 1, ckpt["global_step"], ckpt.get("recent_returns", [])


def restore_statistics(ckpt, obs_size, obs_rms, return_rms):
    """The checkpoint's normalisation statistics, into obs_rms and return_rms (evaluation needs them too)."""
    if ckpt["obs_rms"]["mean"].shape != (obs_size,):
        fail(f"checkpoint observations have shape {tuple(ckpt['obs_rms']['mean'].shape)}, "
             f"{ckpt['args']['env_id']} has ({obs_size},)")
    obs_rms.load_state_dict(ckpt["obs_rms"])
    return_rms.load_state_dict(ckpt["return_rms"])


def rng_states():
    """The generators a run draws from, as a checkpoint keeps them. Taken at the end of each iteration: a stop
    drops a partial rollout whose actions have already drawn from them, and a resumed run must go on as an
    uninterrupted one would from that iteration, wherever in the next one the signal came."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def checkpoint_due(args, iteration, last_saved_at):
    """The periodic checkpoint: every --checkpoint-every iterations and/or every --checkpoint-minutes."""
    if args.checkpoint_every and iteration % args.checkpoint_every == 0:
        return True
    return bool(args.checkpoint_minutes) and time.time() - last_saved_at >= 60 * args.checkpoint_minutes


class StopSignals:
    """SIGTERM (`kill`; Slurm at a time limit or preemption), SIGINT (Ctrl-C) and SIGUSR1 (Slurm's --signal
    warning) ask the training loop to stop at its next safe point: the handler only records the signal, and
    the loop looks at it between env steps and after each update, then writes a checkpoint and exits. Slurm
    signals every process of a job, so repeats are ignored while the stop is under way; a second Ctrl-C is a
    person who will not wait, and exits at once (the last checkpoint on disk stays intact)."""

    def __init__(self):
        self.signum = None
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signum is None:
            self.signum = signum
        elif signum == signal.SIGINT:
            os.write(2, b"second Ctrl-C: exiting at once; the last checkpoint written is kept\n")
            os._exit(130)

    def __bool__(self):
        return self.signum is not None


class RunControl:
    """Everything the training loop needs besides the algorithm, behind four calls: `stop` (a stop was asked
    for), `check_finite` (after each update), `end_iteration` (what a checkpoint of it holds, the progress
    line, the periodic checkpoint) and `finish` (the last checkpoint, closing, the last line).

    A checkpoint saves the normalisation statistics of the last whole rollout: a dropped partial rollout has
    moved them already (the update does not)."""

    def __init__(self, args, run, agent, optimizer, statistics, envs, writer, device, total_steps, start_iteration,
                 start_step, recent_returns):
        self.args, self.run, self.agent, self.optimizer = args, run, agent, optimizer
        self.envs, self.writer = envs, writer
        self.obs_rms, self.return_rms, self.penalty = statistics
        self.progress = Progress(args.progress, args.progress_interval, total_steps, start_step)
        announce_start(args, run.dir, device, total_steps, start_step)
        self.stop, self.last_saved_at = StopSignals(), time.time()
        self.completed, self.rng, self.stats = start_iteration - 1, rng_states(), self.statistics()
        self.recent = list(recent_returns)

    def statistics(self):
        return {"obs_rms": self.obs_rms.state_dict(), "return_rms": self.return_rms.state_dict(),
                "kl_coef": self.penalty.coef}

    def steps_per_second(self, global_step):
        return self.progress.steps_per_second(global_step)

    def check_finite(self, loss, global_step):
        """A loss that is not finite has ruined the network: stop, keeping the logs that explain it."""
        if not torch.isfinite(loss):
            self.writer.close()
            fail(f"loss became {loss.item()} at step {global_step}; stopping "
                 f"(the last good checkpoint, if any, is left at {self.run.checkpoint})")

    def end_iteration(self, iteration, global_step, recent_returns):
        """After an iteration's update and logs. False when the loop must stop."""
        # What a checkpoint of this iteration holds (a stop drops the partial rollout's episodes too).
        self.completed, self.rng, self.stats = iteration, rng_states(), self.statistics()
        self.recent = list(recent_returns)
        self.progress.update(global_step, recent_returns)
        if self.stop:
            return False
        if checkpoint_due(self.args, iteration, self.last_saved_at):
            self.save(global_step)
            self.last_saved_at = time.time()
        return True

    def save(self, global_step):
        save_checkpoint(self.run.checkpoint, self.agent, self.optimizer, self.stats, self.args, self.run.name,
                        global_step, self.completed, self.rng, self.recent, self.writer)

    def finish(self, global_step, recent_returns):
        self.progress.end_line()
        stopped = bool(self.stop)  # read once: a signal during the teardown below must not claim a checkpoint
        saved_at_end = ends_with_checkpoint(self.args, stopped, self.run.checkpoint)
        completed_steps = self.completed * self.args.num_envs * self.args.num_steps
        if saved_at_end:
            self.save(completed_steps)
        close_run(self.args, self.envs, self.writer)
        if stopped:
            exit_after_signal(self.stop.signum, completed_steps, self.run.checkpoint)
        announce_end(self.progress, global_step, recent_returns, self.run.dir,
                     self.run.checkpoint if saved_at_end else None)


def fmt_duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def counted(n, noun):
    """counted(1, "game") is "1 game", counted(3, "game") "3 games": a summary line reads right for any count."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


class Progress:
    """What a run says while it trains: a live line in a terminal; when stdout is a file (a Slurm log, nohup,
    a sweep's log.txt), a plain line every `interval` seconds, so the log shows the run is alive, how fast it
    goes, what it has reached (`measure` of the last 100 episodes) and when it will be done."""

    def __init__(self, enabled, interval, total_steps, start_step, measure="return"):
        self.live = enabled and sys.stdout.isatty()
        self.plain = enabled and not self.live
        self.interval, self.total_steps, self.measure = interval, total_steps, measure
        self.start_time, self.start_step, self.last_line = time.time(), start_step, None

    def steps_per_second(self, global_step):
        return int((global_step - self.start_step) / max(time.time() - self.start_time, 1e-9))

    def eta(self, global_step):
        """The rest of the budget at the speed so far."""
        done = global_step - self.start_step
        if done <= 0:
            return "-"
        return fmt_duration((self.total_steps - global_step) * (time.time() - self.start_time) / done)

    def line(self, global_step, recent):
        mean = f"{np.mean(recent):.1f}" if recent else "-"
        return (f"step {global_step}/{self.total_steps} ({100 * global_step / self.total_steps:.0f}%)  "
                f"{self.steps_per_second(global_step)} steps/s  {self.measure}(last 100) {mean}  "
                f"elapsed {fmt_duration(time.time() - self.start_time)}  eta {self.eta(global_step)}")

    def update(self, global_step, recent):
        if self.live:
            print(f"\r{self.line(global_step, recent)}   ", end="", flush=True)
        elif self.plain and (self.last_line is None or time.time() - self.last_line >= self.interval):
            self.last_line = time.time()
            print(self.line(global_step, recent), flush=True)

    def end_line(self):
        if self.live:
            print()


def announce_start(args, run_dir, device, steps, start_step):
    """One line that says what the run is doing, for whoever reads its log later."""
    rounded = "" if steps == args.total_timesteps else (
        f" (--total-timesteps {args.total_timesteps} rounded down to whole rollouts of "
        f"{args.num_envs * args.num_steps} steps)")
    resumed = f", resuming at step {start_step}" if start_step else ""
    print(f"{SCRIPT}: {args.env_id}, seed {args.seed}, {steps} steps{rounded} on {device}{resumed}; "
          f"logs in {run_dir}", flush=True)


def announce_end(progress, global_step, recent_returns, run_dir, ckpt_path):
    mean_return = f"{np.mean(recent_returns):.2f}" if recent_returns else "- (no episode ended)"
    saved = f"; checkpoint saved to {ckpt_path}" if ckpt_path else ""
    print(f"{SCRIPT}: done, {global_step} steps in {fmt_duration(time.time() - progress.start_time)} "
          f"({progress.steps_per_second(global_step)} steps/s); return(last 100) {mean_return}; "
          f"logs in {run_dir}{saved}", flush=True)


def open_logs(args, run, resumed_at):
    """The run's TensorBoard writer (and its wandb run, with --track)."""
    if args.track:
        import wandb

        # Patching before init lets finish() return at once instead of waiting on the TensorBoard sync.
        wandb.tensorboard.patch(root_logdir=run.dir)
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=asdict(args),
                   name=run.name, id=run.name, resume="allow", save_code=True,
                   settings=wandb.Settings(quiet=True))  # its summary would bury the run's own lines
    from torch.utils.tensorboard import SummaryWriter

    # On resume, purge_step hides what the interrupted run logged after its checkpoint's step.
    writer = SummaryWriter(run.dir, purge_step=None if resumed_at is None else resumed_at + 1)
    if resumed_at is None:
        # The file's own name first: a changed copy of this script is told apart from it in comparisons.
        settings = {"script": os.path.basename(__file__), **asdict(args)}
        table = "\n".join(f"|{k}|{v}|" for k, v in settings.items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return writer


def ends_with_checkpoint(args, stopped, ckpt_path):
    """A run that checkpoints along the way also ends with one: checkpoint.pt never holds an older policy."""
    return bool(stopped or args.save_model or args.checkpoint_every or args.checkpoint_minutes
                or os.path.isfile(ckpt_path))


def close_run(args, envs, writer):
    """Close what the run opened; the events and the wandb run are complete on disk after this."""
    envs.close()
    writer.close()
    if args.track:
        import wandb

        wandb.finish()


def exit_after_signal(signum, step, ckpt_path):
    """The checkpoint is on disk: say how to go on, and exit non-zero so a caller knows the run is unfinished."""
    print(f"{SCRIPT}: stopped by {signal.Signals(signum).name} at step {step}; checkpoint saved to {ckpt_path}; "
          f"resume with: python {SCRIPT}.py --resume {ckpt_path}", flush=True)
    sys.exit(128 + signum)


def recording_env(env_id, video_dir, every_episode):
    """The env, its episodes recorded as mp4s in video_dir: every one, or gymnasium's 0, 1, 8, 27, ..."""
    # Frames are drawn off-screen; without a display SDL (Pendulum draws with pygame) would otherwise
    # print a misleading "error: XDG_RUNTIME_DIR is invalid or not set" while looking for one.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    camera = {}
    if "mujoco" in str(gym.spec(env_id).entry_point):
        # gymnasium 1.4 renders MuJoCo envs from a free camera that stays where the episode began, so a
        # walker leaves the picture within seconds; the models' own "track" camera follows the body.
        # (A model without one falls back to that same free camera.)
        camera = {"camera_name": "track"}
    env = gym_make_quietly(env_id, render_mode="rgb_array", **camera)
    trigger = (lambda episode: True) if every_episode else None
    return gym.wrappers.RecordVideo(env, video_dir, episode_trigger=trigger, disable_logger=True)


def play_episodes(agent, obs_rms, args, device, video_dir=None):
    """Run the policy without training, with the normalisation statistics frozen as they were saved, yielding
    each episode's return (in the environment's own reward units) and length as it ends. With video_dir, every
    episode is recorded, and one cut short (Ctrl-C) keeps the video of what was played."""
    env = make_env(args.env_id, 0, video_dir is not None, video_dir, every_episode=True)()
    low, high = env.action_space.low, env.action_space.high
    try:
        for episode in range(args.eval_episodes):
            obs, _ = env.reset(seed=args.seed + episode)
            done, total, steps = False, 0.0, 0
            while not done:
                if args.norm_obs:
                    obs = normalize_obs(obs, obs_rms, args.clip_obs)
                obs = torch.as_tensor(obs, dtype=torch.float32, device=device)
                with torch.inference_mode():
                    if args.eval_deterministic:
                        action = agent.actor_mean(obs)
                    else:
                        action = agent.get_action_and_value(obs[None])[0][0]
                obs, reward, terminated, truncated, _ = env.step(np.clip(action.cpu().numpy(), low, high))
                total, steps = total + float(reward), steps + 1
                done = terminated or truncated
            yield total, steps
    finally:
        env.close()


def sigterm_as_interrupt(signum, frame):
    """During --eval-checkpoint, SIGTERM stops the evaluation where it is, as Ctrl-C does."""
    raise KeyboardInterrupt("SIGTERM")


def evaluate_checkpoint(args, ckpt, obs_size, action_size, obs_rms, device):
    """--eval-checkpoint: play the saved policy, with the saved statistics, a line per episode, and print mean +-
    std of its returns. Ctrl-C or SIGTERM stops it with the mean of the episodes played whole."""
    for name in ("norm_obs", "clip_obs"):  # the policy must see observations as it was trained
        setattr(args, name, ckpt["args"][name])
    agent = Agent(obs_size, action_size).to(device)
    agent.load_state_dict(ckpt["model"])
    video_dir = f"videos/{ckpt['run_name']}/eval-at-step-{ckpt['global_step']}"
    video_dir = unused_folder(video_dir) if args.capture_video else None
    torch.manual_seed(args.seed)  # sampled actions (--no-eval-deterministic) follow --seed, as the starts do
    returns, stopped_by = [], None
    on_sigterm = signal.signal(signal.SIGTERM, sigterm_as_interrupt)  # `kill`, Slurm's time limit: as Ctrl-C
    try:
        for episode_return, steps in play_episodes(agent, obs_rms, args, device, video_dir):
            returns.append(episode_return)
            print(f"episode {len(returns)}/{args.eval_episodes}: {episode_return:.2f} in {steps} steps", flush=True)
    except KeyboardInterrupt as interrupt:  # a person who wants the episodes played so far, not a traceback
        stopped_by = str(interrupt) or "Ctrl-C"
        print(f"stopped by {stopped_by} with {len(returns)} of {counted(args.eval_episodes, 'episode')} "
              "played whole: only those count", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, on_sigterm)
    mode = "deterministic" if args.eval_deterministic else "sampled"
    if returns:
        print(f"{args.env_id}: {np.mean(returns):.2f} +- {np.std(returns):.2f} "
              f"over {counted(len(returns), 'episode')} ({mode}) of the policy at step {ckpt['global_step']}")
    if video_dir:
        print(f"videos of the episodes played in {video_dir}" if stopped_by else
              f"videos of the {counted(len(returns), 'episode')} in {video_dir}")
    if stopped_by:  # 128 + the signal's number, as the shell reports a process that the signal ended
        sys.exit(128 + (signal.SIGTERM if stopped_by == "SIGTERM" else signal.SIGINT))


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------


def main():
    check_flags(sys.argv[1:])
    args = tyro.cli(Args)
    check_args(args)
    check_tracking(args)
    args.resume, args.eval_checkpoint = checkpoint_file(args.resume), checkpoint_file(args.eval_checkpoint)
    ckpt = load_checkpoint(args.eval_checkpoint or args.resume, args) if args.eval_checkpoint or args.resume else None
    if ckpt is not None:
        args.env_id = ckpt["args"]["env_id"]
    if args.capture_video:
        os.environ.setdefault("MUJOCO_GL", "egl")  # render without a display
    obs_size, action_size = check_env(args.env_id)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")
    obs_rms, return_rms = RunningMeanStd((obs_size,)), RunningMeanStd()
    if ckpt is not None:
        restore_statistics(ckpt, obs_size, obs_rms, return_rms)
    if args.eval_checkpoint:
        return evaluate_checkpoint(args, ckpt, obs_size, action_size, obs_rms, device)
    if ckpt is not None:
        merge_resumed_args(args, ckpt)
    train(args, ckpt, obs_size, action_size, obs_rms, return_rms, device)


if __name__ == "__main__":
    main()
