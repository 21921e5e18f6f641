"""Where benchmarks/sweep.sh keeps a sweep's runs, written down once: sweep.sh, compare.py, fault_injection.py and
tune.py all read the layout from here.

    OUTDIR/SCRIPT/VARIANT/sweep_args             the variant's extra arguments to the script, as sweep.sh quoted them
    OUTDIR/SCRIPT/VARIANT/sweeps.log             every sweep.sh command line that touched the variant
    OUTDIR/SCRIPT/VARIANT/ENV/seedN/log.txt      the run's output; line 1 is its exact command
    OUTDIR/SCRIPT/VARIANT/ENV/seedN/runs/RUN/    what the script writes: events, checkpoint.pt, checkpoint.json
    OUTDIR/SCRIPT/VARIANT/ENV/seedN/done         written by sweep.sh only after the run exited 0

ENV is the env id with '/' written '_' (ALE/Breakout-v5 -> ALE_Breakout-v5), as the scripts write it in RUN.
What a stopped run reached is read from its checkpoint's `checkpoint.json` (the scripts write it beside
checkpoint.pt), not from its log.

For sweep.sh (one line each, tab-separated):
    python benchmarks/layout.py variant-dir OUTDIR SCRIPT VARIANT                               -> DIR
    python benchmarks/layout.py seed-dirs OUTDIR SCRIPT VARIANT ENV[,ENV...] SEED[,SEED...]   -> ENV SEED DIR
    python benchmarks/layout.py has-progress VARIANT_DIR             -> exit 0 if a run finished or checkpointed
    python benchmarks/layout.py checkpoint SEED_DIR                  -> PATH STEP of its checkpoint, or nothing
"""

import json
import sys
from pathlib import Path

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_STATUS = "checkpoint.json"  # {"global_step": ..., "iteration": ..., "total_timesteps": ...}


def variant_dir(outdir, script, variant):
    return Path(outdir) / script / variant


def seed_dir(outdir, script, variant, env, seed):
    return variant_dir(outdir, script, variant) / env.replace("/", "_") / f"seed{seed}"


def parse_seed_dir(path):
    """(outdir, script, variant, env folder, seed) of a path OUTDIR/SCRIPT/VARIANT/ENV/seedN, or None."""
    path = Path(path)
    if len(path.parts) < 5 or not path.name.startswith("seed") or not path.name[4:].lstrip("-").isdigit():
        return None
    env_d = path.parent
    variant_d = env_d.parent
    return variant_d.parent.parent, variant_d.parent.name, variant_d.name, env_d.name, int(path.name[4:])


def sweep_args(outdir, script, variant):
    """The extra arguments the variant was swept with (as sweep.sh quoted them), or None outside a sweep."""
    f = variant_dir(outdir, script, variant) / "sweep_args"
    return f.read_text() if f.is_file() else None


def is_done(directory):
    return (Path(directory) / "done").exists()


def has_progress(vdir):
    """Whether any run of a variant finished or got as far as a checkpoint (else nothing of it is worth keeping)."""
    vdir = Path(vdir)
    return any(vdir.glob("*/seed*/done")) or any(vdir.glob(f"*/seed*/runs/*/{CHECKPOINT}"))


def checkpoint(directory):
    """(path, step) of the newest checkpoint under a seed directory, or None. The step is checkpoint.json's;
    a checkpoint written before the scripts wrote that file is asked itself (a slower torch.load)."""
    found = sorted(Path(directory).glob(f"runs/*/{CHECKPOINT}"), key=lambda p: p.stat().st_mtime)
    if not found:
        return None
    path = found[-1]
    status = path.parent / CHECKPOINT_STATUS
    try:  # written just after the checkpoint: one older than it is from the checkpoint before (a kill between)
        if status.stat().st_mtime >= path.stat().st_mtime:
            return path, int(json.loads(status.read_text())["global_step"])
    except (OSError, ValueError, KeyError):
        pass
    try:
        import torch

        return path, int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])
    except Exception:  # damaged or foreign: the script itself will say so when it is resumed from it
        return path, None


def main(argv):
    if len(argv) == 4 and argv[0] == "variant-dir":
        print(variant_dir(*argv[1:]))
        return 0
    if len(argv) == 6 and argv[0] == "seed-dirs":
        outdir, script, variant, envs, seeds = argv[1:]
        for env in envs.split(","):
            for seed in seeds.split(","):
                print(f"{env}\t{seed}\t{seed_dir(outdir, script, variant, env, seed)}")
        return 0
    if len(argv) == 2 and argv[0] == "has-progress":
        return 0 if has_progress(argv[1]) else 1
    if len(argv) == 2 and argv[0] == "checkpoint":
        found = checkpoint(argv[1])
        if found is not None:
            print(f"{found[0]}\t{'' if found[1] is None else found[1]}")
        return 0
    print(f"usage: {__doc__.rsplit('For sweep.sh', 1)[1].strip()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
