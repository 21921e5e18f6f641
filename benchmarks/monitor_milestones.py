"""Where a published run's learning curve reaches given scores, read from the Monitor files of its envs.

    python benchmarks/monitor_milestones.py FOLDER --milestones 100,200,300 [--at 1e6,2e6] [--frameskip N]

Stable-Baselines3 (and its RL Zoo) write one `N.monitor.csv` per env of a vectorised run: a JSON comment line,
then `r,l,t`, then one line per whole game: its return, its length in the frames of the env the Monitor wraps
(for Atari, the emulator's: NoFrameskip), and the seconds since the start. The envs step in lockstep, so a game
that ends at env N's F-th frame ends at about agent step (number of envs) * F / frameskip of the whole run. The
frames of resets (no-ops, FIRE) count too, so these steps run slightly ahead of the agent's; the line "frames /
frameskip" says by how much over the whole run. The games of all envs are put in that order, and the score at a
game is the mean of the last --window games, as `compare.py --milestones` computes it for our runs. Prints the
games read, the final score (the mean of the last --window games), the step where the score first reaches
each milestone ("not reached" if never), and with --at the score at each given step (the mean of the last
--window games that ended by then). Exits 2 with an `error:` line on bad input.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (first_reached_at, fmt_steps, milestone_scores, monitor_curve, monitor_frameskip,  # noqa: E402
                     read_monitors)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("folder", help="the folder of a run's N.monitor.csv files")
    p.add_argument("--milestones", type=milestone_scores, default=(),
                   help="scores, comma-separated: where the curve first reaches each")
    p.add_argument("--at", type=milestone_scores, default=(),
                   help="steps, comma-separated (e.g. 1e6,2e6): the score at each")
    p.add_argument("--frameskip", type=int,
                   help="frames per agent step (default: 4 where the folder is named after a NoFrameskip Atari id, "
                        "as compare.py --monitor-curve reads it; else 1)")
    p.add_argument("--window", type=int, default=100, help="games per score (default: %(default)s)")
    args = p.parse_args(argv)
    if args.frameskip is None:
        args.frameskip = monitor_frameskip(Path(args.folder).resolve().name)
    if args.frameskip < 1 or args.window < 1:
        p.error("--frameskip and --window must be positive")
    try:
        envs = read_monitors(args.folder)
    except (OSError, ValueError) as e:
        print(f"monitor_milestones.py: error: {e}", file=sys.stderr)
        return 2
    steps, returns = monitor_curve(envs, args.frameskip)
    if len(returns) < args.window:
        print(f"monitor_milestones.py: error: {len(returns)} games, fewer than --window {args.window}", file=sys.stderr)
        return 2
    frames = sum(f[-1] for f, _ in envs)
    print(f"{len(envs)} envs, {len(returns)} games; frames / frameskip: {frames / args.frameskip:.0f}")
    print(f"last {args.window} games: {returns[-args.window:].mean():.2f}")
    for score, i in zip(args.milestones, first_reached_at(returns, args.milestones, args.window)):
        print(f"{score:g}: " + ("not reached" if i is None else f"{fmt_steps(int(steps[i]))} steps"))
    for step in args.at:
        ended = np.searchsorted(steps, step, side="right")  # games that ended by then
        print(f"at {fmt_steps(int(step))}: " + (f"{returns[ended - args.window:ended].mean():.2f}"
                                                if ended >= args.window else f"fewer than {args.window} games"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
