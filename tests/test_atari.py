"""Tests of ppo_atari.py: each Atari wrapper on a real ALE game, the game score that charts/episodic_return
logs, the agreement of the two env paths, tiny end-to-end runs, bad input, and long-run behaviour (stop
signals, checkpoint cadence, resume, what the log says).

Real games throughout (ale-py ships the ROMs). The raw emulator is observed by replacing the `step` of the
innermost AtariEnv instance with a recording one, so nothing in the script is changed for the tests.
"""

import os
import re
import shutil
import signal
import ctypes
import subprocess
import sys
import time
from pathlib import Path

import cv2
import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import (REPO_ROOT, load_script, main_in_process, only_run_dir, read_scalars, run_script, run_scripts,
                      script_env, video_frames)

SCRIPT = "ppo_atari"
pa = load_script(SCRIPT)

BREAKOUT, INVADERS, FREEWAY = "BreakoutNoFrameskip-v4", "SpaceInvadersNoFrameskip-v4", "FreewayNoFrameskip-v4"
PONG = "PongNoFrameskip-v4"
TINY = ["--total-timesteps", 512, "--num-envs", 2, "--num-steps", 128, "--no-cuda"]  # 2 iterations of 256
ALL_TAGS = [
    "charts/episodic_return", "charts/episodic_length", "charts/learning_rate", "charts/SPS",
    "losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/old_approx_kl",
    "losses/approx_kl", "losses/clipfrac", "losses/explained_variance",
]
PER_ITERATION_TAGS = [t for t in ALL_TAGS if not t.startswith("charts/episodic")]
LR = 2.5e-4  # the script's default learning rate


def tap(env):
    """Record every raw emulator step of `env` (a gym env or one made by the script) as (action, reward, frame)."""
    raw, calls = env.unwrapped, []
    step = raw.step

    def recording_step(action):
        result = step(action)
        calls.append((int(action), float(result[1]), result[0]))
        return result

    raw.step = recording_step
    return calls


def training_env(env_id):
    return pa.make_env(env_id, 0, False, "", 0.0)()


def wrappers_of(env):
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


def assert_ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


# ----------------------------------------------------------------------------------------------
# One wrapper at a time, on real games
# ----------------------------------------------------------------------------------------------


def test_noop_reset_takes_1_to_30_noops():  # [atari-1]
    raw = gym.make(BREAKOUT)
    env, calls = pa.NoopReset(raw), tap(raw)
    counts = []
    for seed in range(10):
        calls.clear()
        env.reset(seed=seed)
        assert {a for a, _, _ in calls} == {0}
        counts.append(len(calls))
    assert all(1 <= n <= 30 for n in counts) and len(set(counts)) > 2, counts


def test_max_and_skip_repeats_4_frames_and_maxes_the_last_two():  # [atari-2]
    skipped, reference = pa.MaxAndSkip(gym.make(INVADERS)), gym.make(INVADERS)
    skipped.reset(seed=3)
    reference.reset(seed=3)
    rng, differs_from_last, rewards = np.random.default_rng(0), 0, 0.0
    for _ in range(150):
        action = int(rng.integers(6))
        obs, reward, *_ = skipped.step(action)
        frames, total = [], 0.0
        for _ in range(4):
            frame, r, *_ = reference.step(action)
            frames.append(frame)
            total += r
        np.testing.assert_array_equal(obs, np.maximum(frames[2], frames[3]))
        assert reward == total
        differs_from_last += not np.array_equal(obs, frames[3])
        rewards += reward
    assert differs_from_last > 0 and rewards > 0  # the max matters (flicker), and rewards were summed


def test_life_loss_ends_the_learners_episode_not_the_game():  # [atari-3] through the training stack
    env = training_env(BREAKOUT)
    ale, rng = env.unwrapped.ale, np.random.default_rng(0)
    env.reset(seed=0)
    life_losses = 0
    while True:
        lives = ale.lives()
        _, _, terminated, truncated, info = env.step(int(rng.integers(4)))
        if not (terminated or truncated):
            continue
        if "episode" in info:  # the real game over: the next reset starts a new game
            assert ale.game_over() and life_losses == 4
            frame = ale.getEpisodeFrameNumber()
            env.reset()
            assert ale.lives() == 5 and ale.getEpisodeFrameNumber() < frame
            return
        life_losses += 1
        assert terminated and ale.lives() == lives - 1 and not ale.game_over()
        frame = ale.getEpisodeFrameNumber()
        env.reset()
        # The game went on: same lives, frames kept counting (no-op + FIRE + UP = 12 frames).
        assert ale.lives() == lives - 1 and ale.getEpisodeFrameNumber() == frame + 12


def test_fire_pressed_after_reset_and_after_a_lost_life_where_the_game_has_fire():  # [atari-4]
    env = training_env(BREAKOUT)
    assert "FireReset" in wrappers_of(env)
    assert "FireReset" not in wrappers_of(training_env(FREEWAY))  # Freeway: NOOP, UP, DOWN
    calls = tap(env)
    env.reset(seed=1)
    actions = [a for a, _, _ in calls]
    assert actions[-8:] == [1] * 4 + [2] * 4 and set(actions[:-8]) == {0} and 1 <= len(actions) - 8 <= 30
    rng = np.random.default_rng(1)
    while not env.step(int(rng.integers(4)))[2]:
        pass
    calls.clear()
    env.reset()  # after a lost life: a no-op step stands in for the reset, then FIRE
    assert [a for a, _, _ in calls] == [0] * 4 + [1] * 4 + [2] * 4


def test_frames_are_84x84_grayscale_of_the_screen():  # [atari-5]
    raw = gym.make(BREAKOUT)
    env = pa.WarpFrame(raw)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.shape == obs.shape == (84, 84) and obs.dtype == np.uint8
    gray = cv2.cvtColor(raw.unwrapped.ale.getScreenRGB(), cv2.COLOR_RGB2GRAY)
    np.testing.assert_array_equal(obs, cv2.resize(gray, (84, 84), interpolation=cv2.INTER_AREA))


