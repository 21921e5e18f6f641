"""Fault injection: does a sweep survive being killed at random moments, and what does each kill cost?

It runs benchmarks/sweep.sh over a few short ppo_discrete.py runs (by default CartPole-v1 and Acrobot-v1,
seeds 1 and 2, 98,304 steps each in iterations of 512, a checkpoint every 4 iterations, two runs at a time)
and kills the sweep again and again, each time a random number of seconds after starting it (uniform from 2 to
16, seeded; the scripts take a few seconds to start, so some kills land while they import), by one of two
kinds (in pairs of one of each, in a random, seeded, order):

  SIGTERM  to the sweep's bash process: what Ctrl-C, `kill` or Slurm at a time limit does. The sweep passes
           it on; each run stops at its next safe point, writes a checkpoint of its last whole iteration and
           exits; the sweep exits 130.
  SIGKILL  to the sweep's whole process group: a dead node or the OOM killer. Nothing gets to save anything;
           the runs' last periodic checkpoints are all that is left.

After every kill it starts the same sweep command again (which resumes each unfinished run from its
checkpoint), until a segment ends by itself before its kill time: every run is done. (After --max-kills kills
it stops killing and lets the sweep finish.) The run length and the machine's speed set how many kills that
takes: on the two-core development machine, with a third training beside it, the runs were still going after
60 kills (the default cap), in 11 minutes. What it measures:

- kills survived, by kind, and runs completed (done markers; the final "done, N steps" line of each log);
- work lost: after each kill, for every run the kill interrupted, the last step the run reported minus the
  step of the checkpoint its next segment resumes from (0 when it had none and starts over). The runs print a
  progress line after every iteration (--progress-interval 0, flushed at once, so a SIGKILL cannot hide one),
  and the checkpoint's step is read from the checkpoint file itself right after the kill; the next segment's
  start line ("resuming at step N") is checked against it. This counts the whole iterations that have to be
  computed again; the partial rollout under way at the kill (less than one iteration) is lost too but is not
  in any log, so it is not counted. The raw TensorBoard event files give a second count, reported beside it:
  the iterations logged more than once (before TensorBoard's purge hides the copies a killed run logged past
  its checkpoint). It can only be lower, as events still in the writer's buffers die with a killed process;
- whether every checkpoint ever found (after every kill, every run's checkpoint.pt) loaded with torch.load,
  and how many half-written checkpoint.pt.tmp files kills left behind (harmless: the next write replaces
  them);
- whether every log.txt and event file is readable, and every run's step sequence complete: the steps of
  losses/value_loss (logged once per iteration) as TensorBoard shows them, with what a killed run logged past
  its checkpoint hidden by the resumed run's purge, are every iteration's step exactly once.

Targets: every run completes; no checkpoint or log is ever unreadable; every SIGKILL costs each run at most
one checkpoint interval (here 4 iterations, 2,048 steps); every SIGTERM costs no whole iteration.

Usage (from anywhere; about 10-12 minutes on two cores, with two trainings at a time):
    python benchmarks/fault_injection.py --out benchmarks/results/faults
It writes OUT/report.md (the summary), OUT/report.json (every kill, every interrupted run), OUT/sweep_output.txt
(what each sweep segment printed) and the sweep itself under OUT/sweeps/. OUT must not hold an earlier sweep.
"""

import argparse
import datetime
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layout  # noqa: E402  (where benchmarks/sweep.sh puts each run)

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "benchmarks" / "sweep.sh"
TAG = "losses/value_loss"  # logged once per iteration, at the iteration's last step


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "faults")
    p.add_argument("--envs", default="CartPole-v1,Acrobot-v1")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--total-timesteps", type=int, default=98304)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--checkpoint-every", type=int, default=4, help="iterations between checkpoints")
    p.add_argument("--max-kills", type=int, default=60, help="after this many kills, let the sweep finish")
    p.add_argument("--min-delay", type=float, default=2.0, help="seconds after a (re)start, at least ...")
    p.add_argument("--max-delay", type=float, default=16.0, help="... and at most, drawn uniformly")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill times and kinds")
    p.add_argument("-j", "--jobs", type=int, default=2, help="runs at once")
    args = p.parse_args()
    if args.total_timesteps % (args.num_envs * args.num_steps):
        p.error("--total-timesteps must be a whole number of iterations (num_envs * num_steps)")
    if not 0 < args.min_delay <= args.max_delay:
        p.error("need 0 < --min-delay <= --max-delay")
    return args


