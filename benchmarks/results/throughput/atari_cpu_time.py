"""Where one ppo_atari.py run spends its CPU time, by part: imports, set-up, the environments, the network's
forward passes (rollout and training apart), backward passes, Adam, and the rest of the loop.

    python benchmarks/results/throughput/atari_cpu_time.py [STEPS]    # default 20480

Run from the repository root. It runs ppo_atari.py's own main() (BreakoutNoFrameskip-v4, seed 5, one torch thread,
--no-cuda, into a temporary folder) with timers around those parts. The timers read the process's CPU time, not
the wall clock, so other work on the machine changes the figures less than it would change a wall time (it still
changes them: the CPUs' caches and cores are shared); the shares are what to read.
"""
import contextlib
import importlib.util
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20480
spent = defaultdict(float)
start = time.process_time()

spec = importlib.util.spec_from_file_location("ppo_atari", Path(__file__).resolve().parents[3] / "ppo_atari.py")
ppo_atari = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ppo_atari)
spent["imports (torch, gymnasium, ale-py, ...)"] = time.process_time() - start
torch, gym = ppo_atari.torch, ppo_atari.gym


def timed(owner, name, part):
    """Replace owner.name by a wrapper that adds its CPU time to `part` (a function of the call, or a str)."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        began = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[part() if callable(part) else part] += time.process_time() - began

    setattr(owner, name, wrapper)


timed(ppo_atari.Agent, "features", lambda: "network forward, rollout" if torch.is_inference_mode_enabled()
      else "network forward, training")
timed(torch.Tensor, "backward", "network backward")
timed(torch.optim.Adam, "__init__", "Adam set-up (its first use imports torch._dynamo)")
timed(torch.optim.Adam, "step", "Adam step")
timed(ppo_atari, "make_training_envs", "envs: creation")
timed(gym.vector.SyncVectorEnv, "reset", "envs: first reset (loads each game again)")
timed(gym.vector.SyncVectorEnv, "step", "envs: steps (emulator, wrappers, frame stack)")

sys.argv = ["ppo_atari.py", "--no-cuda", "--threads", "1", "--seed", "5", "--total-timesteps", str(steps), "--no-progress"]
main_began = time.process_time()
with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch), \
        open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
    ppo_atari.main()
total = time.process_time() - start
spent["the rest of main (loop, GAE, losses, logging, ...)"] = time.process_time() - main_began - sum(
    t for part, t in spent.items() if not part.startswith("imports"))

print(f"ppo_atari.py, BreakoutNoFrameskip-v4, {steps} steps, one thread: {total:.1f} s of CPU time "
      f"({steps / total:.0f} steps per CPU second)")
for part, seconds in sorted(spent.items(), key=lambda item: -item[1]):
    print(f"  {seconds:7.1f} s  {100 * seconds / total:5.1f}%  {part}")
