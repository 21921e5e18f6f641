"""PPO for Atari games from pixels (BreakoutNoFrameskip-v4, PongNoFrameskip-v4, ALE/Breakout-v5, ...).

One file, read top to bottom: the settings, the math as small pure functions, the Atari preprocessing (one
small wrapper per detail) and the environment, the network, and the training loop in `train()`: the algorithm,
followed by the PPO paper's KL penalty (off by default), its math and its beta. Then, below one banner, the
operations a long run needs (input checks, checkpoints and resume, stop signals, progress lines, evaluation,
torchrun, the faster env paths), and a thin `main()`. Tags like `[core-5]` and `[atari-3]` name the
implementation details of Huang et al., "The 37 Implementation Details of PPO" (2022); search for them.

    python ppo_atari.py --env-id BreakoutNoFrameskip-v4 --seed 1
    python ppo_atari.py --bf16                       # bfloat16 forward passes: faster where the hardware has it
    python ppo_atari.py --help
"""


import atexit
import contextlib
import difflib
import json
import ctypes
import math
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Literal, Optional

# Torch's CPU threads sleep, not spin, while they wait for each other: beside another busy process a spinning
# thread holds the core its partner needs (benchmarks/results/throughput). OpenMP reads it when torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import ale_py
import cv2
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro

gym.register_envs(ale_py)
SCRIPT = "ppo_atari"
NOOP_MAX, FRAME_SKIP, SCREEN_SIZE, FRAME_STACK = 30, 4, 84, 4


@dataclass
class Args:
    # --- the algorithm (a resumed run keeps these from its checkpoint, and exp_name and seed) ---
    env_id: str = "BreakoutNoFrameskip-v4"
    """gymnasium id of an Atari game: *NoFrameskip-v4, ALE/*-v5, ..."""
    env_path: Literal["wrappers", "ale-vector"] = "wrappers"
    ("wrappers: the preprocessing written in this file, the reference; ale-vector: ale-py's multithreaded vector "
     "env with the same details by name but not all the same behaviour (no FIRE after a lost life: see "
     "make_ale_vector_env), for where stepping the games is the bottleneck")
    repeat_action_probability: Optional[float] = None
    ("sticky actions: chance the emulator repeats the previous action, per frame (None: the id's own, 0 for "
     "*NoFrameskip-v4, 0.25 for ALE/*-v5)")
    total_timesteps: int = 10_000_000
    """total agent steps across all envs (one step is 4 frames)"""
    learning_rate: float = 2.5e-4
    """initial learning rate of Adam"""
    num_envs: int = 8
    """environments stepped together"""
    num_steps: int = 128
    """steps per env in each rollout"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """lambda of generalized advantage estimation"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 4
    """passes over each rollout"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_policy: bool = True
    ("clip the policy's surrogate objective; --no-clip-policy optimises the plain ratio * advantage (the value loss "
     "keeps its own clipping: --clip-vloss, within +-clip_coef)")
    clip_coef: float = 0.1
    """clipping coefficient of the surrogate objective, and of the value loss (--clip-vloss)"""
    anneal_clip: bool = False
    """anneal the clipping coefficient linearly to 0, like the learning rate"""
    clip_vloss: bool = True
    """clip the value loss"""
    ent_coef: float = 0.01
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
    bootstrap_truncation: bool = True
    ("bootstrap time-limit truncations (108k frames) with V(final obs); --no-bootstrap-truncation treats them as "
     "terminations, exactly like openai/baselines ppo2 and CleanRL")
    bf16: bool = False
    ("run the network's forward passes in bfloat16 under torch.autocast (the weights, gradients, losses and Adam "
     "stay float32): faster where the hardware has bfloat16 arithmetic (AVX-512 BF16, AMX, recent GPUs); how it "
     "learns: benchmarks/results/atari_bf16")

    # --- experiment ---
    exp_name: str = SCRIPT
    """name of this experiment, part of the run name"""
    seed: int = 1
    """seed of the run: same seed on CPU, same curve (either env path; on one CPU model: see README)"""
    torch_deterministic: bool = True
    """make cuDNN deterministic (only matters with --cuda)"""
    cuda: bool = True
    """train on the GPU if there is one, else on the CPU (the start line says which)"""
    threads: Optional[int] = None
    ("torch CPU threads; default: torch's own (OMP_NUM_THREADS, else the CPUs this process may use); "
     "benchmarks/sweep.sh sets OMP_NUM_THREADS to each run's CPUs (1 in a local sweep: one seed per core)")
    async_envs: bool = False
    ("step the wrappers' envs in parallel worker processes (gymnasium's AsyncVectorEnv, one per env) instead of one "
     "after another in this process: the same games, the same run. For machines with cores to spare beside the "
     "network (a GPU run); on a CPU the workers compete with the update for the cores "
     "(benchmarks/results/throughput)")
    track: bool = False
    """log to Weights & Biases (works offline with WANDB_MODE=offline)"""
    wandb_project_name: str = "ppo-reference"
    """the wandb project"""
    wandb_entity: Optional[str] = None
    """the wandb entity (team)"""
    capture_video: bool = False
    ("record mp4s of whole games under videos/{run_name}: in training env 0's games 0, 1, 8, 27, 64, ... "
     "(gymnasium's schedule: the cubes up to 1000, then every 1000th; needs --env-path wrappers); with "
     "--eval-checkpoint every evaluated game")
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
    """evaluate this checkpoint instead of training, and print mean +- std of the game scores"""
    eval_episodes: int = 10
    """whole games (all lives) to play in evaluation"""
    eval_deterministic: bool = True
    """evaluate with the most likely action (--no-eval-deterministic samples from the policy)"""


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


# [aux-2] Under torchrun, init_distributed puts normalize_over_processes in this one's place.
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


def categorical(logits, action=None):
    """(action, sampled unless given; its log-prob; entropy) of a categorical policy: torch's Categorical's
    arithmetic, written out so that a rollout step does not build that object."""
    log_probs = logits - logits.logsumexp(-1, keepdim=True)
    if action is None:
        action = torch.multinomial(log_probs.softmax(-1), 1, True).squeeze(-1)
    logprob = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    # probs after the gather, as Categorical orders them, so backward sums gradients in the same order; a
    # log-prob of -inf (an underflowed probability) is clamped so that it adds 0 * finite to the entropy.
    probs = log_probs.softmax(-1)
    entropy = -(log_probs.clamp(min=torch.finfo(log_probs.dtype).min) * probs).sum(-1)
    return action, logprob, entropy


# ----------------------------------------------------------------------------------------------
# Atari preprocessing: one wrapper per detail
# ----------------------------------------------------------------------------------------------


class NoopReset(gym.Wrapper):
    """[atari-1] 1..30 no-op frames after a reset, so that games do not all start from the same state."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.unwrapped.np_random.integers(1, NOOP_MAX + 1)):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """[atari-2] Repeat the action 4 frames, sum the rewards, and return the pixel-wise max of the last
    two frames: the Atari draws some sprites only every other frame, and the max shows them all."""

    def step(self, action):
        total, last_two = 0.0, []
        for _ in range(FRAME_SKIP):
            obs, reward, terminated, truncated, info = self.env.step(action)
            last_two = last_two[-1:] + [obs]
            total += reward
            if terminated or truncated:
                break
        return np.maximum(last_two[0], last_two[-1]), total, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """[atari-3] A lost life ends the learner's episode (terminated: no bootstrapping past it, so the value
    learns that losing a life costs the rest of it), but the game goes on: the next reset is a no-op step,
    and only a real game over resets the game."""

    def __init__(self, env):
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.unwrapped.ale.lives()
        terminated = terminated or 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        self.lives, self.game_over = self.unwrapped.ale.lives(), False
        return obs, info


class FireReset(gym.Wrapper):
    """[atari-4] Press FIRE (then action 2, as baselines does) after every reset, including the one after a lost
    life: in games like Breakout nothing happens until FIRE, and a random policy would waste most of its steps
    finding it."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class WarpFrame(gym.ObservationWrapper):
    """[atari-5] Grayscale, resized to 84x84: colour and full resolution cost compute and add little."""

    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, (SCREEN_SIZE, SCREEN_SIZE), np.uint8)

    def observation(self, frame):
        gray = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
        return cv2.resize(gray, (SCREEN_SIZE, SCREEN_SIZE), interpolation=cv2.INTER_AREA)