def test_rewards_are_clipped_to_their_sign_for_the_learner():  # [atari-6]
    env = training_env(INVADERS)
    calls = tap(env)
    env.reset(seed=0)
    rng, seen = np.random.default_rng(0), set()
    for _ in range(300):
        calls.clear()
        _, reward, terminated, truncated, _ = env.step(int(rng.integers(6)))
        raw = sum(r for _, r, _ in calls)
        assert reward == np.sign(raw)
        seen.add(raw)
        if terminated or truncated:
            env.reset()
    assert max(seen) > 1  # Space Invaders pays 5-30 a hit: the clip did something


def test_frame_stack_holds_the_last_4_frames_oldest_first():  # [atari-7], with [atari-2] and [atari-5]
    env = training_env(BREAKOUT)
    calls = tap(env)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert all(np.array_equal(obs[i], obs[3]) for i in range(3))  # a new episode pads with its first frame
    rng = np.random.default_rng(0)
    for _ in range(40):
        previous = obs
        calls.clear()
        obs, _, terminated, _, _ = env.step(int(rng.integers(4)))
        if terminated:
            break
        np.testing.assert_array_equal(obs[:3], previous[1:])
        newest = np.maximum(calls[-2][2], calls[-1][2])
        gray = cv2.cvtColor(newest, cv2.COLOR_RGB2GRAY)
        np.testing.assert_array_equal(obs[3], cv2.resize(gray, (84, 84), interpolation=cv2.INTER_AREA))


def test_network_sees_pixels_scaled_to_0_1_and_rollouts_store_uint8():  # [atari-9], [atari-8]
    agent = pa.Agent(4)
    seen = []
    agent.network[0].register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    obs = torch.zeros((2, 4, 84, 84), dtype=torch.uint8)
    obs[1] = 255
    _, _, _, value = agent.get_action_and_value(obs)
    assert value.shape == (2,)
    x = seen[0]
    assert x.dtype == torch.float32 and x[0].max() == 0.0 and x[1].min() == 1.0
    # One shared trunk: the policy and the value read the same features.
    assert isinstance(agent.network[0], torch.nn.Conv2d) and agent.network[0].stride == (4, 4)
    assert agent.actor.in_features == agent.critic.in_features == 512


def openmp_spin_count(environment):
    """How long torch's OpenMP threads spin before they sleep, in a fresh process that imports the script, as
    libgomp reports it when it starts (with OMP_WAIT_POLICY unset it spins 300,000 rounds; PASSIVE: none)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env |= environment | {"OMP_DISPLAY_ENV": "VERBOSE"}
    out = subprocess.run([sys.executable, "-c", "import ppo_atari, torch; torch.ones(10**6).sum()"], cwd=REPO_ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(re.search(r"GOMP_SPINCOUNT = '(\d+)'", out.stderr).group(1))


def test_torch_threads_sleep_while_they_wait_unless_the_user_says_otherwise():
    """Spinning threads collapse a two-thread run when another process shares the cores: the script asks
    OpenMP for sleeping waits before torch loads it, and leaves a user's own choice alone."""
    assert openmp_spin_count({}) == 0
    assert openmp_spin_count({"OMP_WAIT_POLICY": "ACTIVE"}) > 10**6


@pytest.mark.parametrize("flag, network_dtype", [([], torch.float32), (["--bf16"], torch.bfloat16)])
def test_bf16_runs_every_forward_pass_in_bfloat16_and_hands_the_loss_float32(flag, network_dtype, tmp_path,
                                                                            monkeypatch, capsys):
    """--bf16: the CNN's forward passes, in the rollout (inference) and in the update (with gradients), run under
    bfloat16 autocast; the log-probs, entropies and values that reach the loss are float32 either way; the
    checkpoint keeps the setting, so a resumed run goes on as it started."""
    features, outputs = [], []
    original_features, original_heads = pa.Agent.features, pa.Agent.get_action_and_value

    def spy_features(self, obs):
        hidden = original_features(self, obs)
        features.append((torch.is_inference_mode_enabled(), hidden.dtype))
        return hidden

    def spy_heads(self, obs, action=None):
        out = original_heads(self, obs, action)
        outputs.extend(x.dtype for x in out[1:])
        return out

    monkeypatch.setattr(pa.Agent, "features", spy_features)
    monkeypatch.setattr(pa.Agent, "get_action_and_value", spy_heads)
    one_iteration = ["--total-timesteps", 256, "--num-envs", 2, "--num-steps", 128, "--no-cuda"]  # bf16: slow on a CPU
    code, err, _ = main_in_process(pa, [*one_iteration, *flag, "--save-model", "--no-progress"], tmp_path, monkeypatch,
                                   capsys)
    assert code == 0, err
    assert {mode for mode, _ in features} == {True, False}  # rollout and update both seen
    assert {dtype for _, dtype in features} == {network_dtype}
    assert set(outputs) == {torch.float32}
    ckpt = torch.load(only_run_dir(tmp_path) / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["args"]["bf16"] == bool(flag)


def test_rollout_bytes_stored_channels_last_give_the_same_network_outputs():
    """The rollout stores frames innermost, the layout the convolutions run in; the values seen are the same."""
    torch.manual_seed(0)
    agent = pa.Agent(4)
    obs = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
    frames_innermost = obs.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        assert torch.equal(agent.features(obs), agent.features(frames_innermost))
        assert torch.equal(agent.features(obs[[4, 1]]), agent.features(frames_innermost[[4, 1]]))


# ----------------------------------------------------------------------------------------------
# The game score: charts/episodic_return is a whole game, all lives, unclipped
# ----------------------------------------------------------------------------------------------


def play_until_games_end(envs, raw_rewards_of, n_envs, steps=4000):
    """Random actions until every env has finished a game. Returns per env: the finished games as
    (logged score, raw reward sum), the learner's episode ends, and the clipped rewards of the first game."""
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=5)
    raw_sum, clipped_sum = np.zeros(n_envs), np.zeros(n_envs)
    games, learner_ends = [[] for _ in range(n_envs)], np.zeros(n_envs, int)
    for _ in range(steps):
        previous = obs
        obs, reward, terminated, truncated, info = envs.step(rng.integers(envs.single_action_space.n, size=n_envs))
        assert obs.shape == (n_envs, 4, 84, 84) and obs.dtype == np.uint8
        assert set(np.unique(reward)) <= {-1.0, 0.0, 1.0}
        done = terminated | truncated
        # Frame stacking order (oldest first) wherever no episode ended.
        np.testing.assert_array_equal(obs[~done][:, :3], previous[~done][:, 1:])
        raw_sum += raw_rewards_of()
        clipped_sum += reward
        learner_ends += done
        for i, score, length in pa.finished_games(info):
            assert length > 0
            games[i].append((score, raw_sum[i], clipped_sum[i]))
            raw_sum[i] = clipped_sum[i] = 0.0
        if all(games):
            return games, learner_ends
    raise AssertionError(f"no game over within {steps} steps: {games}")


