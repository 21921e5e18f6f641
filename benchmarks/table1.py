"""The PPO paper's Table 1 (Schulman et al. 2017, section 6.1) from our runs: normalised scores per setting.

    python benchmarks/table1.py benchmarks/results/mujoco_v5/sweeps benchmarks/results/table1/sweeps \\
        --random benchmarks/results/table1/random_policy.json --out benchmarks/results/table1/table1.md

Reads the finished `ppo_continuous.py` runs of the sweeps given (benchmarks/compare.py reads them, so a run's
return is the project's figure: the mean of its last 100 training episodes), on the paper's 7 envs, under the
variant names of the grid (SETTINGS; `default` is clipping with ε = 0.2). As the paper computes it: per env, a
run's normalised score is (return - random) / (best - random), random being a uniform-random policy's mean
return (100 episodes, --random) and best the best setting's mean return on that env (the paper does not say how
"best" is taken; here it is the highest mean over seeds among the settings in the table, so the figures move as
settings are added); a setting's score is the mean over all its runs (7 envs x 3 seeds = 21 when complete).
Beside it: the paper's figure, the interquartile mean over the runs with its 95% bootstrap interval, and per env
the mean returns. A setting with fewer runs than the others says so.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402

ENVS = ["HalfCheetah-v5", "Hopper-v5", "InvertedDoublePendulum-v5", "InvertedPendulum-v5", "Reacher-v5",
        "Swimmer-v5", "Walker2d-v5"]
# variant -> (the paper's name of the setting, its Table 1 score)
SETTINGS = {
    "noclip": ("no clipping or penalty", -0.39),
    "clip-0.1": ("clipping, ε = 0.1", 0.76),
    "default": ("clipping, ε = 0.2", 0.82),
    "clip-0.3": ("clipping, ε = 0.3", 0.70),
    "adaptive-kl-0.003": ("adaptive KL, d_targ = 0.003", 0.68),
    "adaptive-kl-0.01": ("adaptive KL, d_targ = 0.01", 0.74),
    "adaptive-kl-0.03": ("adaptive KL, d_targ = 0.03", 0.71),
    "fixed-kl-0.3": ("fixed KL, β = 0.3", 0.62),
    "fixed-kl-1": ("fixed KL, β = 1", 0.71),
    "fixed-kl-3": ("fixed KL, β = 3", 0.72),
    "fixed-kl-10": ("fixed KL, β = 10", 0.69),
    "noclip-vloss": ("clipping, ε = 0.2, no value clipping (not in the paper)", None),
}


def table(logdirs, random, resamples=2000, seed=0):
    runs = [r for r in compare.find_runs(logdirs, envs=ENVS, variants=list(SETTINGS))
            if r.script == "ppo_continuous"]
    returns = {}  # (variant, env) -> [run returns]
    for r in sorted(runs, key=lambda r: (r.variant, r.env, r.seed)):
        returns.setdefault((r.variant, r.env), []).append(compare.run_return(r.returns))
    variants = [v for v in SETTINGS if any(key[0] == v for key in returns)]
    envs = [e for e in ENVS if any(key[1] == e for key in returns)]
    best = {e: max((np.mean(returns[(v, e)]), v) for v in variants if (v, e) in returns) for e in envs}
    scores = {v: [(ret - random[e]) / (best[e][0] - random[e]) for e in envs for ret in returns.get((v, e), [])]
              for v in variants}
    most = max(len(s) for s in scores.values())
    lines = ["| setting | paper | ours: mean normalised score | IQM [95% CI] | runs |", "|---|---|---|---|---|"]
    for v in variants:
        name, paper = SETTINGS[v]
        s = np.array(scores[v])
        ci = compare.bootstrap_ci([s], lambda x, axis: compare.iqm(x, axis=axis), resamples, seed)
        interval = f" [{compare.fmt(ci[0])}, {compare.fmt(ci[1])}]" if len(s) >= compare.MIN_SEEDS_FOR_CI else ""
        short = f" (of {most})" if len(s) < most else ""
        lines.append(f"| {name} (`{v}`) | {'' if paper is None else f'{paper:.2f}'} | {np.mean(s):.2f} "
                     f"| {compare.fmt(float(compare.iqm(s)))}{interval} | {len(s)}{short} |")
    lines += ["", "Mean return over seeds per env (seeds), the random policy's, and the best setting's, which set the 0 "
              "and the 1:", "",
              "| env | random | best | " + " | ".join(f"`{v}`" for v in variants) + " |",
              "|---|---|---|" + "---|" * len(variants)]
    for e in envs:
        cells = [f"{np.mean(returns[(v, e)]):.2f} ({len(returns[(v, e)])})" if (v, e) in returns else ""
                 for v in variants]
        lines.append(f"| {e} | {random[e]:.2f} | `{best[e][1]}` | " + " | ".join(cells) + " |")
    missing = [e for e in ENVS if e not in envs]
    if missing:
        lines += ["", f"No finished run yet on {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("logdirs", nargs="+", help="sweep folders of ppo_continuous.py runs")
    p.add_argument("--random", required=True, help="random_policy.py's JSON of the envs")
    p.add_argument("--out", help="write the table here too")
    p.add_argument("--resamples", type=int, default=2000)
    args = p.parse_args(argv)
    random = {env: figure["mean"] for env, figure in json.loads(Path(args.random).read_text()).items()}
    try:
        text = table(args.logdirs, random, args.resamples)
    except compare.CompareError as e:
        print(f"table1.py: error: {e}", file=sys.stderr)
        return 1
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
