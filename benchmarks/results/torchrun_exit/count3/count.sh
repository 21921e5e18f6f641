#!/usr/bin/env bash
# Exit status of short two-process torchrun runs, one after another, each in a fresh folder.
cd /tmp/trx2
for i in $(seq 1 15); do
  mkdir -p run$i && cd run$i
  OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc-per-node 2 /work/main/ppo_atari.py --no-cuda --total-timesteps 4096 --save-model > log.txt 2>&1
  echo "run $i exit $? $(date -u +%T)" | tee -a ../counts.txt
  cd ..
done