def processes_in(folder):
    """Pids of the processes whose working directory is in `folder` (a killed sweep's leftovers)."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and os.readlink(p / "cwd").startswith(str(folder)):
                found.append(int(p.name))
        except OSError:
            pass
    return found


def read_checkpoint_step(path):
    """The step a checkpoint holds, or None when it cannot be loaded (which must never happen)."""
    import torch

    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])
    except Exception as e:
        print(f"UNREADABLE checkpoint {path}: {type(e).__name__}: {e}", flush=True)
        return None


def segment_of(log_now, log_before):
    """What the run wrote to its log.txt during the last sweep segment ('' if nothing): the part appended
    to the log, or the whole log when the run started over (the sweep rewrites the log then)."""
    if log_now is None or log_now == log_before:
        return ""
    if log_before is not None and log_now.startswith(log_before):
        return log_now[len(log_before):]
    return log_now


def segment_steps(segment, expected_start):
    """(the step the segment started from, the last step it reported) from a segment of log.txt. A segment
    killed before the script printed its start line (still importing) computed nothing: it is taken to
    start, and end, where it was meant to."""
    if not re.search(r"^ppo_discrete: .* steps on ", segment, re.M):
        return expected_start, expected_start
    resumed = re.findall(r"resuming at step (\d+);", segment)
    start = int(resumed[-1]) if resumed else 0
    reported = [int(s) for s in re.findall(r"^step (\d+)/", segment, re.M)]
    return start, max(reported, default=start)


class Benchmark:
    def __init__(self, args):
        self.args = args
        self.out = args.out.resolve()
        self.sweeps = self.out / "sweeps"
        if self.sweeps.exists():
            sys.exit(f"{self.sweeps} exists: give a new --out (or delete it)")
        self.out.mkdir(parents=True, exist_ok=True)
        self.envs, self.seeds = args.envs.split(","), args.seeds.split(",")
        self.runs = [(env, int(seed)) for env in self.envs for seed in self.seeds]
        self.batch = args.num_envs * args.num_steps
        self.interval = args.checkpoint_every * self.batch
        self.cmd = ["bash", str(SWEEP), "-s", str(REPO / "ppo_discrete.py"), "-e", args.envs, "--seeds", args.seeds,
                    "-j", str(args.jobs), "-o", str(self.sweeps), "--",
                    "--total-timesteps", str(args.total_timesteps), "--num-envs", str(args.num_envs),
                    "--num-steps", str(args.num_steps), "--checkpoint-every", str(args.checkpoint_every),
                    "--progress-interval", "0"]
        self.kills, self.unreadable, self.mismatches = [], [], []
        self.checkpoints_loaded = self.tmp_files_seen = 0
        self.expected_start = {}  # run -> the step its next segment must start from

    def seed_dir(self, run):
        env, seed = run
        return layout.seed_dir(self.sweeps, "ppo_discrete", "default", env, seed)

    def logs(self):
        logs = {}
        for run in self.runs:
            try:
                logs[run] = (self.seed_dir(run) / "log.txt").read_bytes().decode("utf-8")
            except FileNotFoundError:
                logs[run] = None
            except UnicodeDecodeError as e:
                self.unreadable.append(f"{self.seed_dir(run)}/log.txt: {e}")
                logs[run] = None
        return logs

    def inspect(self, before, kind):
        """After a kill (kind) or the final segment (kind None): check and account every run's segment."""
        interrupted = []
        for run, log in self.logs().items():
            d = self.seed_dir(run)
            ckpt_step = 0
            for ckpt in d.glob("runs/*/checkpoint.pt"):
                self.checkpoints_loaded += 1
                step = read_checkpoint_step(ckpt)
                if step is None:
                    self.unreadable.append(str(ckpt))
                else:
                    ckpt_step = step
            self.tmp_files_seen += len(list(d.glob("runs/*/checkpoint.pt.tmp")))
            segment = segment_of(log, before[run])
            if not segment:
                continue  # not started again in this segment (still waiting for a free worker), or done before
            expected = self.expected_start.get(run, 0)
            start, last = segment_steps(segment, expected)
            if start != expected:
                self.mismatches.append(f"{run}: a segment started at step {start}, its checkpoint held {expected}")
            if kind is None or (d / "done").exists():
                continue  # it finished in this segment: nothing lost
            lost = last - ckpt_step
            self.expected_start[run] = ckpt_step
            interrupted.append({"run": f"{run[0]} seed {run[1]}", "segment_start": start, "last_reported": last,
                                "checkpoint": ckpt_step, "lost_steps": lost,
                                "training": bool(re.search(r"^ppo_discrete: .* steps on ", segment, re.M)),
                                "stopped_line": "stopped by SIGTERM" in segment})
        return interrupted

    def run(self):
        rng = random.Random(self.args.seed)
        kinds = []  # drawn in pairs of one of each kind, so that neither kind runs ahead of the other
        started = time.time()
        output = open(self.out / "sweep_output.txt", "w")
        while True:
            before = self.logs()
            if not kinds:
                kinds = rng.sample(["SIGTERM", "SIGKILL"], 2)
            killing = len(self.kills) < self.args.max_kills
            kind = kinds.pop()
            delay = rng.uniform(self.args.min_delay, self.args.max_delay)
            plan = f"{kind} after {delay:.1f} s" if killing else "no kill"
            output.write(f"\n=== segment {len(self.kills) + 1} ({plan})\n")
            output.flush()
            proc = subprocess.Popen(self.cmd, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "PYTHON": sys.executable})
            try:
                rc = proc.wait(timeout=delay if killing else 3600)
            except subprocess.TimeoutExpired:
                rc = None
            if rc is not None:  # the sweep ended by itself
                self.inspect(before, None)
                return rc, time.time() - started
            stop_seconds = None
            t = time.time()
            if kind == "SIGTERM":
                proc.send_signal(signal.SIGTERM)
                rc = proc.wait(timeout=600)
                stop_seconds = time.time() - t
            else:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait(timeout=60)
            while processes_in(self.sweeps):  # a killed process is gone once the kernel has reaped it
                time.sleep(0.1)
            interrupted = self.inspect(before, kind)
            self.kills.append({"kind": kind, "after_seconds": round(delay, 2), "sweep_exit": rc,
                               "stop_seconds": None if stop_seconds is None else round(stop_seconds, 2),
                               "interrupted": interrupted})
            lost = ", ".join(f"{i['run']} lost {i['lost_steps']}" for i in interrupted) or "no run training"
            print(f"kill {len(self.kills):2d}: {kind} after {delay:4.1f} s (sweep exit {rc}): {lost}", flush=True)

    def final_checks(self):
        from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        # TensorBoard warns of every purge it does; here the purges are the expected effect of resuming.
        logging.getLogger("tensorboard").setLevel(logging.ERROR)

        all_steps = list(range(self.batch, self.args.total_timesteps + 1, self.batch))
        runs = []
        for run in self.runs:
            d = self.seed_dir(run)
            log = (d / "log.txt").read_text() if (d / "log.txt").exists() else ""
            run_dirs = [p for p in (d / "runs").iterdir() if p.is_dir()] if (d / "runs").is_dir() else []
            shown, raw, event_files = [], 0, sorted(d.glob("runs/*/events.out.tfevents.*"))
            if len(run_dirs) == 1:
                acc = EventAccumulator(str(run_dirs[0]), size_guidance={SCALARS: 0})
                acc.Reload()
                shown = [e.step for e in acc.Scalars(TAG)] if TAG in acc.Tags()["scalars"] else []
            for f in event_files:
                try:
                    for event in EventFileLoader(str(f)).Load():
                        raw += sum(v.tag == TAG for v in event.summary.value)
                except Exception as e:
                    self.unreadable.append(f"{f}: {type(e).__name__}: {e}")
            final = re.findall(r"ppo_discrete: done, (\d+) steps", log)
            runs.append({"run": f"{run[0]} seed {run[1]}", "done": (d / "done").exists(),
                         "final_steps": int(final[-1]) if final else None, "run_folders": len(run_dirs),
                         "event_files": len(event_files), "segments_in_log": 1 + log.count("# resuming from "),
                         "steps_complete": shown == all_steps,
                         "iterations_logged_twice_raw": raw - len(all_steps)})
        return runs


