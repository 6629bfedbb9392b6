"""ACKTR against OpenAI baselines' (Stable-Baselines 2's): the damping mode, the measured KL it logs, and the translation
of SB2's keywords (``sb3_npg/acktr/sb2.py``) pinned against the two step rules and the two critic Fishers."""

import copy
import math

import pytest
import torch

from sb3_npg import ACKTR
from sb3_npg.acktr import sb2_acktr_kwargs
from sb3_npg.acktr.critic import critic_batch_curvature
from sb3_npg.acktr.kfac_state import DAMPED_CURVATURE, UNDAMPED_CURVATURE, quadratic_curvature
from sb3_npg.acktr.sb2 import SB2_DEFAULTS, Sb2Schedule, sb2_kfac_clip, sb2_vf_fisher_coef
from sb3_npg.common.kfac import EIGENBASIS_DAMPING, FACTORED_DAMPING
from sb3_npg.common.kfac_layers import record_layers
from sb3_npg.common.kfac_policy import kfac_natural_inverse
from sb3_npg.common.natural_gradient import kl_scaled_step_size

#: The K-FAC critic (the constructor's default is the minibatch one): these tests reach its inverses and Fisher too.
TINY = {"n_steps": 64, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu", "critic_fit": "kfac"}
FLOAT32_EPS = torch.finfo(torch.float32).eps
FLOAT64_EPS = torch.finfo(torch.float64).eps
#: Roundings in one KL formula evaluated in float32 (log-softmax or log/exp, products, the sum over actions).
KL_FORMULA_ROUNDINGS = 8
#: Roundings in one value of a backpropagated output gradient of a two-layer network (products and sums per layer).
BACKWARD_ROUNDINGS = 8


def _float64(distribution: torch.distributions.Distribution) -> torch.distributions.Distribution:
    """A float64 copy of a Categorical's or a Normal's parameters."""
    if isinstance(distribution, torch.distributions.Categorical):
        return torch.distributions.Categorical(logits=distribution.logits.double())
    return torch.distributions.Normal(distribution.loc.double(), distribution.scale.double())


def _kl_and_cancellation_scale(old, new) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-sample KL(old || new) in float64, and the sum of the absolute values of the terms it cancels."""
    if isinstance(old, torch.distributions.Categorical):
        log_old, log_new = old.logits.log_softmax(-1), new.logits.log_softmax(-1)
        return (old.probs * (log_old - log_new)).sum(-1), (old.probs * (log_old.abs() + log_new.abs())).sum(-1)
    ratio = old.scale / new.scale
    terms = [ratio.log(), ratio.pow(2) / 2, (old.loc - new.loc).pow(2) / (2 * new.scale.pow(2)), torch.full_like(ratio, 0.5)]
    return torch.distributions.kl_divergence(old, new).sum(-1), sum(term.abs() for term in terms).sum(-1)


class SnapshotACKTR(ACKTR):
    """ACKTR keeping the policy before each update and the update's logged values."""

    def train(self) -> None:
        self.old_policy = copy.deepcopy(self.policy)
        super().train()
        self.logged = dict(self.logger.name_to_value)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_logged_kl_is_the_measured_kl_of_the_step_not_the_quadratic_models(env_id):
    clip = 0.001
    # The clip binds; the last of four updates, whose running factors are no longer its batch's alone.
    model = SnapshotACKTR("MlpPolicy", env_id, learning_rate=1e3, kfac_clip=clip, kfac_stats_decay=0.99, **TINY)
    model.learn(4 * TINY["n_steps"])
    observations = torch.as_tensor(model.rollout_buffer.observations).reshape(TINY["n_steps"], -1)
    with torch.no_grad():
        old = _float64(model.old_policy.get_distribution(observations).distribution)
        new = _float64(model.policy.get_distribution(observations).distribution)
    per_sample, scale = _kl_and_cancellation_scale(old, new)
    kl = float(per_sample.mean())
    # float32's rounding of each term the KL cancels, and of the mean's pairwise sum over the samples.
    tolerance = (KL_FORMULA_ROUNDINGS + math.log2(len(per_sample))) * FLOAT32_EPS * float(scale.mean())
    assert model.logged["train/kl_clip_fraction"] == 1.0
    assert model.logged["train/kl_divergence"] == pytest.approx(kl, rel=0.0, abs=tolerance)
    model_kl = model.logged["train/step_fraction"] ** 2 * clip  # the full step's quadratic model has the KL clip
    assert abs(model.logged["train/kl_divergence"] - model_kl) > 100 * tolerance, "the model's KL is another number"
    assert model.logged["train/kl_divergence_over_clip"] == pytest.approx(model.logged["train/kl_divergence"] / clip)


@pytest.mark.parametrize("option", ["kfac_damping_mode", "kfac_clip_curvature"])
def test_the_new_options_are_checked_with_their_names(option):
    with pytest.raises(ValueError, match=f"`{option}`"):
        ACKTR("MlpPolicy", "CartPole-v1", **{**TINY, option: "exact"})


class CurvatureACKTR(ACKTR):
    """ACKTR recording its solver's gradient, direction and curvature, and the critic statistics' curvature."""

    def _setup_model(self) -> None:
        super()._setup_model()
        self.solved: list = []

    @property
    def solver(self):
        solver, solved = super().solver, self.solved
        solve = solver.solve

        def recording(gradient, fisher, observations):
            result = solve(gradient, fisher, observations)
            solved.append((gradient, result))
            return result

        solver.solve = recording
        return solver


@pytest.mark.parametrize("curvature", [UNDAMPED_CURVATURE, DAMPED_CURVATURE])
def test_the_clip_curvature_is_the_undamped_model_or_the_gradients_product_with_the_direction(curvature):
    """``"damped"`` is baselines' ``g^T d``; ``"undamped"`` the paper's ``d^T F_hat d``: the same float32 products."""
    model = CurvatureACKTR("MlpPolicy", "Pendulum-v1", kfac_clip_curvature=curvature, **TINY)
    model.learn(TINY["n_steps"])  # one update: the statistics stay those the direction was solved with
    ((gradient, result),) = model.solved
    undamped = quadratic_curvature(model._actor_plan, model.kfac_statistics, result.direction)
    damped = float(torch.dot(result.direction, gradient))
    assert damped > undamped > 0.0, "the damping adds to the curvature"
    assert result.curvature == (damped if curvature == DAMPED_CURVATURE else undamped)


def test_eigenbasis_damping_reaches_the_inverses_and_is_saved(tmp_path):
    model = ACKTR("MlpPolicy", "Pendulum-v1", kfac_damping_mode=EIGENBASIS_DAMPING, **TINY)
    model.learn(TINY["n_steps"])
    generator = torch.Generator().manual_seed(0)
    for plan, statistics in ((model._actor_plan, model.kfac_statistics), (model._critic_plan, model.critic_kfac_statistics)):
        vector = torch.randn(len(plan.order), generator=generator)
        used = statistics.inverse(plan, model._kfac_settings)(vector)
        curvature = statistics.curvature("inverted")
        assert torch.equal(used, kfac_natural_inverse(plan, curvature, model.kfac_damping, EIGENBASIS_DAMPING)(vector))
        assert not torch.allclose(used, kfac_natural_inverse(plan, curvature, model.kfac_damping, FACTORED_DAMPING)(vector))
    model.save(tmp_path / "acktr.zip")
    loaded = ACKTR.load(tmp_path / "acktr.zip", device="cpu")
    assert loaded.kfac_damping_mode == EIGENBASIS_DAMPING
    assert loaded._kfac_settings.damping_mode == EIGENBASIS_DAMPING


def _sb2_step_size(learning_rate: float, clip: float, g_dot_d: float) -> float:
    """SB2's (baselines') rule: ``lr * min(1, sqrt(clip / (lr^2 g^T d)))``, ``g^T d`` its curvature."""
    return learning_rate * min(1.0, math.sqrt(clip / (learning_rate**2 * g_dot_d)))


def _our_step_size(learning_rate: float, clip: float, curvature: float) -> float:
    """Ours: ``min(lr, sqrt(2 clip / d^T F d))``, the shared KL-scaled step capped by ACKTR's hook."""
    return min(learning_rate, kl_scaled_step_size(curvature, clip))


@pytest.mark.parametrize("learning_rate", [1e-3, 0.25, 10.0])
@pytest.mark.parametrize("clip", [1e-3, 0.02])
@pytest.mark.parametrize("curvature", [1e-4, 1.0, 1e4])
def test_a_translated_kfac_clip_takes_sb2s_step_for_the_same_curvature(learning_rate, clip, curvature):
    """Both regimes (the clip binding, the learning rate binding) take one step size; the untranslated clip gives, where
    it binds, a step whose quadratic model's KL is twice SB2's."""
    ours = _our_step_size(learning_rate, sb2_kfac_clip(clip), curvature)
    sb2 = _sb2_step_size(learning_rate, clip, curvature)
    assert ours == pytest.approx(sb2, rel=4 * FLOAT64_EPS)
    untranslated = _our_step_size(learning_rate, clip, curvature)
    if untranslated < learning_rate and sb2 < learning_rate:
        assert 0.5 * untranslated**2 * curvature == pytest.approx(2 * 0.5 * sb2**2 * curvature, rel=8 * FLOAT64_EPS)
        assert 0.5 * sb2**2 * curvature == pytest.approx(clip / 2, rel=8 * FLOAT64_EPS)


def _sb2_critic_output_factors(model: ACKTR, observations: torch.Tensor, coef: float, noise: torch.Tensor):
    """``G`` of each critic layer from SB2's sampled Fisher loss ``-coef mean((V - stop_gradient(V + noise))^2)``, its
    output gradients times the batch size (SB2's K-FAC undoes the loss's mean), ``G = E[g g^T]``."""
    layers = model._critic_plan.layers
    with record_layers(layers) as records:
        values = model.policy.predict_values(observations)
    loss = -coef * (values - (values + noise).detach()).pow(2).mean()
    outputs = [records[layer].outputs for layer in layers]
    grads = torch.autograd.grad(loss, outputs)
    batch = len(observations)
    return [(grad * batch).T @ (grad * batch) / batch for grad in grads]


@pytest.mark.parametrize("coef", [1.0, 0.3])
def test_a_translated_vf_fisher_coef_gives_sb2s_critic_fisher(coef):
    """With noise of square exactly 1 (random signs), SB2's sampled ``G`` is its expectation, ``4 coef^2 E[dV dV^T]``."""
    model = ACKTR("MlpPolicy", "CartPole-v1", **TINY)
    generator = torch.Generator().manual_seed(1)
    batch = 32
    observations = torch.randn(batch, 4, generator=generator)
    noise = torch.randint(0, 2, (batch, 1), generator=generator).float() * 2 - 1
    sb2 = _sb2_critic_output_factors(model, observations, coef, noise)
    ours = critic_batch_curvature(model._critic_plan, model.policy, observations, sb2_vf_fisher_coef(coef), lambda x: x)
    # Each output gradient is backpropagated in float32; each entry of G then sums products of two over the batch.
    tolerance = (2 * BACKWARD_ROUNDINGS + math.log2(batch)) * FLOAT32_EPS
    for (_, got), want in zip(ours.layer_factors, sb2, strict=True):
        assert float((got - want).norm() / want.norm()) < tolerance
    untranslated = critic_batch_curvature(model._critic_plan, model.policy, observations, coef, lambda x: x)
    ratio = float(sb2[0].trace() / untranslated.layer_factors[0][1].trace())
    assert ratio == pytest.approx(4 * coef, rel=tolerance), "ours untranslated is 1 / (4 coef) of SB2's"


def test_the_translation_fills_sb2s_defaults_and_its_optimizers_constants():
    ours = sb2_acktr_kwargs(kfac_clip=0.002, vf_fisher_coef=0.5, lr_schedule="constant", seed=3, nprocs=8)
    assert ours["kfac_clip"] == ours["critic_kfac_clip"] == 0.001
    assert ours["vf_fisher_coef"] == 1.0
    assert ours["learning_rate"] == SB2_DEFAULTS["learning_rate"] and ours["seed"] == 3 and "nprocs" not in ours
    assert ours["kfac_damping_mode"] == EIGENBASIS_DAMPING and ours["kfac_clip_curvature"] == DAMPED_CURVATURE
    assert (ours["kfac_damping"], ours["kfac_stats_decay"]) == (0.01, 0.99)
    assert (ours["n_steps"], ours["vf_coef"], ours["gae_lambda"], ours["max_grad_norm"]) == (20, 0.25, 1.0, None)
    assert sb2_acktr_kwargs(continuous_actions=True)["normalize_advantage"]
    schedule = sb2_acktr_kwargs()["learning_rate"]
    assert isinstance(schedule, Sb2Schedule) and schedule(1.0) == 0.25 and schedule(0.4) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="`lr_schedule`"):
        sb2_acktr_kwargs(lr_schedule="cosine")
    model = ACKTR("MlpPolicy", "CartPole-v1", device="cpu", **sb2_acktr_kwargs(lr_schedule="constant"))
    model.learn(2 * SB2_DEFAULTS["n_steps"])
    assert model.kfac_damping_mode == EIGENBASIS_DAMPING