def check_game_scores(games, learner_ends):
    for env_games, ends in zip(games, learner_ends):
        assert ends > len(env_games)  # life losses ended learner episodes without ending the game
        for score, raw, clipped in env_games:
            assert score == raw  # the logged return is the sum of unclipped rewards over the whole game
            assert score > clipped  # and not the clipped sum the learner was trained on


def test_logged_game_score_is_the_unclipped_sum_over_the_whole_game():
    envs = gym.vector.SyncVectorEnv([pa.make_env(INVADERS, i, False, "", 0.0) for i in range(2)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    taps = [tap(env) for env in envs.envs]

    def raw_rewards():
        sums = [sum(r for _, r, _ in calls) for calls in taps]
        for calls in taps:
            calls.clear()
        return np.array(sums)

    check_game_scores(*play_until_games_end(envs, raw_rewards, 2))


def running(pid):
    """Whether process pid is alive (a zombie is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def tap_evaluation_emulator(monkeypatch, on_reset, on_step):
    """Make the envs that play_games() builds call on_reset() at each real reset of their raw emulator (a game starts)
    and on_step(reward) after each of its frames, with the emulator's own unclipped reward."""
    make_env = pa.make_env

    def tapped_make_env(*args, **kwargs):
        thunk = make_env(*args, **kwargs)

        def make_tapped():
            env = thunk()
            raw = env.unwrapped
            reset, step = raw.reset, raw.step

            def recording_reset(**kwargs):
                on_reset()
                return reset(**kwargs)

            def recording_step(action):
                result = step(action)
                on_step(float(result[1]))
                return result

            raw.reset, raw.step = recording_reset, recording_step
            return env

        return make_tapped

    monkeypatch.setattr(pa, "make_env", tapped_make_env)


def test_evaluation_scores_whole_games_of_unclipped_rewards(monkeypatch):
    # On the raw emulator of the env that play_games() makes: a real reset starts a game, every raw reward adds to it.
    games = []

    def add_reward(reward):
        games[-1] += reward

    tap_evaluation_emulator(monkeypatch, on_reset=lambda: games.append(0.0), on_step=add_reward)
    torch.manual_seed(0)
    agent = pa.Agent(gym.make(INVADERS).action_space.n)  # untrained: plays about at random, loses all lives
    scores = [score for score, _ in pa.play_games(agent, INVADERS, 2, False, 3, torch.device("cpu"), 0.0)]
    assert len(scores) == 2 and scores == games[:2]  # each score is one whole game's unclipped reward sum
    assert max(scores) > 5  # Space Invaders pays 5 to 30 a hit: the rewards were not clipped to 1


def test_ale_vector_path_agrees_with_the_wrappers():
    wrappers = gym.vector.SyncVectorEnv([pa.make_env(INVADERS, i, False, "", 0.0) for i in range(2)],
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    ale = pa.make_ale_vector_env(INVADERS, 2, 0.0)
    assert wrappers.single_observation_space == ale.single_observation_space  # (4, 84, 84) uint8, 0..255
    assert wrappers.single_action_space == ale.single_action_space
    obs_w, _ = wrappers.reset(seed=0)
    obs_a, _ = ale.reset(seed=0)
    # Same scale and conversion: the newest frames of a fresh game look alike (0..255, similar brightness).
    assert obs_w.max() > 1 and obs_a.max() > 1
    assert abs(float(obs_w[:, 3].mean()) - float(obs_a[:, 3].mean())) < 5.0
    # The ale env runs with unclipped rewards; tap them where the adapter receives them.
    inner, received = ale.env, []
    step = inner.step

    def recording_step(actions):
        result = step(actions)
        received.append(result[1].copy())
        return result

    inner.step = recording_step

    def raw_rewards():
        total = np.sum(received, axis=0)
        received.clear()
        return total

    check_game_scores(*play_until_games_end(ale, raw_rewards, 2))


@pytest.mark.parametrize("path", ["wrappers", "ale-vector"])
def test_v5_ids_skip_4_frames_once_and_keep_sticky_actions(path):
    # ALE/*-v5 ids skip 4 frames and repeat actions with probability 0.25 by themselves: the script must make
    # them with frameskip=1 (or the skip would apply twice: 16 frames a step) and keep the 0.25.
    if path == "wrappers":
        env = pa.make_env("ALE/Breakout-v5", 0, False, "", 0.25)()
        calls = tap(env)
        env.reset(seed=0)
        calls.clear()
        env.step(0)
        assert len(calls) == 4  # emulator steps of one frame each
        assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    else:
        envs = pa.make_ale_vector_env("ALE/Breakout-v5", 1, 0.25)
        _, info = envs.reset(seed=0)
        start = int(info["episode_frame_number"][0])
        _, _, _, _, info = envs.step(np.zeros(1, dtype=int))
        assert int(info["episode_frame_number"][0]) - start == 4


# ----------------------------------------------------------------------------------------------
# End to end: train (both paths) -> checkpoint -> evaluate -> resume
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cwds = [tmp_path_factory.mktemp(name) for name in ("wrappers", "ale_vector", "repeat", "v5", "async_video")]
    results = run_scripts([
        (SCRIPT, [*TINY, "--save-model", "--capture-video"], cwds[0]),
        (SCRIPT, [*TINY, "--save-model", "--env-path", "ale-vector"], cwds[1]),
        (SCRIPT, [*TINY, "--async-envs"], cwds[2]),  # the first run again: envs in workers, without video
        (SCRIPT, [*TINY, "--save-model", "--env-id", "ALE/Breakout-v5"], cwds[3]),
        (SCRIPT, [*TINY, "--async-envs", "--capture-video"], cwds[4]),
    ])
    return dict(zip(["wrappers", "ale-vector", "repeat", "v5", "async-video"], zip(results, cwds)))


def test_async_envs_record_env_0_from_its_worker_quietly(trained):
    result, cwd = trained["async-video"]
    assert_ok(result)
    assert result.stderr == ""  # no "Overwriting existing videos": only worker 0 records
    videos = list((cwd / "videos" / only_run_dir(cwd).name).glob("*.mp4"))
    assert videos and all(v.stat().st_size > 0 for v in videos)


def test_async_env_built_in_the_trainer_neither_records_nor_ties_the_trainer_to_its_parent(tmp_path):
    """gymnasium builds env 0 once in the training process to read its spaces: that copy must not claim the
    video folder, nor set the worker's die-with-parent signal on the trainer."""
    libc, PR_GET_PDEATHSIG = ctypes.CDLL(None), 2
    before, after = ctypes.c_int(), ctypes.c_int()
    libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(before))
    env = pa.in_env_worker(BREAKOUT, 0, True, str(tmp_path / "videos"), 0.0)()
    env.close()
    libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(after))
    assert after.value == before.value != signal.SIGKILL
    assert not (tmp_path / "videos").exists()


def test_an_error_with_async_envs_ends_the_run_instead_of_hanging(tmp_path):
    """The workers ignore stop signals; an uncaught error in the trainer must still end the process (its
    workers killed at exit), not leave it waiting on them."""
    code = (f"import sys; sys.path.insert(0, {str(REPO_ROOT / 'tests')!r}); from conftest import load_script\n"
            f"pa = load_script({SCRIPT!r})\n"
            "def broken(*args, **kwargs): raise RuntimeError('injected failure')\n"
            "pa.compute_gae = broken\n"
            f"sys.argv = [{SCRIPT!r}, *{list(map(str, TINY))!r}, '--async-envs']\n"
            "pa.main()\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=script_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "RuntimeError: injected failure" in result.stderr, result.stderr


def test_v5_run_records_its_sticky_actions(trained):
    result, cwd = trained["v5"]
    assert_ok(result)
    run_dir = only_run_dir(cwd)
    assert run_dir.name.startswith("ALE_Breakout-v5__")  # the id's "/" does not nest the run directory
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["args"]["env_id"] == "ALE/Breakout-v5" and ckpt["args"]["repeat_action_probability"] == 0.25


@pytest.mark.parametrize("path", ["wrappers", "ale-vector"])
def test_tiny_run_logs_the_tags_and_saves_a_checkpoint(trained, path):
    result, cwd = trained[path]
    assert_ok(result)
    run_dir = only_run_dir(cwd)
    scalars = read_scalars(run_dir)
    # Breakout games under a near-random policy last ~100-200 steps: 256 steps per env finish some.
    assert set(ALL_TAGS) <= set(scalars), sorted(scalars)
    assert [s for s, _ in scalars["charts/learning_rate"]] == [256, 512]
    assert all(float(v).is_integer() and v >= 0 for _, v in scalars["charts/episodic_return"])
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["script"] == SCRIPT and ckpt["iteration"] == 2 and ckpt["global_step"] == 512
    assert ckpt["args"]["env_path"] == path and ckpt["args"]["repeat_action_probability"] == 0.0
    if path == "wrappers":
        videos = list((cwd / "videos" / run_dir.name).glob("*.mp4"))
        assert videos and all(v.stat().st_size > 0 for v in videos)


def test_same_seed_same_curve_and_video_and_async_envs_change_nothing(trained):
    (first, cwd), (again, cwd_again) = trained["wrappers"], trained["repeat"]
    assert_ok(first)
    assert_ok(again)
    a, b = read_scalars(only_run_dir(cwd)), read_scalars(only_run_dir(cwd_again))
    for tag in ALL_TAGS:
        if tag != "charts/SPS":
            assert a[tag] == b[tag], tag


def test_evaluate_and_resume(trained, tmp_path):
    result, cwd = trained["wrappers"]
    assert_ok(result)
    run_dir = only_run_dir(cwd)
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    ckpt["iteration"], ckpt["global_step"] = 1, 256  # back to the middle: iteration 2 is trained again
    crafted = cwd / "crafted.pt"
    torch.save(ckpt, crafted)
    final = run_dir / "final.pt"  # the run's newer checkpoint moved away, or the older one may not resume
    (run_dir / "checkpoint.pt").rename(final)
    before = set(run_dir.glob("events.out.tfevents.*"))
    evaluated, resumed = run_scripts([
        (SCRIPT, ["--eval-checkpoint", final, "--eval-episodes", 2, "--no-cuda"], tmp_path),
        (SCRIPT, ["--resume", crafted, "--no-cuda"], cwd),
    ])
    assert_ok(evaluated)
    line = [x for x in evaluated.stdout.splitlines() if "+-" in x]
    assert len(line) == 1 and "over 2 games (greedy)" in line[0] and line[0].startswith(BREAKOUT)
    assert not (tmp_path / "runs").exists()
    assert_ok(resumed)
    assert only_run_dir(cwd) == run_dir
    new = sorted(set(run_dir.glob("events.out.tfevents.*")) - before)
    assert len(new) == 1
    own = read_scalars(new[0])
    for tag in PER_ITERATION_TAGS:
        assert [s for s, _ in own[tag]] == [512], tag
    assert own["charts/learning_rate"][0][1] == pytest.approx(2.5e-4 / 2)
    merged = read_scalars(run_dir)  # the checkpointed iteration's logs (step 256) survive the purge
    assert [s for s, _ in merged["charts/learning_rate"]] == [256, 512]


# ----------------------------------------------------------------------------------------------
# Bad input: one "error:" line, no traceback, no runs/ left behind
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--env-id", "CartPole-v1"], ["CartPole-v1", "ppo_discrete.py"]),
    (["--env-id", "Pendulum-v1"], ["Pendulum-v1", "ppo_continuous.py"]),
    (["--env-id", "HalfCheetah-v4"], ["HalfCheetah-v4", "ppo_continuous.py"]),
    (["--env-id", "NoSuchGameNoFrameskip-v4"], ["NoSuchGameNoFrameskip-v4"]),
    (["--env-id", "Breakout-ramNoFrameskip-v4"], ["ram"]),
    (["--num-envs", 3, "--num-steps", 5, "--num-minibatches", 4], ["minibatch"]),
    (["--capture-video", "--env-path", "ale-vector"], ["--env-path wrappers"]),
    (["--async-envs", "--env-path", "ale-vector"], ["--async-envs", "ale-vector"]),
    # Every numeric setting range-checked before any work, with the flag and its range in the message.
    (["--gamma", 1.5], ["--gamma 1.5 is out of range: it must be in [0, 1]"]),
    (["--gae-lambda", -0.1], ["--gae-lambda", "[0, 1]"]),
    (["--clip-coef", -0.1], ["--clip-coef", "> 0"]),
    (["--learning-rate", -1], ["--learning-rate", "> 0"]),
    (["--learning-rate", "nan"], ["--learning-rate"]),
    (["--ent-coef", -0.01], ["--ent-coef", ">= 0"]),
    (["--vf-coef", 0], ["--vf-coef", "> 0"]),
    (["--max-grad-norm", 0], ["--max-grad-norm", "> 0"]),
    (["--target-kl", 0], ["--target-kl", "> 0"]),
    (["--total-timesteps", 0], ["--total-timesteps", ">= 1"]),
    (["--num-envs", 0], ["--num-envs", ">= 1"]),
    (["--num-steps", 0], ["--num-steps", ">= 1"]),
    (["--num-minibatches", 0], ["--num-minibatches", ">= 1"]),
    (["--update-epochs", 0], ["--update-epochs", ">= 1"]),
    (["--eval-episodes", 0], ["--eval-episodes", ">= 1"]),
    (["--threads", 0], ["--threads", ">= 1"]),
    (["--seed", -1], ["--seed", "[0, "]),
    (["--seed", 2**31], ["--seed", "[0, "]),  # env i is seeded with seed + i, and ale-py's seeds are 32-bit
    (["--checkpoint-every", -1], ["--checkpoint-every", ">= 0"]),
    (["--checkpoint-minutes", -5], ["--checkpoint-minutes", ">= 0"]),
    (["--progress-interval", -1], ["--progress-interval", ">= 0"]),
    (["--repeat-action-probability", 1.5], ["--repeat-action-probability", "[0, 1]"]),
    (["--repeat-action-probability", -0.1], ["--repeat-action-probability", "[0, 1]"]),
    (["--exp-name", "x/y"], ["--exp-name", "x/y"]),
    (["--exp-name", ""], ["--exp-name"]),
    (["--exp-name", "a__b"], ["--exp-name", "__"]),
    (["--eval-checkpoint", "a.pt", "--resume", "a.pt"], ["--eval-checkpoint", "--resume"]),
])
def test_bad_input_fails_with_one_line(args, words, tmp_path, monkeypatch, capsys):
    error = fail_line(args, tmp_path, monkeypatch, capsys)
    assert all(w in error for w in words), error


