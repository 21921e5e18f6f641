"""Time one training minibatch of ppo_atari.py's network (256 samples, forward + backward + Adam step, one
thread, channels-last as the script stores it) in float32, and with the network's forward pass under CPU
autocast to bfloat16 (the losses in float32). A measurement for the speed issue, not a feature of the script:
bfloat16 changes the arithmetic, so it would need its own learning benchmark before any run used it.

    python benchmarks/results/throughput/minibatch_bf16.py

Run from the repository root on an otherwise idle machine; it helps only on a CPU with bfloat16 instructions
(`lscpu` lists avx512_bf16 or amx_bf16). Prints the mean time of 8 minibatches after 2 warm-up ones, twice.
"""
import importlib.util
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.argv = ["ppo_atari.py"]
spec = importlib.util.spec_from_file_location("ppo_atari", Path(__file__).resolve().parents[3] / "ppo_atari.py")
ppo_atari = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ppo_atari)


def time_minibatch(bfloat16):
    torch.manual_seed(0)
    agent = ppo_atari.Agent(4)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-4, eps=1e-5)
    obs = torch.randint(0, 255, (256, 4, 84, 84), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    actions = torch.randint(0, 4, (256,))

    def one():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            hidden = agent.network(obs.float() / 255.0)
            logits, value = agent.actor(hidden), agent.critic(hidden)
        logprob = torch.distributions.Categorical(logits=logits.float()).log_prob(actions)
        (logprob.mean() + value.float().mean()).backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(2):
        one()
    start = time.perf_counter()
    for _ in range(8):
        one()
    return (time.perf_counter() - start) / 8


for _ in range(2):
    for bfloat16 in (False, True):
        print(f"{'bfloat16 autocast' if bfloat16 else 'float32'}: {time_minibatch(bfloat16) * 1000:.1f} ms per minibatch")
