"""Per-call times of ppo_atari.py's two hot paths at 1 and 2 torch threads: the rollout's inference (a batch of
8 frame stacks, no grad) and one training minibatch (256 samples: forward, backward, clip, Adam), float32 and
bf16 autocast. Medians of repeated calls, after warm-up."""
import contextlib, importlib.util, statistics, sys, time
import torch, torch.nn as nn
spec = importlib.util.spec_from_file_location("pa", sys.argv[1]); pa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pa)
torch.manual_seed(0)
agent = pa.Agent(4)
opt = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=True)
roll = torch.randint(0, 256, (8, 84, 84, 4), dtype=torch.uint8).permute(0, 3, 1, 2)
mb = torch.randint(0, 256, (256, 84, 84, 4), dtype=torch.uint8).permute(0, 3, 1, 2)
act = torch.randint(0, 4, (256,))
def infer(ctx):
    with torch.inference_mode(), ctx:
        agent.get_action_and_value(roll)
def update(ctx):
    with ctx:
        _, lp, ent, v = agent.get_action_and_value(mb, act)
    loss = -(lp.mean()) + v.pow(2).mean() - 0.01 * ent.mean()
    opt.zero_grad(); loss.backward(); nn.utils.clip_grad_norm_(agent.parameters(), 0.5); opt.step()
def timed(f, ctx, n):
    for _ in range(3): f(ctx)
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(ctx); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3
for threads in (1, 2):
    torch.set_num_threads(threads)
    for name, ctx in (("fp32", contextlib.nullcontext()), ("bf16", torch.autocast("cpu", dtype=torch.bfloat16))):
        print(f"threads {threads} {name}: rollout inference (8) {timed(infer, ctx, 200):.2f} ms, "
              f"minibatch update (256) {timed(update, ctx, 15):.1f} ms", flush=True)
# The envs' share: one step of the default 8 Breakout envs (the default env path), random actions.
import numpy as np
args = pa.Args(cuda=False, repeat_action_probability=0.0)
envs = pa.make_training_envs(args, args.num_envs, 0, None)
envs.reset(seed=1)
acts = np.random.default_rng(0).integers(0, 4, (300, args.num_envs))
for a in acts[:20]: envs.step(a)
ts = []
for a in acts[20:]:
    t = time.perf_counter(); envs.step(a); ts.append(time.perf_counter() - t)
print(f"env step ({args.num_envs} envs, {args.env_path}): {statistics.median(ts) * 1e3:.2f} ms", flush=True)
envs.close()