def test_mujoco_id_is_refused_before_mujoco_loads(tmp_path):
    """From its spec: nothing of MuJoCo's own (its compiler's warnings, its log file) comes before the error."""
    result = run_script(SCRIPT, "--env-id", "HalfCheetah-v4", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith("error:"), result.stderr
    assert "ppo_continuous.py" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content, words", [
    (None, ["not found"]),
    ({"script": "ppo_discrete", "args": {"env_id": "CartPole-v1"}}, ["ppo_discrete.py"]),
    ({"script": SCRIPT}, ["cannot read"]),
    ("a text file", ["cannot read"]),
    ("a folder", ["folder"]),
])
@pytest.mark.parametrize("flag", ["--resume", "--eval-checkpoint"])
def test_bad_checkpoint_fails_with_one_line(content, words, flag, tmp_path, monkeypatch, capsys):
    path = tmp_path / "given.pt"
    if content == "a text file":
        path.write_text("not a checkpoint\n")
    elif content == "a folder":
        path.mkdir()
    elif content is not None:
        torch.save(content, path)
    error = fail_line([flag, path], tmp_path, monkeypatch, capsys)
    assert all(w in error for w in words), error


def fail_line(args, cwd, monkeypatch, capsys):
    """Run main() in this process; it must exit with code 2 and exactly one "error:" line, leaving no runs/."""
    monkeypatch.chdir(cwd)
    before = sorted(cwd.iterdir())
    monkeypatch.setattr(sys, "argv", [f"{SCRIPT}.py", *map(str, args), "--no-cuda"])
    with pytest.raises(SystemExit) as exit_info:
        pa.main()  # any other exception would be a traceback
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 2 and len(errors) == 1, err
    assert "weights_only" not in errors[0]  # torch's advice on unsafe loading is not the user's business
    assert sorted(cwd.iterdir()) == before  # nothing written (MuJoCo's compiler would drop a MUJOCO_LOG.TXT)
    return errors[0]