class ClipReward(gym.RewardWrapper):
    """[atari-6] Reward clipped to its sign, so one set of hyperparameters fits games whose scores differ by
    orders of magnitude. Only the learner sees it: the game score is recorded below this wrapper."""

    def reward(self, reward):
        return float(np.sign(reward))


def make_env(env_id, idx, capture_video, video_dir, repeat_action_probability, every_game=False):
    def thunk():
        # frameskip=1 for every ALE id: MaxAndSkip below does the skipping, with the max over two frames.
        # rgb_array frames come from the emulator's screen buffer, not SDL: no display is looked for.
        env = gym.make(env_id, frameskip=1, repeat_action_probability=repeat_action_probability,
                       render_mode="rgb_array" if capture_video and idx == 0 else None)
        if capture_video and idx == 0:
            env = record_games(env, video_dir, every_game)  # --capture-video films env 0
        # The real game score: below the life-loss and reward-clip wrappers, it sums every raw reward of a
        # whole game and reports it once, at game over (episodic_length is then in frames, as in CleanRL).
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = NoopReset(env)
        env = MaxAndSkip(env)
        env = EpisodicLife(env)
        if env.unwrapped.get_action_meanings()[1:2] == ["FIRE"]:
            env = FireReset(env)
        env = WarpFrame(env)
        env = ClipReward(env)
        # [atari-7] The last 4 frames, oldest first: one frame shows no motion, four show direction and speed.
        return gym.wrappers.FrameStackObservation(env, FRAME_STACK)

    return thunk


# ----------------------------------------------------------------------------------------------
# The network
# ----------------------------------------------------------------------------------------------


