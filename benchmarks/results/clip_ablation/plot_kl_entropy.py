"""Approximate KL and entropy per update for the clip ablation (each seed a line), from the committed events.

    python benchmarks/results/clip_ablation/plot_kl_entropy.py
"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

HERE = Path(__file__).resolve().parent
VARIANTS = {"aggressive-clip0.2": "clip 0.2", "aggressive-noclip": "no clip (clip coef 100)",
            "aggressive-adaptive-kl0.01": "adaptive KL, d_targ 0.01 (no clip)",
            "aggressive-fixed-kl1": "fixed KL, beta 1 (no clip)"}
TAGS = {"losses/approx_kl": "approximate KL per update (log scale)", "losses/entropy": "policy entropy (log scale)",
        "charts/episodic_return": "episodic return"}

fig, axes = plt.subplots(len(TAGS), len(VARIANTS), figsize=(20, 9), sharex=True, sharey="row")
for col, (variant, title) in enumerate(VARIANTS.items()):
    for run in sorted((HERE / "sweeps/ppo_discrete" / variant / "CartPole-v1").glob("seed*/runs/*")):
        acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
        acc.Reload()
        for row, tag in enumerate(TAGS):
            events = acc.Scalars(tag)
            axes[row, col].plot([e.step for e in events], [e.value for e in events], lw=0.8,
                                label=run.parent.parent.name)
    axes[0, col].set_title(title)
    axes[-1, col].set_xlabel("environment steps")
for row, label in enumerate(TAGS.values()):
    axes[row, 0].set_ylabel(label)
    if row < 2:
        axes[row, 0].set_yscale("log")
axes[0, 0].legend(fontsize=8)
fig.suptitle("CartPole-v1, aggressive updates (1 env x 128 steps, 30 epochs, lr 1e-2), 5 seeds")
fig.tight_layout()
fig.savefig(HERE / "kl_entropy.png", dpi=90)
print("wrote", HERE / "kl_entropy.png")