# ----------------------------------------------------------------------------------------------
# Long runs: what the log says, stop signals, a resumed run's checkpoint cadence, evaluation videos
# ----------------------------------------------------------------------------------------------


def run_main_in_process(args, cwd, monkeypatch, capsys):
    """main() in this process: (exit code, stderr, stdout)."""
    return main_in_process(pa, args, cwd, monkeypatch, capsys)


def test_output_to_a_file_says_what_the_run_does(trained):
    """stdout is a pipe here, as in a Slurm log: a start line, plain progress lines with an ETA, a summary."""
    result, cwd = trained["wrappers"]
    assert_ok(result)
    run_dir, lines = only_run_dir(cwd), result.stdout.splitlines()
    # --no-cuda; torch's default threads follow OMP_NUM_THREADS=1, which the tests' environment sets.
    assert lines[0] == f"{SCRIPT}: {BREAKOUT}, seed 1, 512 steps on cpu, 1 thread; logs in runs/{run_dir.name}"
    progress = [line for line in lines if line.startswith("step ")]
    # The first line comes after the first iteration, then one per --progress-interval (60 s by default).
    assert progress and progress[0].startswith("step 256/512 (50%)"), lines
    assert re.search(r"\d+ steps/s +score\(last 100\) [-\d.]+ +elapsed \d+:\d\d:\d\d +eta \d+:\d\d:\d\d$",
                     progress[0]), progress[0]
    assert "\r" not in result.stdout  # the live terminal line is for terminals only
    end = lines[-1]
    assert end.startswith(f"{SCRIPT}: done, 512 steps in "), end
    assert f"logs in runs/{run_dir.name}" in end and "checkpoint saved to" in end
    assert re.search(r"score\(last 100\) \d+\.\d\d;", end), end  # Breakout scores of the finished games


