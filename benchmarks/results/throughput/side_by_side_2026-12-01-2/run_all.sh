#!/usr/bin/env bash
# The side-by-side timings of 2026-12-01 (second sitting), on the idle machine. Each workload in its own folder.
set -u
AB=/work/shared/tools/abtime
CL=/work/scratch/cleanrl
M=/work/main
cd /tmp/speed
w() { name=$1; shift; mkdir -p $name; (cd $name && echo "# $(date -u +%FT%TZ) $name" && echo "# $*" && $AB "$@"; echo "# end $(date -u +%FT%TZ)") 2>&1 | tee $name/abtime.txt; }
w cartpole -n 3 -w 99840 -- python $CL/ppo.py --total-timesteps 100000 ::: python $M/ppo_discrete.py --total-timesteps 100000
w cartpole_sb3 -n 3 -w 100352 -- /work/scratch/sb3venv/bin/python /work/scratch/sb3_cartpole.py 100000 1 ::: python $M/ppo_discrete.py --total-timesteps 100352
w cartpole_before_after -n 3 -w 99840 -- python /tmp/eq_old/ppo_discrete.py --total-timesteps 100000 ::: python $M/ppo_discrete.py --total-timesteps 100000
w halfcheetah -n 3 -w 61440 -- python $CL/ppo_continuous_action.py --env-id HalfCheetah-v5 --total-timesteps 61440 ::: python $M/ppo_continuous.py --env-id HalfCheetah-v5 --total-timesteps 61440
w breakout -n 3 -w 20480 -- python $CL/ppo_atari.py --total-timesteps 20480 --no-cuda ::: python $M/ppo_atari.py --no-cuda --total-timesteps 20480
w breakout_bf16 -n 3 -w 20480 -- python $CL/ppo_atari.py --total-timesteps 20480 --no-cuda ::: python $M/ppo_atari.py --no-cuda --bf16 --total-timesteps 20480
w breakout_torchrun -n 3 -w 20480 -- python $M/ppo_atari.py --no-cuda --threads 1 --total-timesteps 20480 ::: python -m torch.distributed.run --standalone --nproc-per-node 2 $M/ppo_atari.py --no-cuda --total-timesteps 20480
w breakout_spin_idle -n 3 -w 10240 -- env OMP_WAIT_POLICY=ACTIVE python $M/ppo_atari.py --no-cuda --total-timesteps 10240 ::: python $M/ppo_atari.py --no-cuda --total-timesteps 10240
echo "# all done $(date -u +%FT%TZ)"
