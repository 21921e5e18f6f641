"""Time one training minibatch of ppo_atari.py's network (256 samples, forward + backward + Adam step, one
thread), with the default NCHW layout and with channels-last weights and inputs.

    python benchmarks/results/throughput/minibatch_layout.py
    python benchmarks/results/throughput/minibatch_layout.py --bfloat16

With --bfloat16, both channels-last, twice each: float32, and the network's forward pass under CPU autocast to
bfloat16 (the losses in float32). That is a measurement for the speed issue, not a feature of the script:
bfloat16 changes the arithmetic, so it would need its own learning benchmark before any run used it, and it
helps only on a CPU with bfloat16 instructions (`lscpu` lists avx512_bf16 or amx_bf16).

Run from the repository root on an otherwise idle machine. Prints the mean time of 8 minibatches after 2 warm-up ones.
"""
import importlib.util
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
compare_bfloat16 = "--bfloat16" in sys.argv[1:]
sys.argv = ["ppo_atari.py"]
spec = importlib.util.spec_from_file_location("ppo_atari", Path(__file__).resolve().parents[3] / "ppo_atari.py")
ppo_atari = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ppo_atari)


def time_minibatch(channels_last, bfloat16=False):
    torch.manual_seed(0)
    agent = ppo_atari.Agent(4)  # stores itself channels-last; put it back to NCHW for the default layout
    layout = torch.channels_last if channels_last else torch.contiguous_format
    agent = agent.to(memory_format=layout)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-4, eps=1e-5)
    obs = torch.randint(0, 255, (256, 4, 84, 84), dtype=torch.uint8).contiguous(memory_format=layout)
    actions = torch.randint(0, 4, (256,))

    def one():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            hidden = agent.network(obs.float() / 255.0)  # the layout under test, not Agent.features' own
            logits, value = agent.actor(hidden), agent.critic(hidden)
        logprob = torch.distributions.Categorical(logits=logits.float()).log_prob(actions)  # no-op in float32
        (logprob.mean() + value.float().mean()).backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(2):
        one()
    start = time.perf_counter()
    for _ in range(8):
        one()
    return (time.perf_counter() - start) / 8


if compare_bfloat16:
    for _ in range(2):
        for bfloat16 in (False, True):
            name = "bfloat16 autocast" if bfloat16 else "float32"
            print(f"{name}: {time_minibatch(True, bfloat16) * 1000:.1f} ms per minibatch")
else:
    for channels_last in (False, True):
        print(f"channels_last={channels_last}: {time_minibatch(channels_last) * 1000:.1f} ms per minibatch")
