#!/bin/bash
# The idle-machine thread-layout measurement (#24): per-call times of the rollout's inference and of one
# training minibatch at 1 and 2 torch threads, one step of the 8 envs, and torchrun's gradient all_reduce.
# Run with nothing else busy: benchmarks/results/throughput/thread_layout_2026-12-01/run.sh > out.txt
cd "$(dirname "$0")"
repo=$(git rev-parse --show-toplevel)
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD); load: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in 1 2 3; do OMP_WAIT_POLICY=PASSIVE python micro.py "$repo/ppo_atari.py"; done
python -m torch.distributed.run --standalone --nproc-per-node=2 allreduce.py "$repo/ppo_atari.py" 2>&1 | grep all_reduce
echo "# end $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)"
