"""The score of a random policy: uniform actions from the action space, a number of whole episodes per env.

    python benchmarks/random_policy.py Hopper-v5 Walker2d-v5 --episodes 100 --out random.json

The normalised scores of the PPO paper's Table 1 put a random policy at 0 and the best setting at 1; this gives
the 0. Each env's episodes are seeded 0, 1, 2, ... and its action sampler with 0, so the figures reproduce.
Prints one line per env (mean and std of the returns) and, with --out, writes them as JSON
({env: {"mean", "std", "episodes"}}).
"""

import argparse
import contextlib
import json
import sys
import tempfile

import gymnasium as gym
import numpy as np


def random_returns(env_id, episodes):
    # Made in a scratch folder: MuJoCo's model compiler writes MUJOCO_LOG.TXT into the working directory.
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        env = gym.make(env_id)
    env.action_space.seed(0)
    returns = []
    for episode in range(episodes):
        env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env_ids", nargs="+")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args()
    if args.episodes < 1:
        print("error: --episodes must be >= 1", file=sys.stderr)
        return 2
    figures = {}
    for env_id in args.env_ids:
        returns = random_returns(env_id, args.episodes)
        figures[env_id] = {"mean": float(np.mean(returns)), "std": float(np.std(returns)), "episodes": len(returns)}
        print(f"{env_id}: {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} episodes", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
