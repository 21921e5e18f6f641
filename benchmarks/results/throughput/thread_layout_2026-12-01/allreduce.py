"""What torchrun's gradient average costs: one flat all_reduce of ppo_atari.py's gradient (every parameter of
the Nature CNN), gloo, 2 CPU processes, one thread each; median of 50 after warm-up."""
import importlib.util, statistics, sys, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
spec = importlib.util.spec_from_file_location("pa", sys.argv[1]); pa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pa)
n = sum(p.numel() for p in pa.Agent(4).parameters())
dist.init_process_group("gloo")
flat = torch.randn(n)
for _ in range(5): dist.all_reduce(flat)
ts = []
for _ in range(50):
    dist.barrier(); t = time.perf_counter(); dist.all_reduce(flat); ts.append(time.perf_counter() - t)
if dist.get_rank() == 0:
    print(f"all_reduce of {n:,} floats ({n * 4 / 1e6:.1f} MB): {statistics.median(ts) * 1e3:.2f} ms (median of 50)")
dist.destroy_process_group()
