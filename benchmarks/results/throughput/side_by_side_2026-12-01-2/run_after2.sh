#!/usr/bin/env bash
while pgrep -f "run_all.sh|run_after.sh" > /dev/null; do sleep 5; done
cd /tmp/speed && mkdir -p breakout_torchrun_bf16 && cd breakout_torchrun_bf16
echo "# $(date -u +%FT%TZ) breakout_torchrun_bf16"
/work/shared/tools/abtime -n 3 -w 20480 -- python /work/scratch/cleanrl/ppo_atari.py --total-timesteps 20480 --no-cuda ::: python -m torch.distributed.run --standalone --nproc-per-node 2 /work/main/ppo_atari.py --no-cuda --bf16 --total-timesteps 20480
echo "# end $(date -u +%FT%TZ)"
