"""The math of all three scripts, held to worked numbers: every copy is tested, and the copies must stay copies.

Each script carries its own GAE, clipped surrogate, value loss, normalisation and loss (the house rule: one
file, one PPO setting). The tests below run once per script on the same numbers, from ../shared/REFERENCE.md
where it has them and by hand otherwise; `test_the_copies_are_identical` compares the functions' syntax trees
across the files, so a fix in one copy that misses another fails here.
"""

import ast
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT, SCRIPTS, load_script

GAMMA, LAMBDA = 0.99, 0.95


@pytest.fixture(params=SCRIPTS)
def m(request):
    return load_script(request.param)


def t(values):
    return torch.tensor(values, dtype=torch.float32)


# ----------------------------------------------------------------------------------------------
# The copies stay copies
# ----------------------------------------------------------------------------------------------

# Functions that are the same in every script (under torchrun, ppo_atari.py's init_distributed puts
# normalize_over_processes in normalize's place: tests/test_atari_distributed.py checks it).
SAME_IN_ALL = ["compute_gae", "bootstrap_truncated", "normalize", "clipped_surrogate", "value_loss", "ppo_loss",
               "explained_variance", "adapt_kl_coef", "layer_init", "restore_checkpoint", "checkpoint_due",
               "fmt_duration", "unused_folder", "flags_given", "Run", "check_tracking", "new_run_name",
               "checkpoint_file", "Progress", "check_flags", "sigterm_as_interrupt", "counted"]