def test_progress_lines_estimate_the_time_left(monkeypatch, capsys):
    clock = [1000.0]
    monkeypatch.setattr(pa.time, "time", lambda: clock[0])
    plain = pa.Progress(True, 60, total_steps=10_000, start_step=1000, measure="score")  # resumed at step 1000
    clock[0] += 50
    plain.update(1500, [3.0, 5.0])  # 500 steps in 50 s: 10 steps/s, 8500 steps left
    clock[0] += 30
    plain.update(1800, [])  # within the interval: no line
    out = capsys.readouterr().out
    assert out == "step 1500/10000 (15%)  10 steps/s  score(last 100) 4.0  elapsed 0:00:50  eta 0:14:10\n"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    live = pa.Progress(True, 60, total_steps=100_000, start_step=0, measure="score")
    clock[0] += 100
    live.update(1000, [])  # 10 steps/s, 99,000 steps left: 2 h 45 min; a terminal line says all a log line says
    assert capsys.readouterr().out == ("\rstep 1000/100000 (1%)  10 steps/s  score(last 100) -  elapsed 0:01:40  "
                                       "eta 2:45:00   ")


def test_start_line_says_the_cpu_stands_in_for_a_missing_gpu(tmp_path, monkeypatch, capsys):
    """--cuda is the default; without a GPU the run says it trains on the CPU. The budget is rounded."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err, out = run_main_in_process(["--total-timesteps", 100, "--num-envs", 2, "--num-steps", 16,
                                          "--update-epochs", 1], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert ("96 steps (--total-timesteps 100 rounded down to whole rollouts of 32 steps) on cpu, 1 thread "
            "(no GPU found); logs in runs/") in lines[0], lines[0]
    assert lines[-1].startswith(f"{SCRIPT}: done, 96 steps in "), lines[-1]


def test_resume_of_a_finished_run_trains_nothing_and_writes_nothing(trained, tmp_path, monkeypatch, capsys):
    result, cwd = trained["ale-vector"]
    assert_ok(result)
    run_dir = only_run_dir(cwd)
    before = {p: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    for extra in ([], ["--threads", 3]):
        code, err, out = run_main_in_process(["--resume", run_dir / "checkpoint.pt", *extra], tmp_path,
                                             monkeypatch, capsys)
        assert code == 0 and err == "", err
        assert out.strip() == (f"{run_dir.name} already finished (512 of 512 steps): nothing to train. To train "
                               "longer, start a new run with a larger --total-timesteps.")
    assert list(tmp_path.iterdir()) == []
    assert {p: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before
    # --threads is torch's default unless given: no call without it, the number given with it.
    assert threads == [3]


def test_extending_a_finished_run_is_explained(trained, tmp_path, monkeypatch, capsys):
    result, cwd = trained["ale-vector"]
    assert_ok(result)
    error = fail_line(["--resume", only_run_dir(cwd) / "checkpoint.pt", "--total-timesteps", 1024], tmp_path,
                      monkeypatch, capsys)
    assert "--total-timesteps 1024 differs" in error and "learning-rate schedule" in error and "new run" in error


def signal_on_call(monkeypatch, owner, name, call, sig):
    """Make the `call`-th call of owner.name send `sig` to this process first: a signal at that moment."""
    original, calls = getattr(owner, name), [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


# 2 envs x 16 steps, 10 iterations of 32 steps; per iteration the rollout calls the policy 16 times and the
# update 16 times (4 epochs x 4 minibatches of 8).
BATCH = 32
TEN = ["--total-timesteps", 320, "--num-envs", 2, "--num-steps", 16, "--no-cuda"]
STOP_MOMENTS = {
    # name: (where the signal lands, extra args, signal, the last whole iteration the checkpoint must hold)
    "mid_rollout": (lambda mp: signal_on_call(mp, pa.Agent, "get_action_and_value", 2 * 32 + 10, signal.SIGTERM),
                    ["--checkpoint-every", 4], signal.SIGTERM, 2),
    "mid_rollout_ale_vector": (
        lambda mp: signal_on_call(mp, pa.Agent, "get_action_and_value", 2 * 32 + 10, signal.SIGTERM),
        ["--env-path", "ale-vector"], signal.SIGTERM, 2),
    # A stop during an update lets the update finish: a checkpoint never holds a half-updated network.
    "mid_update": (lambda mp: signal_on_call(mp, pa, "clipped_surrogate", 2 * 16 + 5, signal.SIGINT),
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
    path = run_dir.relative_to(stopped_run["cwd"]) / "checkpoint.pt"
    stop_lines = [line for line in stopped_run["out"].splitlines() if "stopped by" in line]
    assert stop_lines == [f"{SCRIPT}: stopped by {sig.name} at step {iteration * BATCH}; checkpoint saved to "
                          f"{path}; resume with: python {SCRIPT}.py --resume {path}"]
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["iteration"] == iteration and ckpt["global_step"] == iteration * BATCH
    assert not (run_dir / "checkpoint.pt.tmp").exists()
    # The logs are intact up to the checkpoint: every iteration it holds is logged, once.
    scalars = read_scalars(run_dir)
    for tag in PER_ITERATION_TAGS:
        assert [s for s, _ in scalars[tag]] == [BATCH * i for i in range(1, iteration + 1)], tag


@pytest.mark.parametrize("stopped_run", ["mid_rollout"], indirect=True)
def test_resumed_run_continues_steps_schedule_and_checkpoint_cadence(stopped_run, tmp_path_factory, monkeypatch,
                                                                      capsys):
    run_dir = stopped_run["run_dir"]
    # A copy of the stopped run, resumed with checkpoint settings of its own on the command line.
    copy_cwd = tmp_path_factory.mktemp("copy")
    shutil.copytree(run_dir, copy_cwd / "runs" / run_dir.name)
    saves, save = [], pa.save_checkpoint

    def counting_save(path, agent, optimizer, kl_coef, args, run_name, global_step, iteration, rng, *rest):
        saves.append((os.path.dirname(os.path.abspath(path)), iteration))
        return save(path, agent, optimizer, kl_coef, args, run_name, global_step, iteration, rng, *rest)

    monkeypatch.setattr(pa, "save_checkpoint", counting_save)
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # resumed from another folder, by absolute path
    code, err, out = run_main_in_process(["--resume", run_dir / "checkpoint.pt"], elsewhere, monkeypatch, capsys)
    assert code == 0, err
    assert list(elsewhere.iterdir()) == []  # it logs into the checkpoint's run folder, not here
    assert "resuming at step 64" in out.splitlines()[0]
    scalars = read_scalars(run_dir)
    for tag in PER_ITERATION_TAGS:
        assert [s for s, _ in scalars[tag]] == [BATCH * i for i in range(1, 11)], tag
    np.testing.assert_allclose([v for _, v in scalars["charts/learning_rate"]],
                               [LR * (1 - i / 10) for i in range(10)], rtol=1e-6)
    # Started with --checkpoint-every 4 and no --save-model: the resumed part keeps checkpointing every 4, and
    # ends with a checkpoint of its final state.
    assert saves == [(str(run_dir), 4), (str(run_dir), 8), (str(run_dir), 10)]
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["iteration"] == 10 and ckpt["global_step"] == 10 * BATCH
    assert ckpt["args"]["checkpoint_every"] == 4 and ckpt["args"]["save_model"] is False

    saves.clear()
    copy = copy_cwd / "runs" / run_dir.name
    code, err, _ = run_main_in_process(["--resume", copy / "checkpoint.pt", "--save-model", "--checkpoint-every", 3],
                                       copy_cwd, monkeypatch, capsys)
    assert code == 0, err
    assert saves == [(str(copy), 3), (str(copy), 6), (str(copy), 9), (str(copy), 10)]  # the command line wins
    ckpt = torch.load(copy / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["iteration"] == 10 and ckpt["args"]["checkpoint_every"] == 3 and ckpt["args"]["save_model"] is True


def test_checkpoint_every_few_minutes(tmp_path, monkeypatch, capsys):
    """--checkpoint-minutes: a checkpoint once that much wall time has passed since the last one."""
    clock = [1000.0]
    monkeypatch.setattr(pa.time, "time", lambda: clock[0])
    saves, save = [], pa.save_checkpoint

    def counting_save(path, agent, optimizer, kl_coef, args, run_name, global_step, iteration, rng, *rest):
        saves.append(iteration)
        return save(path, agent, optimizer, kl_coef, args, run_name, global_step, iteration, rng, *rest)

    monkeypatch.setattr(pa, "save_checkpoint", counting_save)
    compute_gae = pa.compute_gae

    def gae_and_tick(*args, **kwargs):  # each iteration takes 40 "seconds"
        clock[0] += 40.0
        return compute_gae(*args, **kwargs)

    monkeypatch.setattr(pa, "compute_gae", gae_and_tick)
    code, err, _ = run_main_in_process([*TEN, "--checkpoint-minutes", 2], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert saves == [3, 6, 9, 10]  # 120 s reached after every third iteration, and the end


def test_stop_signals_handler_repeats_and_second_ctrl_c(monkeypatch):
    stop = pa.StopSignals()
    assert not stop
    exits = []
    monkeypatch.setattr(pa.os, "_exit", lambda code: exits.append(code))
    stop._handle(signal.SIGUSR1, None)
    stop._handle(signal.SIGTERM, None)  # Slurm signals every process of a job: a repeat is not an emergency
    assert stop and stop.signum == signal.SIGUSR1 and exits == []
    stop._handle(signal.SIGINT, None)  # a second Ctrl-C: a person who will not wait
    assert exits == [130]


@pytest.mark.parametrize("path, sig", [("wrappers", signal.SIGTERM), ("ale-vector", signal.SIGINT),
                                       ("async-envs", signal.SIGINT)],
                         ids=["wrappers-SIGTERM", "ale-vector-SIGINT", "async-envs-SIGINT-to-the-group"])
def test_signal_to_a_real_process(path, sig, tmp_path):
    """The whole path through a real process, its output in a pipe: progress lines, then a clean stop. On
    ale-vector the games run in C++ threads: the signal must still reach the handler, and the env close.
    With --async-envs, Ctrl-C reaches the env workers too (the terminal signals the whole process group):
    they must keep serving until the training process has its checkpoint."""
    env_flags = ["--async-envs"] if path == "async-envs" else ["--env-path", path]
    cmd = [sys.executable, str(REPO_ROOT / f"{SCRIPT}.py"), "--total-timesteps", 1_000_000, "--num-envs", 2,
           "--num-steps", 32, "--progress-interval", 0, "--no-cuda", *env_flags]
    proc = subprocess.Popen(list(map(str, cmd)), cwd=tmp_path, env=script_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = proc.stdout.readline()  # the start line
        assert first.startswith(f"{SCRIPT}: {BREAKOUT}"), first + proc.stderr.read()
        assert proc.stdout.readline().startswith("step 64/")  # training: the handlers are in place
        if path == "async-envs":
            # A worker told twice to stop ignores it (a second Ctrl-C would end a trainer at once) ...
            for worker in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
                os.kill(int(worker), signal.SIGINT)
                os.kill(int(worker), signal.SIGINT)
            time.sleep(1)
            os.killpg(proc.pid, sig)  # ... and the terminal's Ctrl-C to the whole group stops the run cleanly
        else:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, err
    assert err == "" and "Traceback" not in out
    stop = [line for line in out.splitlines() if f"stopped by {sig.name}" in line]
    assert len(stop) == 1 and "--resume" in stop[0]
    step = int(re.search(r"at step (\d+)", stop[0])[1])
    ckpt = torch.load(only_run_dir(tmp_path) / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == step and step % 64 == 0 and 64 <= step < 1_000_000


def test_async_env_workers_go_quietly_with_a_killed_trainer(tmp_path):
    """SIGKILL (a dead node, the OOM killer) to the training process: no worker is left behind, none complains."""
    cmd = [sys.executable, str(REPO_ROOT / f"{SCRIPT}.py"), "--total-timesteps", 1_000_000, "--num-envs", 2,
           "--num-steps", 32, "--progress-interval", 0, "--no-cuda", "--async-envs"]
    proc = subprocess.Popen(list(map(str, cmd)), cwd=tmp_path, env=script_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"{SCRIPT}: {BREAKOUT}")
        assert proc.stdout.readline().startswith("step 64/")
        workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(workers) == 2
        proc.kill()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    for _ in range(100):
        if not any(running(w) for w in workers):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"env workers {workers} outlived the trainer")
    assert err == ""


def test_evaluation_videos_are_the_whole_games_played(tmp_path, monkeypatch):
    """Recorded on the raw emulator: one video per evaluated game, each with every frame of the game."""
    frames_per_game = []

    def count_frame(reward):
        frames_per_game[-1] += 1

    # A game's first frame is its reset's.
    tap_evaluation_emulator(monkeypatch, on_reset=lambda: frames_per_game.append(1), on_step=count_frame)
    torch.manual_seed(0)
    agent = pa.Agent(4)  # untrained: loses its lives quickly
    scores = list(pa.play_games(agent, BREAKOUT, 2, False, 3, torch.device("cpu"), 0.0, video_dir=str(tmp_path / "v")))
    assert len(scores) == 2 and len(frames_per_game) == 2  # no third game started after the last
    assert [frames for _, frames in scores] == [frames - 1 for frames in frames_per_game]  # its length: the steps
    videos = sorted((tmp_path / "v").glob("*.mp4"))
    assert [v.name for v in videos] == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4"]
    for video, frames in zip(videos, frames_per_game):
        assert video_frames(video) == frames > 100  # every frame of a whole game (5 lives), no life cut it short


def test_videos_are_written_as_games_are_played(tmp_path):
    """A recorded game goes to its mp4 frame by frame instead of waiting in memory for the game's end (a game
    that runs to the 108k-frame cap would hold about 11 GB): 1,000 frames played hold far less than the
    100 MB they take, and a process that dies mid-game (a timeout, a lost machine) leaves a video of every frame."""
    def resident_bytes():  # of this process: the frames live in ale-py's arrays, which tracemalloc does not see
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    env = pa.make_env(PONG, 0, True, str(tmp_path / "here"), 0.0, every_game=True)()
    env.reset(seed=0)
    for _ in range(50):  # the video is started
        env.step(0)
    before = resident_bytes()
    for _ in range(250):  # 1,000 frames of 210 x 160 x 3 bytes; no Pong game ends this soon
        env.step(0)
    assert resident_bytes() - before < 20e6
    env.close()

    # A process that plays 200 steps and then dies, killed in the middle of its game.
    code = (f"import sys; sys.path.insert(0, {str(REPO_ROOT / 'tests')!r}); from conftest import load_script\n"
            f"pa = load_script({SCRIPT!r})\n"
            f"env = pa.make_env({PONG!r}, 0, True, {str(tmp_path / 'killed')!r}, 0.0, every_game=True)()\n"
            "env.reset(seed=0)\n"
            "for _ in range(200): env.step(0)\n"
            "recorder = env\n"
            "while not isinstance(recorder, pa.gym.wrappers.RecordVideo): recorder = recorder.env\n"
            "print(env.unwrapped.ale.getEpisodeFrameNumber(), recorder.writer.proc.pid, flush=True)\n"
            "import time; time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=script_env(), stdout=subprocess.PIPE,
                            text=True)
    try:
        frames, encoder = map(int, proc.stdout.readline().split())
    finally:
        proc.kill()
        proc.wait()
    for _ in range(300):  # the encoder reads what was sent, then finishes the file and exits
        if not running(encoder):
            break
        time.sleep(0.1)
    assert video_frames(tmp_path / "killed" / "rl-video-episode-0.mp4") == frames + 1 > 800  # and the reset's


def test_evaluation_records_every_game_quietly(trained, tmp_path):
    """--eval-checkpoint --capture-video, here of a policy trained on ale-vector: evaluation plays through the
    wrappers, so it records; no SDL or ALE noise on stderr without a display."""
    result, cwd = trained["ale-vector"]
    assert_ok(result)
    run_dir = only_run_dir(cwd)
    env = script_env()
    env.pop("SDL_VIDEODRIVER", None)
    env.pop("XDG_RUNTIME_DIR", None)
    evaluated = run_script(SCRIPT, "--eval-checkpoint", run_dir / "checkpoint.pt", "--eval-episodes", 2,
                           "--capture-video", "--no-cuda", cwd=tmp_path, env=env)
    assert_ok(evaluated)
    assert evaluated.stderr == ""
    videos = tmp_path / "videos" / run_dir.name / "eval-at-step-512"
    assert sorted(p.name for p in videos.glob("*.mp4")) == [f"rl-video-episode-{i}.mp4" for i in range(2)]
    assert f"videos of the 2 games in videos/{run_dir.name}/eval-at-step-512" in evaluated.stdout
    assert not (tmp_path / "runs").exists()


def test_older_checkpoint_may_not_resume_over_a_newer_one(trained, tmp_path, monkeypatch, capsys):
    """A copy kept from an earlier step, resumed, would overwrite the run's newer checkpoint.pt: refused."""
    result, cwd = trained["ale-vector"]
    assert_ok(result)
    run_dir = tmp_path / "runs" / only_run_dir(cwd).name
    shutil.copytree(only_run_dir(cwd), run_dir)
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    ckpt["iteration"], ckpt["global_step"] = 1, 256
    for older in (run_dir / "ckpt-early.pt", tmp_path / "elsewhere.pt"):  # in the run folder, or a copy resuming there
        torch.save(ckpt, older)
        error = fail_line(["--resume", older], tmp_path, monkeypatch, capsys)
        assert "past the step 256 of" in error and "move it away" in error, error