def layer_init(layer, gain=np.sqrt(2), bias=0.0):
    """[core-2] Orthogonal weights with the given gain, constant bias."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


class Agent(nn.Module):
    def __init__(self, n_actions):
        super().__init__()
        # [atari-8] One Nature-CNN trunk shared by policy and value (replaces core-13's separate MLPs):
        # learning features from pixels is the expensive part, and both heads need the same ones.
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(FRAME_STACK, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )
        # [core-2] Policy output gain 0.01: near-uniform action probabilities at the start; value gain 1.
        self.actor = layer_init(nn.Linear(512, n_actions), gain=0.01)
        self.critic = layer_init(nn.Linear(512, 1), gain=1.0)
        # Channels-last weights and inputs: faster CPU convolution kernels, the same arithmetic.
        self.to(memory_format=torch.channels_last)

    def features(self, obs):
        # [atari-9] Pixels are stored as uint8 (4x smaller rollouts) and scaled to [0, 1] only here. The copy
        # (never the caller's tensor) keeps the layout: for the rollout buffer's channels-last minibatches,
        # contiguous() is then free.
        pixels = obs.to(torch.float32, copy=True).div_(255.0)
        return self.network(pixels.contiguous(memory_format=torch.channels_last))

    # The heads' outputs as float32 (a no-op unless --bf16): log-probs and the losses need its precision.
    def get_value(self, obs):
        return self.critic(self.features(obs)).squeeze(-1).float()

    def logits(self, obs):
        return self.actor(self.features(obs)).float()

    def get_action_and_value(self, obs, action=None):
        hidden = self.features(obs)
        action, logprob, entropy = categorical(self.actor(hidden).float(), action)
        return action, logprob, entropy, self.critic(hidden).squeeze(-1).float()

    def act(self, obs, greedy):
        logits = self.logits(obs)
        return logits.argmax(-1) if greedy else categorical(logits)[0]


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def train(args, ckpt, device):
    """PPO: collect a rollout of num_envs x num_steps, compute advantages, then epochs of minibatch updates;
    repeat until total_timesteps. `ckpt` is the checkpoint to resume from, or None. Under torchrun this is one
    process's share of the run ([aux-2]: its envs, its slice of every minibatch, gradients averaged)."""
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size  # whole rollouts: a remainder is not trained
    run = open_run(args, ckpt, num_iterations)
    if run is None:
        return  # a finished run: nothing to train
    num_envs, first_env = envs_of_this_process(args.num_envs)  # [aux-2] all of them in one process
    local_batch_size, local_minibatch_size = batch_size // WORLD_SIZE, minibatch_size // WORLD_SIZE

    # Seeding: torch draws every action and shuffle; each env has its own generator, seeded with seed + its
    # index at its first reset. Nothing uses python's or numpy's global generators, so a checkpoint skips them.
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # Before the envs: --async-envs workers inherit its signal handlers.
    control = RunControl(args, run, device, num_iterations * batch_size, ckpt["global_step"] if ckpt else 0)
    # [core-1] N envs stepped together (this process's share of them under torchrun).
    envs = make_training_envs(args, num_envs, first_env, run.video_dir)
    init_distributed(device)  # [aux-2] after the envs: --async-envs forks before the process group has threads
    obs_shape, n_actions = envs.single_observation_space.shape, int(envs.single_action_space.n)

    agent = Agent(n_actions).to(device)
    # [core-3] Adam with epsilon 1e-5 (ppo2's value, not PyTorch's default 1e-8). The fused kernel does
    # Adam's update in one call per step instead of one per tensor (it rounds differently in the last bit).
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    start_iteration, global_step, returns_so_far = restore_checkpoint(ckpt, agent, optimizer) if ckpt else (1, 0, [])
    seed_this_process(args, start_iteration)  # [aux-2] the same initial network, actions drawn independently
    penalty = KLPenalty(args, ckpt)
    writer = open_logs(args, run, resumed_at=global_step if ckpt else None)
    # --bf16: the network's forward passes under bfloat16 autocast; a context that does nothing otherwise.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()

    # Rollout storage, allocated once; [atari-9] observations stay uint8 (8x128x4x84x84 bytes = 29 MB),
    # laid out channels-last (frames innermost) as the network wants them; indexed as (step, env, frame, y, x).
    frames, height, width = obs_shape
    obs = torch.zeros((args.num_steps, num_envs, height, width, frames), dtype=torch.uint8, device=device)
    obs = obs.permute(0, 1, 4, 2, 3)
    actions = torch.zeros((args.num_steps, num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, num_envs), device=device)
    # Rewards and dones, numpy from the envs to GAE's loop.
    rewards = np.zeros((args.num_steps, num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, num_envs), dtype=np.float32)
    values = torch.zeros((args.num_steps, num_envs), device=device)

    seed = args.seed + (start_iteration - 1) * args.num_envs  # a resumed run starts fresh games
    next_obs_np, _ = envs.reset(seed=seed + first_env)  # env i gets seed + i on both paths
    next_obs = torch.as_tensor(next_obs_np, device=device)
    recent_returns = deque(returns_so_far, maxlen=100)  # carried over a resume, so the run's last 100 are its own
    control.start(agent, optimizer, penalty, envs, writer, start_iteration, global_step, recent_returns)

    for iteration in range(start_iteration, num_iterations + 1):
        # [core-4] Learning rate annealed linearly to 0; [aux-1] optionally the clip range too.
        frac = 1.0 - (iteration - 1.0) / num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef

        # --- rollout ---
        games = []
        for step in range(args.num_steps):
            if control.stop:
                break  # a partial rollout is dropped: the checkpoint keeps the last whole iteration
            global_step += args.num_envs
            obs[step] = next_obs
            with torch.inference_mode(), autocast:
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            actions[step], logprobs[step], values[step] = action, logprob, value

            next_obs_np, reward, terminated, truncated, info = envs.step(action.cpu().numpy())
            truncated = truncated & ~terminated
            if args.bootstrap_truncation and truncated.any():
                final_obs = torch.as_tensor(np.stack(info["final_obs"][truncated]), device=device)
                final_values = np.zeros(num_envs)
                with torch.inference_mode(), autocast:
                    final_values[truncated] = agent.get_value(final_obs).cpu().numpy()
                reward = bootstrap_truncated(reward, truncated, final_values, args.gamma)
            rewards[step] = reward
            dones[step] = terminated | truncated
            next_obs = torch.as_tensor(next_obs_np, device=device)

            games += [(global_step, score, length) for _, score, length in finished_games(info)]
        if control.stopping():
            break
        # The game score, not the learner's life-long, clipped episodes (see make_env); of every process's envs.
        for step_logged, score, length in games_of_every_process(games):
            recent_returns.append(score)
            writer.add_scalar("charts/episodic_return", score, step_logged)
            writer.add_scalar("charts/episodic_length", length, step_logged)

        # --- advantages ---
        with torch.inference_mode(), autocast:
            last_value = agent.get_value(next_obs)
        advantages, returns = compute_gae(torch.from_numpy(rewards), values, torch.from_numpy(dones), last_value,
                                          args.gamma, args.gae_lambda)

        # --- flatten the batch ---
        b_obs = obs.reshape((local_batch_size,) + obs_shape)
        b_actions, b_logprobs = actions.reshape(-1), logprobs.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        with autocast:
            old_policy = penalty.old_policy(agent, b_obs) if penalty.on else None  # [kl-1]

        # --- epochs of minibatch updates ---
        clipfracs = []
        for epoch in range(args.update_epochs):
            # [core-6] Each epoch shuffles all samples and splits them into minibatches that cover all.
            order = torch.randperm(local_batch_size, device=device)
            for start in range(0, local_batch_size, local_minibatch_size):
                mb = order[start:start + local_minibatch_size]
                with autocast:
                    _, new_logprob, entropy, new_value = agent.get_action_and_value(b_obs[mb], b_actions[mb])
                    kl = penalty.kl(agent, b_obs[mb], old_policy[mb]) if penalty.on else None
                loss, metrics = ppo_loss(new_logprob, entropy, new_value, b_logprobs[mb], b_values[mb],
                                         b_advantages[mb], b_returns[mb], clip_coef, args, kl, penalty.coef)
                clipfracs.append(metrics["clipfrac"])

                optimizer.zero_grad()
                loss.backward()
                average_gradients(agent)  # [aux-2] the whole minibatch's gradient, on every process
                # [core-11] Global gradient-norm clipping.
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            # [aux-3] Optional early stop once the policy has moved too far from the rollout policy.
            if args.target_kl is not None and mean_over_processes(metrics["approx_kl"]) > args.target_kl:
                break
        control.check_finite(loss, global_step)
        if penalty.on:  # [kl-1] the batch's mean KL after the update, over every process's share, moves beta
            with torch.no_grad(), autocast:
                mean_kl = mean_over_processes(penalty.kl(agent, b_obs, old_policy).mean()).item()
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


def categorical_kl(old_logits, new_logits):
    """[kl-1] KL[Cat(old) || Cat(new)], exact: the sum over actions of p_old * (log p_old - log p_new)."""
    old_log_probs = old_logits - old_logits.logsumexp(-1, keepdim=True)
    new_log_probs = new_logits - new_logits.logsumexp(-1, keepdim=True)
    return (old_log_probs.exp() * (old_log_probs - new_log_probs)).sum(-1)


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
        """The rollout policy's logits on the batch, taken before the update moves them."""
        with torch.no_grad():
            return agent.logits(obs)

    @staticmethod
    def kl(agent, obs, old_logits):
        """KL[old || current policy] on each observation, with gradients to the current policy."""
        return categorical_kl(old_logits, agent.logits(obs))

    def update(self, mean_kl):
        if self.target is not None:
            self.coef = adapt_kl_coef(self.coef, mean_kl, self.target)