def function_trees(script):
    tree = ast.parse((REPO_ROOT / f"{script}.py").read_text())
    return {node.name: ast.dump(node) for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("name", SAME_IN_ALL)
def test_the_copies_are_identical(name):
    scripts = SCRIPTS
    trees = {script: function_trees(script).get(name) for script in scripts}
    assert all(trees.values()), f"{name} is missing from {[s for s, tree in trees.items() if tree is None]}"
    different = [s for s in scripts[1:] if trees[s] != trees[scripts[0]]]
    assert not different, f"{name} in {different} differs from {scripts[0]}.py's copy"


def test_counted_says_one_in_the_singular(m):
    """The evaluation's summary: "over 1 game", never "over 1 games"; zero and many take the plural."""
    assert [m.counted(n, "game") for n in (0, 1, 2, 10)] == ["0 games", "1 game", "2 games", "10 games"]


# ----------------------------------------------------------------------------------------------
# GAE [core-5] and truncation bootstrapping
# ----------------------------------------------------------------------------------------------


def test_gae_worked_numbers(m):
    """REFERENCE.md: three steps, rewards -1, the last one terminal, values [-2.5, -1.8, -0.9]."""
    rewards, values, dones = t([[-1.0], [-1.0], [-1.0]]), t([[-2.5], [-1.8], [-0.9]]), t([[0.0], [0.0], [1.0]])
    advantages, targets = m.compute_gae(rewards, values, dones, t([123.0]), GAMMA, LAMBDA)
    torch.testing.assert_close(advantages[:, 0], t([-0.45604, -0.18505, -0.1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(targets[:, 0], t([-2.95604, -1.98505, -1.0]), atol=1e-5, rtol=0)


def gae_by_definition(rewards, values, dones, last_value, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l}, each delta's bootstrap cut where the episode ended, the sum cut
    at the episode's end: the forward definition, in plain numpy."""
    steps, envs = rewards.shape
    next_values = np.vstack([values[1:], last_value[None]])
    deltas = rewards + gamma * next_values * (1 - dones) - values
    advantages = np.zeros_like(rewards)
    for e in range(envs):
        for s in range(steps):
            total, weight = 0.0, 1.0
            for u in range(s, steps):
                total += weight * deltas[u, e]
                if dones[u, e]:
                    break
                weight *= gamma * lam
            advantages[s, e] = total
    return advantages


def test_gae_matches_the_forward_definition_over_episode_ends_and_the_rollout_end(m):
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(9, 3)), rng.normal(size=(9, 3))
    dones = np.zeros((9, 3))
    dones[2, 0] = dones[6, 0] = dones[4, 1] = 1.0  # env 2 never ends: it bootstraps from last_value
    last_value = rng.normal(size=3)
    advantages, targets = m.compute_gae(t(rewards), t(values), t(dones), t(last_value), GAMMA, LAMBDA)
    expected = gae_by_definition(rewards, values, dones, last_value, GAMMA, LAMBDA)
    np.testing.assert_allclose(advantages.numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(targets.numpy(), expected + values, atol=1e-5)


def test_bootstrap_truncated_adds_discounted_final_value_only_where_truncated(m):
    rewards, truncated, final_values = np.array([1.0, 2.0, 3.0]), np.array([True, False, True]), np.array([10.0, 20.0, -4.0])
    np.testing.assert_allclose(m.bootstrap_truncated(rewards, truncated, final_values, GAMMA), [10.9, 2.0, -0.96])


# ----------------------------------------------------------------------------------------------
# Normalisation [core-7], the clipped surrogate [core-8], the value loss [core-9]
# ----------------------------------------------------------------------------------------------


def test_normalize_worked_numbers(m):
    """Mean 2.5 and unbiased std sqrt(5/3) of [1, 2, 3, 4] (the same estimator as torch.std)."""
    x = t([1.0, 2.0, 3.0, 4.0])
    s = math.sqrt(5 / 3)
    torch.testing.assert_close(m.normalize(x), t([-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("ratio, advantage, objective, flows", [
    (1.5, 2.0, 2.4, False),   # REFERENCE.md: min(3.0, 2.4), gradient 0
    (0.7, -1.0, -0.8, False),  # min(-0.7, -0.8), gradient 0
    (1.3, 0.5, 0.6, False),   # min(0.65, 0.6), gradient 0
    (0.9, -2.0, -1.8, True),  # inside the clip range: the gradient flows
    (0.5, 1.0, 0.5, True),    # moved the wrong way for its advantage: never clipped, r A is the smaller term
])
def test_clipped_surrogate_worked_numbers_and_where_the_gradient_is_zero(m, ratio, advantage, objective, flows):
    r = torch.tensor([ratio], requires_grad=True)
    value = m.clipped_surrogate(r, t([advantage]), 0.2)
    value.sum().backward()
    assert value.item() == pytest.approx(objective, abs=1e-6)
    assert r.grad.item() == (pytest.approx(advantage) if flows else 0.0)


@pytest.mark.parametrize("new, old, target, clipped, unclipped", [
    # moved 0.5 from the old value 1.0; kept at 1.2 it misses 2.0 by 0.8: the clipped error is the larger
    (1.5, 1.0, 2.0, 0.5 * 0.8 ** 2, 0.5 * 0.5 ** 2),
    # within +-0.2 of the old value: clipping changes nothing
    (0.9, 1.0, 0.0, 0.5 * 0.9 ** 2, 0.5 * 0.9 ** 2),
    # moved far the wrong way: the plain error (2.5) is larger than the kept value's (0.7)
    (3.0, 1.0, 0.5, 0.5 * 2.5 ** 2, 0.5 * 2.5 ** 2),
])
def test_value_loss_worked_numbers(m, new, old, target, clipped, unclipped):
    assert m.value_loss(t([new]), t([old]), t([target]), 0.2, clip=True).item() == pytest.approx(clipped)
    assert m.value_loss(t([new]), t([old]), t([target]), 0.2, clip=False).item() == pytest.approx(unclipped)


def test_explained_variance(m):
    target = np.array([1.0, 2.0, 3.0, 4.0])
    assert m.explained_variance(target, target) == 1.0
    assert m.explained_variance(np.full(4, 2.5), target) == pytest.approx(0.0)
    assert m.explained_variance(target + np.array([0.5, -0.5, 0.5, -0.5]), target) == pytest.approx(1 - 0.25 / 1.25)
    assert math.isnan(m.explained_variance(target, np.ones(4)))


# ----------------------------------------------------------------------------------------------
# The loss of one minibatch [core-10], with its diagnostics [core-12]
# ----------------------------------------------------------------------------------------------

RATIOS = [1.5, 0.7, 1.3, 0.9]
ADVANTAGES = [2.0, -1.0, 0.5, -2.0]
OLD_LOGPROB = [-1.0, -0.5, -2.0, -0.3]
ENTROPY = [0.5, 0.7, 0.9, 1.1]
NEW_VALUE, OLD_VALUE, RETURNS = [1.5, 0.9, 3.0, 0.0], [1.0, 1.0, 1.0, 0.0], [2.0, 0.0, 2.5, 10.0]


def settings(**changes):
    values = dict(norm_adv=False, clip_policy=True, clip_vloss=True, ent_coef=0.01, vf_coef=0.5)
    values.update(changes)
    return SimpleNamespace(**values)


def loss_inputs():
    """Leaf tensors for the network's outputs, so their gradients can be read."""
    new_logprob = (t(OLD_LOGPROB) + t(RATIOS).log()).requires_grad_()
    entropy, new_value = t(ENTROPY).requires_grad_(), t(NEW_VALUE).requires_grad_()
    return new_logprob, entropy, new_value


def clipped_value_errors():
    errors = []
    for new, old, target in zip(NEW_VALUE, OLD_VALUE, RETURNS):
        kept = old + max(-0.2, min(0.2, new - old))
        errors.append(max((new - target) ** 2, (kept - target) ** 2))
    return errors


def test_ppo_loss_worked_numbers(m):
    """The four samples of REFERENCE.md's clipped objective: surrogates 2.4, -0.8, 0.6, -1.8 (mean 0.1)."""
    new_logprob, entropy, new_value = loss_inputs()
    args = settings()
    loss, metrics = m.ppo_loss(new_logprob, entropy, new_value, t(OLD_LOGPROB), t(OLD_VALUE), t(ADVANTAGES),
                               t(RETURNS), 0.2, args)
    v_loss = 0.5 * np.mean(clipped_value_errors())  # 0.5 * mean(0.64, 0.81, 1.69, 100)
    assert v_loss == pytest.approx(12.8925)
    assert metrics["policy_loss"].item() == pytest.approx(-0.1, abs=1e-6)
    assert metrics["value_loss"].item() == pytest.approx(v_loss, rel=1e-6)
    assert metrics["entropy"].item() == pytest.approx(0.8, abs=1e-6)
    assert loss.item() == pytest.approx(-0.1 - 0.01 * 0.8 + 0.5 * v_loss, rel=1e-6)
    assert metrics["clipfrac"].item() == 0.75  # 1.5, 0.7 and 1.3 lie outside [0.8, 1.2]
    log_r = np.log(RATIOS)
    assert metrics["old_approx_kl"].item() == pytest.approx(np.mean(-log_r), abs=1e-6)
    assert metrics["approx_kl"].item() == pytest.approx(np.mean(np.array(RATIOS) - 1 - log_r), abs=1e-6)
    assert all(not v.requires_grad for v in metrics.values())


def test_ppo_loss_gradients(m):
    """d loss / d log pi: zero for the three clipped samples, -r A / n for the one inside the clip range (its
    log-prob is pushed down: its advantage is negative). d loss / d entropy = -ent_coef / n (more entropy,
    less loss). d loss / d V = vf_coef * d value loss."""
    new_logprob, entropy, new_value = loss_inputs()
    loss, _ = m.ppo_loss(new_logprob, entropy, new_value, t(OLD_LOGPROB), t(OLD_VALUE), t(ADVANTAGES),
                         t(RETURNS), 0.2, settings(ent_coef=0.05, vf_coef=0.5))
    loss.backward()
    torch.testing.assert_close(new_logprob.grad, t([0.0, 0.0, 0.0, -0.9 * -2.0 / 4]), atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy.grad, torch.full((4,), -0.05 / 4))
    # vf_coef * 0.5 * mean(max(plain, kept)): samples 0 and 2 are held by their kept value (constant: zero
    # gradient); samples 1 and 3 lie within the clip range, gradient vf_coef * (V - target) / n.
    torch.testing.assert_close(new_value.grad, t([0.0, 0.5 * 0.9 / 4, 0.0, 0.5 * -10.0 / 4]), atol=1e-6, rtol=0)


def test_ppo_loss_normalises_the_advantages_not_the_value_targets(m):
    new_logprob, entropy, new_value = loss_inputs()
    _, metrics = m.ppo_loss(new_logprob, entropy, new_value, t(OLD_LOGPROB), t(OLD_VALUE), t(ADVANTAGES),
                            t(RETURNS), 0.2, settings(norm_adv=True))
    a = np.array(ADVANTAGES)
    a = (a - a.mean()) / (a.std(ddof=1) + 1e-8)
    r = np.array(RATIOS)
    expected_pg = -np.mean(np.minimum(r * a, np.clip(r, 0.8, 1.2) * a))
    assert metrics["policy_loss"].item() == pytest.approx(expected_pg, abs=1e-6)
    assert metrics["value_loss"].item() == pytest.approx(0.5 * np.mean(clipped_value_errors()), rel=1e-6)


def test_ppo_loss_without_value_clipping(m):
    new_logprob, entropy, new_value = loss_inputs()
    _, clipped = m.ppo_loss(new_logprob, entropy, new_value, t(OLD_LOGPROB), t(OLD_VALUE), t(ADVANTAGES),
                            t(RETURNS), 0.2, settings(clip_vloss=True))
    _, plain = m.ppo_loss(new_logprob, entropy, new_value, t(OLD_LOGPROB), t(OLD_VALUE), t(ADVANTAGES),
                          t(RETURNS), 0.2, settings(clip_vloss=False))
    squared = (np.array(NEW_VALUE) - np.array(RETURNS)) ** 2
    assert plain["value_loss"].item() == pytest.approx(0.5 * squared.mean(), rel=1e-6)
    assert clipped["value_loss"].item() > plain["value_loss"].item()


def test_ppo_loss_takes_the_ratio_against_the_stored_log_prob(m):
    """Same new log-probs, other stored ones: another ratio, another loss. At equal log-probs the ratio is 1:
    nothing clipped, both KL estimates 0, and the policy gradient is -A / n for every sample."""
    new_logprob, entropy, new_value = loss_inputs()
    _, metrics = m.ppo_loss(new_logprob, entropy, new_value, new_logprob.detach(), t(OLD_VALUE), t(ADVANTAGES),
                            t(RETURNS), 0.2, settings())
    assert metrics["clipfrac"].item() == 0.0
    assert metrics["approx_kl"].item() == 0.0 and metrics["old_approx_kl"].item() == 0.0
    assert metrics["policy_loss"].item() == pytest.approx(-np.mean(ADVANTAGES))


def test_ppo_loss_clip_range_is_the_one_given(m):
    new_logprob, entropy, new_value = loss_inputs()
    _, wide = m.ppo_loss(new_logprob, entropy, new_value, t(OLD_LOGPROB), t(OLD_VALUE), t(ADVANTAGES),
                         t(RETURNS), 0.6, settings())
    assert wide["clipfrac"].item() == 0.0  # every ratio lies within [0.4, 1.6]
    r, a = np.array(RATIOS), np.array(ADVANTAGES)
    assert wide["policy_loss"].item() == pytest.approx(-np.mean(np.minimum(r * a, np.clip(r, 0.4, 1.6) * a)))


def test_ppo_loss_without_policy_clipping_keeps_the_value_clip(m):
    """--no-clip-policy: the plain surrogate r A, whose gradient flows for every sample; the value loss is the
    clipped one still."""
    new_logprob, entropy, new_value = loss_inputs()
    loss, metrics = m.ppo_loss(new_logprob, entropy, new_value, t(OLD_LOGPROB), t(OLD_VALUE), t(ADVANTAGES),
                               t(RETURNS), 0.2, settings(clip_policy=False))
    r, a = np.array(RATIOS), np.array(ADVANTAGES)
    assert metrics["policy_loss"].item() == pytest.approx(-np.mean(r * a))  # -(3.0 - 0.7 + 0.65 + 1.8) / 4
    assert metrics["value_loss"].item() == pytest.approx(0.5 * np.mean(clipped_value_errors()), rel=1e-6)
    loss.backward()
    torch.testing.assert_close(new_logprob.grad, t(-r * a / 4), atol=1e-6, rtol=0)


def test_ppo_loss_adds_the_kl_penalty(m):
    """[kl-1] loss + kl_coef * mean KL, its gradient kl_coef / n on each sample's KL."""
    new_logprob, entropy, new_value = loss_inputs()
    args = settings()
    plain, _ = m.ppo_loss(new_logprob, entropy, new_value, t(OLD_LOGPROB), t(OLD_VALUE), t(ADVANTAGES), t(RETURNS),
                          0.2, args)
    kl = t([0.1, 0.2, 0.3, 0.6]).requires_grad_()
    loss, metrics = m.ppo_loss(new_logprob, entropy, new_value, t(OLD_LOGPROB), t(OLD_VALUE), t(ADVANTAGES),
                               t(RETURNS), 0.2, args, kl, 3.0)
    assert loss.item() == pytest.approx(plain.item() + 3.0 * 0.3, rel=1e-6)
    assert metrics["kl_penalty"].item() == pytest.approx(0.3)
    loss.backward()
    torch.testing.assert_close(kl.grad, torch.full((4,), 3.0 / 4))


# ----------------------------------------------------------------------------------------------
# The policies' distributions, written out: torch.distributions' arithmetic to the last bit
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["categorical", "categorical_kl", "KLPenalty"])
def test_categorical_copies_are_identical(name):
    trees = {script: function_trees(script).get(name) for script in ("ppo_discrete", "ppo_atari")}
    assert trees["ppo_discrete"] and trees["ppo_discrete"] == trees["ppo_atari"]


@pytest.mark.parametrize("script", ["ppo_discrete", "ppo_atari"])
def test_categorical_is_torch_categorical_bit_for_bit_gradients_included(script):
    """Log-probs, entropies, sampled actions and the gradients through both equal torch's Categorical exactly,
    a near-impossible action (a probability that underflows to 0) included; a different order of the same
    operations would differ in the last bits of the gradient and change every run's curve."""
    m = load_script(script)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=gen) * 3
    x[0, 0] = -200.0  # exp(-200) underflows in float32: its log-prob is finite, its probability 0
    actions = torch.randint(0, 6, (64,), generator=gen)
    weights = torch.randn(64, generator=gen)

    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    _, logprob, entropy = m.categorical(ours, actions)
    dist = torch.distributions.Categorical(logits=theirs)
    their_logprob, their_entropy = dist.log_prob(actions), dist.entropy()  # the training loop's order
    assert torch.equal(logprob, their_logprob) and torch.equal(entropy, their_entropy)
    ((logprob * weights).sum() + 0.01 * entropy.sum()).backward()
    ((their_logprob * weights).sum() + 0.01 * their_entropy.sum()).backward()
    assert torch.equal(ours.grad, theirs.grad)

    torch.manual_seed(7)
    sampled, logprob, _ = m.categorical(x)
    torch.manual_seed(7)
    assert torch.equal(sampled, torch.distributions.Categorical(logits=x).sample())
    assert torch.equal(logprob, torch.distributions.Categorical(logits=x).log_prob(sampled))


def test_diagonal_gaussian_is_torch_normal_bit_for_bit_gradients_included():
    """[cont-1] [cont-3] The same against torch's Normal, summed over dimensions, the gradients to the mean and
    to the log-std included, and the same sample from the same seed."""
    pc = load_script("ppo_continuous")
    gen = torch.Generator().manual_seed(1)
    mean_data, logstd_data = torch.randn(32, 3, generator=gen), torch.randn(1, 3, generator=gen) * 0.5
    actions, weights = torch.randn(32, 3, generator=gen) * 2, torch.randn(32, generator=gen)

    def through(distribution):
        mean, logstd = mean_data.clone().requires_grad_(), logstd_data.clone().requires_grad_()
        logprob, entropy = distribution(mean, logstd.expand_as(mean).exp())
        ((logprob * weights).sum() + 0.01 * entropy.sum()).backward()
        return logprob, entropy, mean.grad, logstd.grad

    def torch_normal(mean, std):
        dist = torch.distributions.Normal(mean, std)
        return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)

    ours = through(lambda mean, std: pc.diagonal_gaussian(mean, std, actions)[1:])
    theirs = through(torch_normal)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))

    std = logstd_data.expand_as(mean_data).exp()
    torch.manual_seed(3)
    sampled = pc.diagonal_gaussian(mean_data, std)[0]
    torch.manual_seed(3)
    assert torch.equal(sampled, torch.distributions.Normal(mean_data, std).sample())
    assert not sampled.requires_grad