def summarize(bench, rc, seconds, runs):
    args, kills = bench.args, bench.kills
    per_run = [i for k in kills for i in k["interrupted"]]
    by_kind = {}
    for kind in ("SIGTERM", "SIGKILL"):
        ks = [k for k in kills if k["kind"] == kind]
        hits = [i for k in ks for i in k["interrupted"]]
        lost = [i["lost_steps"] for i in hits]
        by_kind[kind] = {
            "kills": len(ks), "runs_interrupted": len(hits),
            "runs_interrupted_while_training": sum(i["training"] for i in hits), "steps_lost": sum(lost),
            "max_lost_per_run": max(lost, default=0),
            "mean_lost_per_run": round(sum(lost) / len(lost), 1) if lost else 0,
            "max_lost_per_kill": max((sum(i["lost_steps"] for i in k["interrupted"]) for k in ks), default=0),
            "sweep_exit_codes": sorted({k["sweep_exit"] for k in ks}),
        }
    by_kind["SIGTERM"]["max_stop_seconds"] = max((k["stop_seconds"] for k in kills if k["stop_seconds"]), default=0)
    total_trained = len(runs) * args.total_timesteps
    result = {
        "command": " ".join(sys.argv), "sweep_command": bench.cmd, "date": datetime.datetime.now(
            datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "settings": vars(args) | {"out": str(args.out)}, "checkpoint_interval_steps": bench.interval,
        "final_sweep_exit": rc, "wall_seconds": round(seconds), "kills": len(kills), "by_kind": by_kind,
        "runs_completed": sum(r["done"] and r["final_steps"] == args.total_timesteps for r in runs),
        "runs": runs, "steps_recomputed": sum(i["lost_steps"] for i in per_run),
        "steps_recomputed_raw_events": bench.batch * sum(r["iterations_logged_twice_raw"] for r in runs),
        "steps_trained": total_trained, "checkpoints_loaded": bench.checkpoints_loaded,
        "unreadable": bench.unreadable, "half_written_tmp_checkpoints_seen": bench.tmp_files_seen,
        "resume_mismatches": bench.mismatches, "kill_log": kills,
    }
    t, k = by_kind["SIGTERM"], by_kind["SIGKILL"]
    result["targets"] = {
        "every run completed": result["runs_completed"] == len(runs) and rc == 0,
        "no checkpoint or log unreadable": not bench.unreadable,
        "every step sequence complete": all(r["steps_complete"] for r in runs),
        "every segment resumed at its checkpoint": not bench.mismatches,
        f"SIGKILL: at most one checkpoint interval ({bench.interval} steps) lost per run": k["max_lost_per_run"]
        <= bench.interval,
        "SIGTERM: no whole iteration lost": t["steps_lost"] == 0,
    }
    return result


def markdown(r):
    s = r["settings"]
    t, k = r["by_kind"]["SIGTERM"], r["by_kind"]["SIGKILL"]

    def training_mean(kind):  # kills during start-up cost nothing; this is what a kill costs a training run
        lost = [i["lost_steps"] for x in r["kill_log"] if x["kind"] == kind for i in x["interrupted"] if i["training"]]
        return round(sum(lost) / len(lost), 1) if lost else "-"

    lines = [
        "# Fault injection: a sweep killed at random moments", "",
        f"`{r['command']}` at commit {r['commit']}, {r['date']}, {r['wall_seconds']} s.", "",
        f"Sweep: ppo_discrete.py on {s['envs']}, seeds {s['seeds']}, {s['total_timesteps']} steps each "
        f"({s['num_envs']} envs x {s['num_steps']} steps per iteration), a checkpoint every {s['checkpoint_every']} "
        f"iterations ({r['checkpoint_interval_steps']} steps), {s['jobs']} runs at a time. Kills after "
        f"{s['min_delay']}-{s['max_delay']} s (uniform, seed {s['seed']}), each followed by the same sweep command "
        f"again, until every run was done: {r['kills']} kills"
        + (" (the --max-kills cap: the segment after the last kill ran to the end)." if r["kills"] >= s["max_kills"]
           else "."), "",
        "| | SIGTERM to the sweep | SIGKILL to its process group |", "|---|---|---|",
        f"| kills survived | {t['kills']} | {k['kills']} |",
        f"| runs interrupted (run x kill) | {t['runs_interrupted']} | {k['runs_interrupted']} |",
        f"| ... of them training (not still starting up) | {t['runs_interrupted_while_training']} | "
        f"{k['runs_interrupted_while_training']} |",
        f"| steps recomputed | {t['steps_lost']} | {k['steps_lost']} |",
        f"| per interrupted run: mean / max | {t['mean_lost_per_run']} / {t['max_lost_per_run']} | "
        f"{k['mean_lost_per_run']} / {k['max_lost_per_run']} |",
        f"| per run interrupted while training: mean | {training_mean('SIGTERM')} | {training_mean('SIGKILL')} |",
        f"| per kill, all runs: max | {t['max_lost_per_kill']} | {k['max_lost_per_kill']} |",
        f"| sweep exit status | {t['sweep_exit_codes']} | {k['sweep_exit_codes']} |",
        f"| longest stop (signal to sweep exit) | {t['max_stop_seconds']} s | - |", "",
        f"Runs completed: {r['runs_completed']} of {len(r['runs'])} (final sweep exit {r['final_sweep_exit']}). "
        f"Steps recomputed because of kills: {r['steps_recomputed']} of {r['steps_trained']} trained "
        f"({100 * r['steps_recomputed'] / r['steps_trained']:.1f}%; by the raw event files, "
        f"{r['steps_recomputed_raw_events']}). Checkpoints loaded after kills: "
        f"{r['checkpoints_loaded']}, unreadable: {len(r['unreadable'])}; half-written checkpoint.pt.tmp files "
        f"seen: {r['half_written_tmp_checkpoints_seen']}; segments that did not resume at the checkpoint read "
        f"after the kill: {len(r['resume_mismatches'])}.", "",
        "| run | done | final steps | log segments | event files | step sequence complete | "
        "iterations logged twice (raw events) |", "|---|---|---|---|---|---|---|",
    ]
    for run in r["runs"]:
        lines.append(f"| {run['run']} | {run['done']} | {run['final_steps']} | {run['segments_in_log']} | "
                     f"{run['event_files']} | {run['steps_complete']} | {run['iterations_logged_twice_raw']} |")
    lines += ["", "Targets:", ""] + [f"- {'met' if ok else 'MISSED'}: {name}" for name, ok in r["targets"].items()]
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    bench = Benchmark(args)
    print(f"sweep: {' '.join(bench.cmd)}", flush=True)
    rc, seconds = bench.run()
    result = summarize(bench, rc, seconds, bench.final_checks())
    (bench.out / "report.json").write_text(json.dumps(result, indent=1) + "\n")
    (bench.out / "report.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if all(result["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