# ==============================================================================================
# Operations: input checks, checkpoints and resume, stop signals, progress, logs, evaluation, torchrun, env speed paths
# ==============================================================================================


# ale-py prints its banner to stderr for every emulator it starts; errors still show.
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
# [aux-2] Under torchrun every process learns its place from these; a plain `python ppo_atari.py` is rank 0 of 1.
RANK, LOCAL_RANK, WORLD_SIZE = (int(os.environ.get(k, d)) for k, d in
                                (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))
# Fields a resumed run takes from its checkpoint and must not change; the others (logging) may change.
_FIELD_NAMES = [f.name for f in fields(Args)]
HYPERPARAMETERS = _FIELD_NAMES[:_FIELD_NAMES.index("exp_name")] + ["exp_name", "seed"]
# Settings added since checkpoints were first written, at the values that behave as the script did before them:
# an older checkpoint resumes and evaluates with these.
ADDED_SETTINGS = {"clip_policy": True, "kl_penalty": None, "kl_penalty_target": None, "bf16": False}
# A resumed run keeps checkpointing as the run it continues did, unless the command line says otherwise.
CHECKPOINT_SETTINGS = ["save_model", "checkpoint_every", "checkpoint_minutes"]
# Flags that were renamed, so that the old name says what it is now.
RENAMED_FLAGS = {"eval-greedy": "eval-deterministic"}
# One range of seeds for all three scripts: env i is seeded with seed + i (a resumed run's with more), and
# ppo_atari.py's ale-py vector env takes 32-bit seeds.
MAX_SEED = 2**30
# How long a process other than rank 0 waits, on bad input, for rank 0 to say it and end the run (fail).
OTHER_RANKS_FAIL_AFTER_S = 30


def fail(message):
    """Bad input ends the program with one line and no traceback. Under torchrun every process checks the same
    input and rank 0 says it; the others wait for it, as torchrun ends every process once one exits, and rank 0
    may reach the check last on a busy machine. An error that rank 0 did not share (a node with fewer GPUs) is
    said by its own rank, after the wait."""
    if RANK != 0:
        time.sleep(OTHER_RANKS_FAIL_AFTER_S)  # rank 0's exit on the same error has torchrun end this process
        message = f"on rank {RANK}: {message}"
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_env(env_id):
    """Fail early unless env_id is an ALE game with pixel observations; point other envs to their script."""
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as e:
        fail(f"unknown env id '{env_id}': {e}")
    if "mujoco" in str(spec.entry_point):  # told apart from its spec, without loading (and warning about) MuJoCo
        fail(f"{env_id} is not an Atari game: it is a MuJoCo env with continuous actions, use ppo_continuous.py")
    if spec.entry_point != "ale_py.env:AtariEnv":
        # Made once to name the right script, inside a scratch folder: MuJoCo's model compiler drops a
        # MUJOCO_LOG.TXT into the working directory, and a rejected id must leave nothing behind.
        with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
            try:
                env = gym.make(env_id)
                continuous = isinstance(env.action_space, gym.spaces.Box)
                env.close()
            except Exception as e:  # a missing dependency (Box2D, ...) can fail in many ways
                fail(f"{env_id} is not an Atari game, and cannot be made here either: {type(e).__name__}: {e}")
        fail(f"{env_id} is not an Atari game: use {'ppo_continuous.py' if continuous else 'ppo_discrete.py'}")
    if spec.kwargs.get("obs_type", "rgb") != "rgb":
        fail(f"{env_id} observes {spec.kwargs['obs_type']}; this script needs the screen (obs_type rgb)")


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

    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes"):
        need(name, getattr(args, name) >= 1, ">= 1")
    if args.threads is not None:
        need("threads", args.threads >= 1, ">= 1 (or not given: torch's default)")
    need("seed", 0 <= args.seed <= MAX_SEED, f"in [0, {MAX_SEED}]")
    need("checkpoint_every", args.checkpoint_every >= 0, ">= 0")
    for name in ("checkpoint_minutes", "progress_interval", "ent_coef"):
        need(name, math.isfinite(getattr(args, name)) and getattr(args, name) >= 0, ">= 0")
    for name in ("learning_rate", "clip_coef", "vf_coef", "max_grad_norm"):
        need(name, math.isfinite(getattr(args, name)) and getattr(args, name) > 0, "> 0")
    for name in ("gamma", "gae_lambda"):
        need(name, 0 <= getattr(args, name) <= 1, "in [0, 1]")
    for name in ("target_kl", "kl_penalty_target"):
        if getattr(args, name) is not None:
            need(name, math.isfinite(getattr(args, name)) and getattr(args, name) > 0, "> 0 (or not given)")
    if args.kl_penalty is not None:
        need("kl_penalty", math.isfinite(args.kl_penalty) and args.kl_penalty >= 0, ">= 0 (or not given)")
    if args.kl_penalty == 0 and args.kl_penalty_target is not None:  # halving and doubling keep a beta of 0
        fail("--kl-penalty 0 with --kl-penalty-target would stay 0: start the adapted beta above 0 (default 1)")
    if args.repeat_action_probability is not None:  # a probability, per frame
        need("repeat_action_probability", 0 <= args.repeat_action_probability <= 1,
             "in [0, 1] (or not given: the id's own)")
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
    if args.async_envs and args.env_path != "wrappers":
        fail(f"--async-envs steps the wrappers' envs in worker processes, but this run's --env-path is ale-vector"
             f"{' (from its checkpoint)' if args.resume else ''}, which has threads of its own: drop --async-envs")
    if args.async_envs and "fork" not in multiprocessing.get_all_start_methods():
        fail("--async-envs forks its env workers, and this platform cannot fork: drop --async-envs")
    # Evaluation always plays through the wrappers, so it can record whichever path trained the policy.
    if args.capture_video and args.env_path != "wrappers" and not args.eval_checkpoint:
        fail("--capture-video records env 0 through the wrappers: use it with --env-path wrappers")


