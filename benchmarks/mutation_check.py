"""The mutation check: do the tests catch the bugs PPO implementations really have?

    python benchmarks/mutation_check.py                       # every mutation, report to stdout
    python benchmarks/mutation_check.py --out benchmarks/results/mutations/report.md
    python benchmarks/mutation_check.py --only pg-sign --only stale-ratio
    python benchmarks/mutation_check.py --list

Each mutation is one realistic single-line bug (a flipped sign, a stale log-prob, a checkpoint written in place,
an option ignored, ...) in one script. For each, the scripts and tests/ are copied to a scratch folder, the bug is
put in the copy, and the tests that hold the math and the training loop (tests/test_math.py and
tests/test_training.py) run against it, stopping at the first failure; the test that the copied functions are
identical across the scripts is left out, since it would catch any bug put in one copy. A mutation is *killed* when a test fails,
and *survives* when all pass: a survivor is a bug the suite would let through. The repository itself is never
touched. Exit status 1 if any mutation survived, or if one no longer applies (its line changed: update it here).
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = ["ppo_discrete", "ppo_continuous", "ppo_atari"]
TESTS = ["tests/test_math.py", "tests/test_training.py"]
ALL = tuple(SCRIPTS)
MLP = ("ppo_discrete", "ppo_continuous")

# (id, scripts it applies to, the exact text, what it becomes, the bug in words)
MUTATIONS = [
    # The loss
    ("pg-sign", ALL, "pg_loss = -surrogate.mean()", "pg_loss = surrogate.mean()", "policy-gradient sign flipped"),
    ("entropy-sign", ALL, "loss = pg_loss - args.ent_coef * entropy_loss", "loss = pg_loss + args.ent_coef * entropy_loss",
     "entropy bonus sign flipped"),
    ("normalise-returns", ALL, "advantages = normalize(advantages)", "returns = normalize(returns)",
     "value targets normalised instead of the advantages"),
    ("vclip-flag", ALL, "clip_coef, args.clip_vloss)", "clip_coef, not args.clip_vloss)",
     "value-clipping flag inverted"),
    ("vtarget-swap", ALL, "value_loss(new_value, old_value, returns,", "value_loss(new_value, returns, old_value,",
     "value loss's target and old value swapped"),
    ("clip-policy-ignored", ALL, "if args.clip_policy else ratio * advantages", "if True else ratio * advantages",
     "--no-clip-policy ignored"),
    ("kl-penalty-sign", ALL, "loss = loss + kl_coef * kl.mean()", "loss = loss - kl_coef * kl.mean()",
     "KL penalty rewarded instead of charged"),
    ("kl-adapt-reversed", ALL, "if mean_kl < target / 1.5:\n        return beta / 2",
     "if mean_kl < target / 1.5:\n        return beta * 2", "adaptive beta doubled where it should halve"),
    ("kl-not-adapted", ALL, "            penalty.update(mean_kl)\n", "", "adaptive beta never moves"),
    ("kl-beta-not-saved", ("ppo_continuous",), '"kl_coef": stats["kl_coef"],', '"kl_coef": 1.0,',
     "adaptive beta not kept by the checkpoint"),
    ("kl-beta-not-saved", ("ppo_discrete", "ppo_atari"), '"kl_coef": kl_coef,', '"kl_coef": 1.0,',
     "adaptive beta not kept by the checkpoint"),
    ("kl-reversed", ("ppo_continuous",), "return gaussian_kl(old[0], old[1], agent.actor_mean(obs), agent.actor_logstd)",
     "return gaussian_kl(agent.actor_mean(obs), agent.actor_logstd, old[0], old[1])", "KL[new || old] for KL[old || new]"),
    ("kl-reversed", ("ppo_discrete", "ppo_atari"), "return categorical_kl(old_logits, agent.logits(obs))",
     "return categorical_kl(agent.logits(obs), old_logits)", "KL[new || old] for KL[old || new]"),
    ("categorical-kl-unnormalised", ("ppo_discrete", "ppo_atari"),
     "new_log_probs = new_logits - new_logits.logsumexp(-1, keepdim=True)", "new_log_probs = new_logits",
     "the new policy's logits taken for its log-probabilities"),
    ("kl-estimator", ALL, '"approx_kl": ((ratio - 1) - logratio).mean()', '"approx_kl": (-logratio).mean()',
     "approximate KL logged with the other estimator"),
    # The update loop
    ("stale-ratio", ALL, "ppo_loss(new_logprob, entropy, new_value, b_logprobs[mb],",
     "ppo_loss(new_logprob, entropy, new_value, new_logprob.detach(),", "ratio taken against the new log-prob"),
    ("no-grad-clip", ALL, "nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)", "pass",
     "gradient-norm clipping deleted"),
    ("target-kl-reversed", ("ppo_atari",), 'metrics["approx_kl"]) > args.target_kl', 'metrics["approx_kl"]) < args.target_kl',
     "--target-kl comparison reversed"),
    ("target-kl-reversed", MLP, 'metrics["approx_kl"] > args.target_kl', 'metrics["approx_kl"] < args.target_kl',
     "--target-kl comparison reversed"),
    ("anneal-clip-ignored", ALL, "clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef",
     "clip_coef = args.clip_coef", "--anneal-clip ignored"),
    ("anneal-lr-always", ALL, "        if args.anneal_lr:\n", "        if True:\n", "--no-anneal-lr ignored"),
    ("nonfinite-unchecked", MLP, "if not torch.isfinite(loss):", "if False:", "non-finite loss not stopped"),
    ("nonfinite-unchecked", ("ppo_atari",), "if any_process(not torch.isfinite(loss), self.device):", "if False:",
     "non-finite loss not stopped"),
    # The math
    ("gae-no-cut", ALL, "next_advantage = delta + gamma * gae_lambda * not_done * next_advantage",
     "next_advantage = delta + gamma * gae_lambda * next_advantage", "GAE sums across an episode's end"),
    ("gae-bootstrap-done", ALL, "delta = rewards[t] + gamma * next_value * not_done - values[t]",
     "delta = rewards[t] + gamma * next_value - values[t]", "GAE bootstraps past a terminal step"),
    ("gae-lambda", ALL, "gamma * gae_lambda * not_done", "gae_lambda * not_done", "GAE decays by lambda alone"),
    ("logits-unnormalised", ("ppo_discrete", "ppo_atari"), "    log_probs = logits - logits.logsumexp(-1, keepdim=True)\n",
     "    log_probs = logits\n", "categorical log-probs taken as the raw logits"),
    ("gaussian-std-for-log-std", ("ppo_continuous",), "    log_std = std.log()\n", "    log_std = std\n",
     "Gaussian log-prob and entropy use the std where its log belongs"),
    ("surrogate-max", ALL, "return torch.min(ratio * advantages,", "return torch.max(ratio * advantages,",
     "clipped surrogate takes the max"),
    ("surrogate-clip-range", ALL, "torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)",
     "torch.clamp(ratio, 1 - clip_coef, 1 + 2 * clip_coef)", "clip range asymmetric"),
    ("vloss-min", ALL, "torch.max(unclipped, (clipped_values - returns) ** 2)",
     "torch.min(unclipped, (clipped_values - returns) ** 2)", "clipped value loss takes the min"),
    ("normalize-no-mean", ALL, "return (x - x.mean()) / (x.std() + eps)", "return x / (x.std() + eps)",
     "advantage normalisation keeps the mean"),
    ("bootstrap-no-gamma", ALL, "return rewards + gamma * final_values * truncated",
     "return rewards + final_values * truncated", "truncation bootstrap undiscounted"),
    # Truncation: V of the next episode's first observation instead of the final one
    ("truncation-reset-obs", ("ppo_discrete",),
     'final_obs = torch.as_tensor(np.stack(info["final_obs"][truncated]), dtype=torch.float32, device=device)',
     "final_obs = torch.as_tensor(next_obs_np[truncated], dtype=torch.float32, device=device)",
     "truncation bootstrapped from the reset observation"),
    ("truncation-reset-obs", ("ppo_continuous",),
     'final_obs = observe(np.stack(info["final_obs"][truncated]), update=False)',
     "final_obs = observe(next_obs_raw[truncated], update=False)", "truncation bootstrapped from the reset observation"),
    ("truncation-reset-obs", ("ppo_atari",),
     'final_obs = torch.as_tensor(np.stack(info["final_obs"][truncated]), device=device)',
     "final_obs = torch.as_tensor(next_obs_np[truncated], device=device)",
     "truncation bootstrapped from the reset observation"),
    # Continuous normalisation switches
    ("norm-obs-always", ("ppo_continuous",), "        if not args.norm_obs:\n", "        if False:\n",
     "--no-norm-obs ignored"),
    ("norm-reward-always", ("ppo_continuous",), "            if args.norm_reward:\n", "            if True:\n",
     "--no-norm-reward ignored"),
    # Evaluation
    ("eval-greedy-ignored", ("ppo_discrete", "ppo_atari"), "args.eval_episodes, args.eval_deterministic, args.seed",
     "args.eval_episodes, True, args.seed", "--no-eval-deterministic ignored"),
    ("eval-deterministic-ignored", ("ppo_continuous",), "                if args.eval_deterministic:\n",
     "                if True:\n", "--no-eval-deterministic ignored"),
    # The network
    ("policy-gain", ("ppo_discrete",), "layer_init(nn.Linear(64, n_actions), gain=0.01)",
     "layer_init(nn.Linear(64, n_actions), gain=1.0)", "policy head initialised with gain 1"),
    ("policy-gain", ("ppo_continuous",), "layer_init(nn.Linear(64, action_size), gain=0.01)",
     "layer_init(nn.Linear(64, action_size), gain=1.0)", "policy head initialised with gain 1"),
    ("policy-gain", ("ppo_atari",), "layer_init(nn.Linear(512, n_actions), gain=0.01)",
     "layer_init(nn.Linear(512, n_actions), gain=1.0)", "policy head initialised with gain 1"),
    # Checkpoints and resume
    ("restore-no-weights", ALL, '    agent.load_state_dict(ckpt["model"])\n    optimizer', "    optimizer",
     "resume restores no weights"),
    ("restore-no-adam", ALL, '    optimizer.load_state_dict(ckpt["optimizer"])\n', "",
     "resume restores no optimizer state"),
    ("restore-no-rng", ALL, '    torch.set_rng_state(ckpt["rng"]["torch"])\n', "", "resume restores no RNG state"),
    ("checkpoint-in-place", ALL, 'tmp = f"{path}.tmp"', "tmp = path", "checkpoint written in place"),
    ("checkpoint-no-fsync", ALL, "        os.fsync(f.fileno())\n", "", "checkpoint renamed without its fsync"),
    # torchrun
    ("ranks-same-envs", ("ppo_atari",), "return count, RANK * count", "return count, 0",
     "every torchrun process steps the same envs"),
]


def expanded(only=()):
    """One (id, script, old, new, description) per script a mutation applies to."""
    rows = [(mid, script, old, new, what) for mid, scripts, old, new, what in MUTATIONS for script in scripts]
    return [row for row in rows if not only or row[0] in only]


def run_one(mid, script, old, new, timeout):
    """(result, detail, seconds): 'killed' and the first failing test, 'survived', or 'does not apply'."""
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mutant-") as scratch:
        scratch = Path(scratch)
        for name in SCRIPTS:
            shutil.copy(REPO / f"{name}.py", scratch / f"{name}.py")
        shutil.copytree(REPO / "tests", scratch / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        path = scratch / f"{script}.py"
        source = path.read_text()
        if source.count(old) != 1:
            return "does not apply", f"the text occurs {source.count(old)} times in {script}.py", 0.0
        path.write_text(source.replace(old, new))
        # The copies' identity test would catch any bug put in one copy only: leave it out, so that a kill comes
        # from a test of what the code does.
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS,
               "--deselect", "tests/test_math.py::test_the_copies_are_identical",
               "--deselect", "tests/test_math.py::test_categorical_copies_are_identical"]
        try:
            result = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "killed", f"the tests ran past {timeout} s", time.time() - started
    seconds = time.time() - started
    if result.returncode == 0:
        return "survived", "", seconds
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", result.stdout, re.M)
    return "killed", failed[1] if failed else f"pytest exit {result.returncode}", seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="run only this mutation id (repeatable)")
    parser.add_argument("--out", help="also write the markdown report here")
    parser.add_argument("--timeout", type=int, default=600, help="seconds for one mutant's tests")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args()
    rows = expanded(set(args.only))
    if args.only and not rows:
        known = sorted({m[0] for m in MUTATIONS})
        print(f"error: no mutation named {args.only}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    if args.list:
        for mid, script, _, _, what in rows:
            print(f"{mid:28s} {script:15s} {what}")
        return 0
    lines = ["| mutation | script | the bug | result | caught by | seconds |", "|---|---|---|---|---|---|"]
    counts = {}
    for mid, script, old, new, what in rows:
        result, detail, seconds = run_one(mid, script, old, new, args.timeout)
        counts[result] = counts.get(result, 0) + 1
        lines.append(f"| `{mid}` | {script} | {what} | **{result}** | {detail} | {seconds:.0f} |")
        print(f"{mid} ({script}): {result} {detail}", file=sys.stderr, flush=True)
    summary = ", ".join(f"{n} {result}" for result, n in sorted(counts.items()))
    report = "\n".join([f"{len(rows)} mutations: {summary}.", "", *lines, ""])
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0 if set(counts) == {"killed"} else 1


if __name__ == "__main__":
    sys.exit(main())