def check_split_across_processes(args):
    """[aux-2] For training under torchrun, with the settings it will run (a resumed run's are the checkpoint's)."""
    if args.num_envs % WORLD_SIZE or (args.num_envs // WORLD_SIZE * args.num_steps) % args.num_minibatches:
        fail(f"--num-envs {args.num_envs} must split evenly across the {WORLD_SIZE} torchrun processes, and each "
             f"process's share of a rollout into {args.num_minibatches} minibatches: choose --num-envs a multiple "
             f"of {WORLD_SIZE} (and --num-minibatches that divides num_envs / {WORLD_SIZE} * num_steps)")


def check_gpus_per_process(device):
    """[aux-2] One GPU per process on this machine."""
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if device.type == "cuda" and local_processes > torch.cuda.device_count():
        fail(f"{local_processes} processes on this machine but {torch.cuda.device_count()} GPUs: use "
             f"--nproc-per-node {torch.cuda.device_count()}, or --no-cuda")


def check_bf16(args, device):
    """--bf16 pays only where the hardware has bfloat16 arithmetic: a GPU without it is refused, and a CPU
    without it gets a note (autocast still runs there, emulated, slower than float32)."""
    if not args.bf16:
        return
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        fail(f"--bf16: {torch.cuda.get_device_name(device)} has no bfloat16 arithmetic: drop --bf16")
    if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported() and RANK == 0:
        print("note: --bf16 on a CPU without bfloat16 arithmetic (AVX-512 BF16, AMX) runs emulated, slower than "
              "float32", flush=True)


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
        name = new_run_name(args) if RANK == 0 else "(rank 0's)"  # [aux-2] rank 0 alone writes the run's files
        return Run(name, os.path.join("runs", name), f"videos/{name}")
    if ckpt["iteration"] >= num_iterations:
        if RANK == 0:
            print(f"{ckpt['run_name']} already finished ({ckpt['global_step']} of {args.total_timesteps} steps): "
                  f"nothing to train. To train longer, start a new run with a larger --total-timesteps.")
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


def save_checkpoint(path, agent, optimizer, kl_coef, args, run_name, global_step, iteration, rng, recent_returns=(),
                    writer=None):
    """Write atomically (a temporary file, synced, then renamed over the old one): a kill at any moment,
    even during the write, leaves the previous checkpoint intact. The logs are flushed first, so everything
    up to the checkpoint's step is on disk when the checkpoint says it was done. [aux-2] One run, one
    checkpoint: rank 0 writes it (every process holds the same parameters)."""
    if RANK != 0:
        return
    if writer is not None:
        writer.flush()
    ckpt = {
        "script": SCRIPT, "args": asdict(args), "run_name": run_name, "model": agent.state_dict(),
        "kl_coef": kl_coef, "optimizer": optimizer.state_dict(), "global_step": global_step, "iteration": iteration,
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


def rng_states():
    """The generators a run draws from, as a checkpoint keeps them. Taken at the end of each iteration: a stop
    drops a partial rollout whose actions have already drawn from them, and a resumed run must go on as an
    uninterrupted one would from that iteration, wherever in the next one the signal came (under torchrun: rank
    0's, see seed_this_process)."""
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
    the loop looks at it between env steps and after each update, then writes a checkpoint and exits. Python
    runs the handler in the main thread whichever thread the signal lands on (ale-vector steps games in C++
    threads), as soon as the current env step returns. Slurm signals every process of a job, so repeats are
    ignored while the stop is under way; a second Ctrl-C is a person who will not wait, and exits at once
    (the last checkpoint on disk stays intact). --async-envs workers, forked after this, inherit the handler
    and ignore the signals, so that a signal to the whole process group cannot cut a step short: this process
    closes them after its checkpoint, or kills them (kill_env_workers) if it ends otherwise."""

    def __init__(self):
        self.signum, self.pid = None, os.getpid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if os.getpid() != self.pid:
            return  # an env worker
        if self.signum is None:
            self.signum = signum
        elif signum == signal.SIGINT:
            os.write(2, b"second Ctrl-C: exiting at once; the last checkpoint written is kept\n")
            os._exit(130)

    def __bool__(self):
        return self.signum is not None


class RunControl:
    """Everything the training loop needs besides the algorithm, behind a few calls: `stop` (a stop was asked
    for, in this process), `stopping` (in any process: all stop together), `check_finite` (after each update),
    `end_iteration` (what a checkpoint of it holds, the progress line, the periodic checkpoint) and `finish`
    (the last checkpoint, closing, the last line). Made before the envs, whose workers inherit its signal
    handlers; `start` hands it what the run trains, just before the loop."""

    def __init__(self, args, run, device, total_steps, start_step):
        self.args, self.run, self.device, self.total_steps = args, run, device, total_steps
        # Said before a stop can be handled, so a log that says where a run stopped also says where it started
        # (sweep.sh requeues a Slurm task only if its run moved on).
        announce_start(args, run.dir, device, total_steps, start_step)
        self.stop = StopSignals()

    def start(self, agent, optimizer, penalty, envs, writer, start_iteration, start_step, recent_returns):
        self.agent, self.optimizer, self.penalty, self.envs, self.writer = agent, optimizer, penalty, envs, writer
        self.progress = Progress(self.args.progress and RANK == 0, self.args.progress_interval, self.total_steps,
                                 start_step, measure="score")
        self.last_saved_at, self.completed, self.rng = time.time(), start_iteration - 1, rng_states()
        self.recent = list(recent_returns)

    def stopping(self):
        return any_process(self.stop, self.device)

    def steps_per_second(self, global_step):
        return self.progress.steps_per_second(global_step)

    def check_finite(self, loss, global_step):
        """A loss that is not finite has ruined the network: stop, keeping the logs that explain it."""
        if any_process(not torch.isfinite(loss), self.device):  # [aux-2] on any process: all stop
            self.writer.close()
            fail(f"the loss is not finite at step {global_step}; stopping "
                 f"(the last good checkpoint, if any, is left at {self.run.checkpoint})")

    def end_iteration(self, iteration, global_step, recent_returns):
        """After an iteration's update and logs. False when the loop must stop."""
        check_in_sync(self.agent, global_step)
        # What a checkpoint of this iteration holds.
        self.completed, self.rng, self.recent = iteration, rng_states(), list(recent_returns)
        self.progress.update(global_step, recent_returns)
        if self.stopping():
            return False
        if checkpoint_due(self.args, iteration, self.last_saved_at):
            self.save(global_step)
            self.last_saved_at = time.time()
        return True

    def save(self, global_step):
        save_checkpoint(self.run.checkpoint, self.agent, self.optimizer, self.penalty.coef, self.args, self.run.name,
                        global_step, self.completed, self.rng, self.recent, self.writer)

    def finish(self, global_step, recent_returns):
        self.progress.end_line()
        stopped = self.stopping()
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


def describe_device(device, asked_for_cuda):
    """The device in words, so that a run which fell back to the CPU says so."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    threads = torch.get_num_threads()
    return f"cpu, {threads} thread{'s' if threads > 1 else ''}" + (" (no GPU found)" if asked_for_cuda else "")


def announce_start(args, run_dir, device, steps, start_step):
    """One line that says what the run is doing, for whoever reads its log later (rank 0 speaks for the run)."""
    if RANK != 0:
        return
    rounded = "" if steps == args.total_timesteps else (
        f" (--total-timesteps {args.total_timesteps} rounded down to whole rollouts of "
        f"{args.num_envs * args.num_steps} steps)")
    resumed = f", resuming at step {start_step}" if start_step else ""
    processes = f" x {WORLD_SIZE} processes" if WORLD_SIZE > 1 else ""
    print(f"{SCRIPT}: {args.env_id}, seed {args.seed}, {steps} steps{rounded} on "
          f"{describe_device(device, args.cuda)}{processes}{resumed}; logs in {run_dir}", flush=True)


def announce_end(progress, global_step, recent_scores, run_dir, ckpt_path):
    if RANK != 0:
        return
    mean_score = f"{np.mean(recent_scores):.2f}" if recent_scores else "- (no game ended)"
    saved = f"; checkpoint saved to {ckpt_path}" if ckpt_path else ""
    print(f"{SCRIPT}: done, {global_step} steps in {fmt_duration(time.time() - progress.start_time)} "
          f"({progress.steps_per_second(global_step)} steps/s); score(last 100) {mean_score}; "
          f"logs in {run_dir}{saved}", flush=True)


def open_logs(args, run, resumed_at):
    """The run's TensorBoard writer (and its wandb run, with --track), on rank 0; other ranks log nothing."""
    if args.track and RANK == 0:
        import wandb

        # Patching before init lets finish() return at once instead of waiting on the TensorBoard sync.
        wandb.tensorboard.patch(root_logdir=run.dir)
        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=asdict(args),
                   name=run.name, id=run.name, resume="allow", save_code=True,
                   settings=wandb.Settings(quiet=True))  # its summary would bury the run's own lines
    from torch.utils.tensorboard import SummaryWriter

    # On resume, purge_step hides what the interrupted run logged after its checkpoint's step.
    purge_step = None if resumed_at is None else resumed_at + 1
    writer = SummaryWriter(run.dir, purge_step=purge_step) if RANK == 0 else NoLogs()
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
    if args.track and RANK == 0:
        import wandb

        wandb.finish()
    if WORLD_SIZE > 1:
        # [aux-2] Together: a process that left the group while rank 0 still wrote the checkpoint was, now and
        # then, aborted at exit by a communication thread (status 1 for a finished run).
        dist.barrier()
        dist.destroy_process_group()


def exit_after_signal(signum, step, ckpt_path):
    """The checkpoint is on disk: say how to go on, and exit non-zero so a caller knows the run is unfinished."""
    signum = signum or signal.SIGTERM  # [aux-2] a process that was not signalled itself stops with the others
    if RANK == 0:
        print(f"{SCRIPT}: stopped by {signal.Signals(signum).name} at step {step}; checkpoint saved to {ckpt_path}; "
              f"resume with: python {SCRIPT}.py --resume {ckpt_path}", flush=True)
    sys.exit(128 + signum)


def record_games(env, video_dir, every_game):
    """The raw env, its episodes recorded as mp4s in video_dir: whole games, every frame (life losses never
    reset it), every game or gymnasium's 0, 1, 8, 27, ..."""
    trigger = (lambda game: True) if every_game else None
    return StreamingRecordVideo(env, video_dir, episode_trigger=trigger, disable_logger=True)


class StreamingRecordVideo(gym.wrappers.RecordVideo):
    """gymnasium's RecordVideo, but each frame goes to the mp4 as it is played: RecordVideo keeps a game's frames
    until it ends, about 11 GB for one that runs to the 108k-frame cap. A game cut short (Ctrl-C, a timeout)
    leaves the video of what was played."""

    writer = None

    def _capture_frame(self):
        frame = self.env.render()
        if self.writer is None:  # a new video: its size is the first frame's
            from moviepy.video.io.ffmpeg_writer import FFMPEG_VideoWriter  # only videos need moviepy
            path = os.path.join(self.video_folder, f"{self._video_name}.mp4")
            self.writer = FFMPEG_VideoWriter(path, frame.shape[1::-1], self.frames_per_sec)
        self.writer.write_frame(frame)

    def stop_recording(self):
        if self.writer is not None:
            self.writer.close()  # ffmpeg finishes the file
            self.writer = None
        self.recording, self._video_name = False, None


def play_games(agent, env_id, games, greedy, seed, device, repeat_action_probability, video_dir=None):
    """Play whole games, yielding each one's score and length in frames as it ends. The policy sees the training
    wrappers, whichever env path it was trained on (a lost life is followed by the same no-op and FIRE as in
    training, so a policy that never learned to serve does not stall), but what counts is the game: all lives,
    unclipped rewards. With video_dir, every game is recorded whole, as the emulator played it, and a game cut
    short (Ctrl-C) keeps the video of what was played."""
    env = make_env(env_id, 0, video_dir is not None, video_dir, repeat_action_probability, every_game=True)()
    played = 0
    try:
        obs, _ = env.reset(seed=seed)
        while played < games:
            with torch.inference_mode():
                action = agent.act(torch.as_tensor(obs, device=device).unsqueeze(0), greedy)
            obs, _, terminated, truncated, info = env.step(action.item())
            if terminated or truncated:
                if "episode" in info:  # the game is over, not just a life
                    played += 1
                    yield float(info["episode"]["r"]), int(info["episode"]["l"])
                    if played == games:
                        break  # no new game after the last: it would be recorded as one more video
                obs, _ = env.reset(seed=seed + played)  # the seed only reaches a new game; a life goes on
    finally:
        env.close()


def sigterm_as_interrupt(signum, frame):
    """During --eval-checkpoint, SIGTERM stops the evaluation where it is, as Ctrl-C does."""
    raise KeyboardInterrupt("SIGTERM")


def evaluate_checkpoint(args, ckpt, device):
    """--eval-checkpoint: play whole games with the saved policy, a line for each as it ends (a game can last
    minutes), and print mean +- std of the scores. Ctrl-C or SIGTERM stops it with the mean of the games played
    whole."""
    if RANK != 0:
        return  # [aux-2] one evaluation, on rank 0
    n_actions = ckpt["model"]["actor.weight"].shape[0]
    agent = Agent(n_actions).to(device)
    agent.load_state_dict(ckpt["model"])
    video_dir = f"videos/{ckpt['run_name']}/eval-at-step-{ckpt['global_step']}"
    video_dir = unused_folder(video_dir) if args.capture_video else None
    torch.manual_seed(args.seed)  # sampled actions (--no-eval-deterministic) follow --seed, as the starts do
    scores, stopped_by = [], None
    on_sigterm = signal.signal(signal.SIGTERM, sigterm_as_interrupt)  # `kill`, Slurm's time limit: as Ctrl-C
    try:
        for score, frames in play_games(agent, args.env_id, args.eval_episodes, args.eval_deterministic, args.seed,
                                        device, args.repeat_action_probability, video_dir):
            scores.append(score)
            print(f"game {len(scores)}/{args.eval_episodes}: {score:g} in {frames} frames", flush=True)
    except KeyboardInterrupt as interrupt:  # a person who wants the games played so far, not a traceback
        stopped_by = str(interrupt) or "Ctrl-C"
        print(f"stopped by {stopped_by} with {len(scores)} of {counted(args.eval_episodes, 'game')} "
              "played whole: only those count", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, on_sigterm)
    mode = "greedy" if args.eval_deterministic else "sampled"
    if scores:
        print(f"{args.env_id}: {np.mean(scores):.2f} +- {np.std(scores):.2f} "
              f"over {counted(len(scores), 'game')} ({mode}) of the policy at step {ckpt['global_step']}")
    if video_dir:
        print(f"videos of the games played in {video_dir}" if stopped_by else
              f"videos of the {counted(len(scores), 'game')} in {video_dir}")
    if stopped_by:  # 128 + the signal's number, as the shell reports a process that the signal ended
        sys.exit(128 + (signal.SIGTERM if stopped_by == "SIGTERM" else signal.SIGINT))


# ----------------------------------------------------------------------------------------------
# [aux-2] Data-parallel training: `torchrun --nproc-per-node N ppo_atari.py ...` trains one run on N processes
# ----------------------------------------------------------------------------------------------
# torchrun changes the speed, not the algorithm. The --num-envs envs are split across the processes (env i
# keeps seed + i), and so is every minibatch; what looks at a whole minibatch is reduced across processes: the
# gradients (averaged), advantage normalisation (`normalize`), the --target-kl decision and a stop. Rank 0
# alone writes logs and checkpoints, with every process's finished games. Without torchrun these do nothing.


def init_distributed(device):
    global normalize
    if WORLD_SIZE == 1:
        return
    # torchrun starts its workers in a session of their own, so when torchrun itself is killed outright (SIGKILL,
    # out of memory) nothing stops them and they train on, orphaned. Ask Linux to send each worker SIGTERM when
    # its parent dies: it then stops like any run told to stop, with a checkpoint.
    die_with_parent(signal.SIGTERM)
    if device.type == "cuda":
        # NCCL collectives (all_gather_object too) run on the current device: make it this process's own GPU.
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    normalize = normalize_over_processes  # ppo_loss's advantages: the whole minibatch's statistics


def normalize_over_processes(x, eps=1e-8):
    """[core-7] under torchrun: each process holds a slice of the minibatch, and the mean and std are those of
    the whole of it, from moments summed over the processes."""
    moments = torch.stack([torch.ones_like(x).sum(), x.sum(), (x * x).sum()]).double()
    dist.all_reduce(moments)
    n, total, squares = moments
    mean = total / n
    std = ((squares - n * mean * mean) / (n - 1)).clamp_min(0).sqrt()  # unbiased, as torch.std
    return (x - mean.float()) / (std.float() + eps)


def envs_of_this_process(total_envs):
    """This process steps envs first .. first + count - 1 of the run's --num-envs, and trains on its share of
    every batch and minibatch: (count, first). The processes' shares are disjoint and cover every env."""
    count = total_envs // WORLD_SIZE
    return count, RANK * count


def seed_this_process(args, start_iteration):
    """Every process built the same initial network from the same seed; from here on the others draw their own
    actions, from a seed of their rank and the iteration they start at. The checkpoint keeps rank 0's generators
    only, so a resumed torchrun run is reproducible but draws differently from the uninterrupted one."""
    if RANK != 0:
        torch.manual_seed(args.seed + RANK + 1_000_003 * start_iteration)


def average_gradients(model):
    """Each process's loss is the mean over its equal slice of the minibatch, so the mean of the processes'
    gradients is the gradient of the whole minibatch's loss. One flat all-reduce instead of one per tensor."""
    if WORLD_SIZE == 1:
        return
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= WORLD_SIZE
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


def mean_over_processes(value):
    if WORLD_SIZE == 1:
        return value
    value = value.clone()
    dist.all_reduce(value)
    return value / WORLD_SIZE


def any_process(flag, device):
    """True on every process once it is true on one: a signal may reach only one of them."""
    if WORLD_SIZE == 1:
        return bool(flag)
    flag = torch.tensor(float(bool(flag)), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag)


def games_of_every_process(games):
    """Rank 0 logs every process's finished games, (step, score, length), in step order."""
    if WORLD_SIZE == 1:
        return games
    everyone = [None] * WORLD_SIZE
    dist.all_gather_object(everyone, games)
    return sorted(game for games in everyone for game in games)


def check_in_sync(model, global_step):
    """Every process must hold the same parameters after every update: a cheap fingerprint proves it."""
    if WORLD_SIZE == 1:
        return
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    fingerprint = torch.stack([flat.sum(), (flat * flat).sum()])
    lowest = fingerprint.clone()
    dist.all_reduce(fingerprint, op=dist.ReduceOp.MAX)
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    if not torch.equal(fingerprint, lowest):
        print(f"error: rank {RANK}: the processes' parameters differ after step {global_step}", file=sys.stderr)
        sys.exit(1)


def exit_without_teardown(main):
    """[aux-2] Under torchrun: a worker whose main() finished exits 0 at once, skipping the interpreter's
    exit-time teardown. close_run has written and closed everything by then, but a communication thread still
    being torn down at exit now and then aborted a finished worker (SIGABRT: torchrun then reports a failed
    run). An error or a stop exits as usual (a worker that left at once would have torchrun kill rank 0 before
    it printed the error line)."""
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class NoLogs:
    """What ranks other than 0 log to: nothing (one run, one set of logs)."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


# ----------------------------------------------------------------------------------------------
# Env speed paths: ale-py's vector env, worker processes for --async-envs, memory reuse
# ----------------------------------------------------------------------------------------------


def make_training_envs(args, num_envs, first_env, video_dir):
    """Envs first_env .. first_env + num_envs - 1 of the run, on the path --env-path and --async-envs choose.
    [core-1] SAME_STEP autoreset: the step that ends an episode returns the first observation of the next one,
    and the true last observation in info["final_obs"]."""
    if args.env_path == "ale-vector":
        return make_ale_vector_env(args.env_id, num_envs, args.repeat_action_probability)
    env_args = [(args.env_id, i, args.capture_video, video_dir, args.repeat_action_probability)
                for i in range(first_env, first_env + num_envs)]
    if not args.async_envs:
        return gym.vector.SyncVectorEnv([make_env(*a) for a in env_args],
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    # Forked workers inherit StopSignals (installed before this), which leaves stopping them to this process.
    envs = gym.vector.AsyncVectorEnv([in_env_worker(*a) for a in env_args], context="fork",
                                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    atexit.register(kill_env_workers, envs)
    return envs


def finished_games(info):
    """(env index, score, length in frames) of every game that ended on this step. With SAME_STEP autoreset
    the ending step's info is under info["final_info"], batched, with masks "_final_info" and "_episode"."""
    final = info.get("final_info", {})
    if "episode" not in final:
        return []
    ended = info["_final_info"] & final["_episode"]
    return [(i, float(final["episode"]["r"][i]), int(final["episode"]["l"][i])) for i in np.flatnonzero(ended)]


class AleVectorGameScore(gym.vector.VectorWrapper):
    """Makes ale-py's vector env report like the wrapper path: sign-clipped rewards for the learner
    ([atari-6]; the env itself runs unclipped), and the unclipped game score in info["final_info"]["episode"]
    once a game, not a life, is over. A game is over where the env's episode frame counter restarted."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.scores, self.frames = np.zeros(self.num_envs), info["episode_frame_number"].copy()
        return obs, info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        self.scores += reward
        game_over = (terminated | truncated) & (info["episode_frame_number"] != self.frames + FRAME_SKIP)
        if game_over.any():
            info["final_info"] = {"episode": {"r": self.scores.copy(), "l": self.frames + FRAME_SKIP},
                                  "_episode": game_over}
            info["_final_info"] = game_over
            self.scores[game_over] = 0.0
        self.frames = info["episode_frame_number"].copy()
        return obs, np.sign(reward), terminated, truncated, info


def make_ale_vector_env(env_id, num_envs, repeat_action_probability):
    """ale-py's C++ vector env with the details above by name. It differs from the wrappers: life loss only
    sets terminated (episodic_life=True would reset the whole game at every lost life), so neither FIRE nor a
    fresh frame stack follows a lost life, and a reset presses FIRE for one frame only. In a game that needs
    FIRE to go on (Breakout) a policy that stops pressing it would stall until the 108k-frame cap. Also, a new
    game's stack is padded with zeros, and its no-op start draws 0..29 no-ops where NoopReset draws 1..30.
    On Breakout it scored below the wrappers and was no faster on a CPU (benchmarks/results/atari). So: publish
    from the wrappers, and use this path for speed only where stepping games is the bottleneck, not for FIRE
    games until shown equal."""
    spec = gym.spec(env_id)
    return AleVectorGameScore(ale_py.vector_env.AtariVectorEnv(
        game=spec.kwargs["game"], num_envs=num_envs, repeat_action_probability=repeat_action_probability,
        max_num_frames_per_episode=spec.kwargs.get("max_num_frames_per_episode", 108_000),
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        noop_max=NOOP_MAX,  # [atari-1]
        frameskip=FRAME_SKIP, maxpool=True,  # [atari-2]
        episodic_life=False, life_loss_info=True,  # [atari-3]
        use_fire_reset=True,  # [atari-4] (only in games with FIRE)
        grayscale=True, img_height=SCREEN_SIZE, img_width=SCREEN_SIZE,  # [atari-5]
        reward_clipping=False,  # [atari-6] done in AleVectorGameScore, which needs the unclipped rewards
        stack_num=FRAME_STACK,  # [atari-7]
    ))


def die_with_parent(sig):
    """Ask Linux to send this process `sig` when its parent process dies (elsewhere: nothing)."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, sig)


def in_env_worker(env_id, idx, capture_video, video_dir, repeat_action_probability):
    """--async-envs: env idx as a worker process builds it. If the training process is killed outright (SIGKILL,
    out of memory), its workers go with it at once and quietly; they hold nothing to save. gymnasium also builds
    env 0 once in the training process itself, only to read its spaces: that copy neither records video (it
    would claim the video folder) nor ties the trainer's life to its own parent's."""
    trainer = os.getpid()

    def thunk():
        if os.getpid() == trainer:
            return make_env(env_id, idx, False, None, repeat_action_probability)()
        die_with_parent(signal.SIGKILL)
        if os.getppid() != trainer:  # the trainer died before the line above took effect
            os._exit(0)
        return make_env(env_id, idx, capture_video, video_dir, repeat_action_probability)()

    return thunk


def kill_env_workers(envs):
    """The workers ignore stop signals (see StopSignals), so multiprocessing's exit-time terminate() cannot end
    them: after an uncaught error the trainer would wait on them for ever. Registered with atexit, this runs
    first. After a normal close() it finds them gone."""
    for process in envs.processes:
        if process.is_alive():
            process.kill()


def keep_freed_memory_for_reuse():
    """On the CPU each minibatch allocates tensors of tens of MB. glibc maps blocks that big afresh and unmaps
    them when freed, so the next minibatch faults them in again page by page, in the kernel's time. Serving them
    from the heap (the mmap threshold raised to its 32 MB maximum) and not trimming it keeps that memory for
    reuse. The arithmetic is unchanged (benchmarks/results/throughput); other C libraries are left as they are."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # no such library, or one without mallopt (musl)
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024)
    mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024)


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
    check_env(args.env_id)
    if args.repeat_action_probability is None:  # the checkpoint's, else the id's own; logged as a number
        args.repeat_action_probability = ckpt["args"]["repeat_action_probability"] if ckpt else \
            gym.spec(args.env_id).kwargs.get("repeat_action_probability", 0.25)
    if args.threads is not None:  # else torch's default: OMP_NUM_THREADS, or the CPUs this process may use
        torch.set_num_threads(args.threads)
    keep_freed_memory_for_reuse()
    device = torch.device(f"cuda:{LOCAL_RANK}" if args.cuda and torch.cuda.is_available() else "cpu")
    check_gpus_per_process(device)
    if args.eval_checkpoint:
        return evaluate_checkpoint(args, ckpt, device)
    if ckpt is not None:
        merge_resumed_args(args, ckpt)
    check_split_across_processes(args)
    check_bf16(args, device)
    train(args, ckpt, device)


if __name__ == "__main__":
    main() if WORLD_SIZE == 1 else exit_without_teardown(main)
