"""The natural step itself: KL scaling, the line search, skipped steps, actor detection, policy batches."""

import math
import warnings

import numpy as np
import pytest
import torch
from stable_baselines3.common.logger import configure
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.utils import ConstantSchedule, LinearSchedule
from torch import nn

from sb3_npg import NPG, TRPO
from gymnasium import spaces

from sb3_npg.common import actor_update
from sb3_npg.common.batches import normalized_advantages, policy_sample, rollout_tensors, select_rows
from sb3_npg.common.distributed import Reducer
from sb3_npg.common.distributions import frozen_distribution, mean_kl
from sb3_npg.common.natural_gradient import fisher_vector_product, get_flat_params, set_flat_params_
from sb3_npg.common.natural_step import StepProposal
from sb3_npg.common.validation import scheduled_value

TINY = {"n_steps": 256, "batch_size": 64, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}
# Lightly damped, converged CG: the step's KL then follows the quadratic model, target_kl * s^T F s / s^T (F + d I) s.
# (Much lighter damping makes F + d I so ill-conditioned that float32 CG produces directions the model misjudges.)
EXACT_CG = {"cg_damping": 1e-3, "cg_max_steps": 100, "cg_residual_tol": 1e-14}


def filled(algo, env_id="Pendulum-v1", **kwargs):
    """A model whose rollout buffer holds one fresh rollout, ready for ``train()``."""
    model = algo("MlpPolicy", env_id, **{**TINY, **kwargs})
    _, callback = model._setup_learn(model.n_steps * model.n_envs)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    return model


def logged(model, key):
    return model.logger.name_to_value[f"train/{key}"]


def _flat(tensors):
    return torch.cat([tensor.reshape(-1) for tensor in tensors]).double()


def dense_natural_step(model, fisher_every=1):
    """
    NPG's step for the model's rollout, computed without any of the package's solvers: the surrogate's gradient, the
    KL's dense Hessian (one double backward per parameter) on every ``fisher_every``-th sample, a direct solve.
    """
    params = list(model.actor_parameters)
    normalize = lambda advantages: normalized_advantages(advantages, Reducer())  # noqa: E731
    discrete = isinstance(model.action_space, spaces.Discrete)
    shuffle = np.random.get_state()  # the buffer shuffles with numpy's generator: train() will draw the same order
    sample = policy_sample(rollout_tensors(model.rollout_buffer), 1, discrete_actions=discrete, normalize=normalize)
    np.random.set_state(shuffle)
    ratio = torch.exp(model.policy.get_distribution(sample.observations).log_prob(sample.actions) - sample.old_log_prob)
    gradient = _flat(torch.autograd.grad((sample.advantages * ratio).mean(), params))
    observations = select_rows(sample.observations, slice(None, None, fisher_every))
    kl = mean_kl(frozen_distribution(model.policy, observations), model.policy.get_distribution(observations))
    kl_gradient = torch.cat([grad.reshape(-1) for grad in torch.autograd.grad(kl, params, create_graph=True)])
    rows = [_flat(torch.autograd.grad(kl_gradient[i], params, retain_graph=True)) for i in range(len(kl_gradient))]
    damped = torch.stack(rows) + model.cg_damping * torch.eye(len(rows), dtype=torch.float64)
    direction = torch.linalg.solve(damped, gradient)
    return (torch.sqrt(2 * model.target_kl / (direction @ damped @ direction)) * direction).float()


def taken_step(model):
    """Train once and return the change of the actor parameters."""
    start = get_flat_params(model.actor_parameters)
    model.train()
    return get_flat_params(model.actor_parameters) - start


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_npg_takes_the_natural_step_that_a_dense_fisher_solve_gives(env_id):
    """A wrong Fisher (the identity, a stale or rescaled one) gives another direction or length and fails here."""
    model = filled(NPG, env_id, target_kl=1e-3, cg_max_steps=200, cg_residual_tol=1e-12)
    expected = dense_natural_step(model)
    step = taken_step(model)
    assert float((step - expected).norm() / expected.norm()) < 1e-3


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("target_kl", [1e-3, 1e-4])
def test_npg_step_lands_at_target_kl(env_id, target_kl):
    model = filled(NPG, env_id, target_kl=target_kl, **EXACT_CG)
    model.train()
    assert logged(model, "kl_divergence") == pytest.approx(target_kl, rel=0.15)
    assert logged(model, "step_fraction") == 1.0
    expected = logged(model, "expected_improvement")
    assert expected > 0
    assert logged(model, "surrogate_improvement") == pytest.approx(expected, rel=0.25)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_full_step_puts_the_damped_quadratic_kl_model_at_target_kl(env_id):
    """What the step is scaled by: ``1/2 step^T (F + cg_damping I) step == target_kl``, so the undamped model, which a
    small step's KL follows, lands under ``target_kl`` (with the default damping)."""
    model = filled(NPG, env_id)
    before = get_flat_params(model.actor_parameters).clone()
    model.train()
    step = get_flat_params(model.actor_parameters) - before
    set_flat_params_(model.actor_parameters, before)
    observations = rollout_tensors(model.rollout_buffer).observations
    kl = mean_kl(frozen_distribution(model.policy, observations), model.policy.get_distribution(observations))
    undamped = 0.5 * float(step @ fisher_vector_product(kl, model.actor_parameters, damping=0.0)(step))
    damped = undamped + 0.5 * model.cg_damping * float(step @ step)
    assert damped == pytest.approx(model.target_kl, rel=1e-3)
    assert undamped < 0.95 * model.target_kl
    for algo in (NPG, TRPO):  # and the docs say so
        assert "``1/2 step^T (F + cg_damping * I) step``, equals it" in " ".join((algo.__doc__ or "").split())


def _kl_from_behaviour(model, train):
    """Train ``model`` once with ``train()`` and measure the KL from the policy before it over the whole rollout."""
    observations = rollout_tensors(model.rollout_buffer).observations
    behaviour = frozen_distribution(model.policy, observations)
    train()
    with torch.no_grad():
        return float(mean_kl(behaviour, model.policy.get_distribution(observations)))


@pytest.mark.parametrize("policy_batch_size", [32, 64])
def test_trpo_with_policy_batches_stays_within_target_kl_of_the_behaviour_policy(policy_batch_size):
    model = filled(TRPO, target_kl=0.01, policy_batch_size=policy_batch_size)
    kl = _kl_from_behaviour(model, model.train)
    assert model._n_updates == math.ceil(TINY["n_steps"] / policy_batch_size)
    assert 0.0 < kl <= model.target_kl
    assert logged(model, "kl_divergence") == pytest.approx(kl, rel=1e-4)  # the log reports the same KL
    assert logged(model, "surrogate_improvement") > 0.0


def test_npg_warns_at_construction_that_policy_batches_leave_the_trust_region():
    with pytest.warns(UserWarning, match=r"NPG with `policy_batch_size`=64 takes 4 natural steps per update") as caught:
        NPG("MlpPolicy", "Pendulum-v1", **{**TINY, "policy_batch_size": 64})
    assert caught[0].filename == __file__  # the user's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NPG("MlpPolicy", "Pendulum-v1", **{**TINY, "policy_batch_size": TINY["n_steps"]})  # one batch: one step
        TRPO("MlpPolicy", "Pendulum-v1", **{**TINY, "policy_batch_size": 64})  # the line search bounds the KL


@pytest.mark.parametrize("algo", [NPG, TRPO])
@pytest.mark.parametrize(("policy_batch_size", "factor"), [(None, TINY["n_steps"]), (None, 10_000), (32, 32)])
def test_a_fisher_sub_sampling_factor_that_leaves_one_sample_is_refused(algo, policy_batch_size, factor):
    options = {**TINY, "policy_batch_size": policy_batch_size, "fisher_sub_sampling_factor": factor}
    with pytest.raises(ValueError, match=r"`fisher_sub_sampling_factor`=\d+ leaves one of the \d+ samples"):
        algo("MlpPolicy", "Pendulum-v1", **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NPG's policy-batch warning
        algo("MlpPolicy", "Pendulum-v1", **{**options, "fisher_sub_sampling_factor": (policy_batch_size or 256) - 1})


@pytest.mark.parametrize("policy_batch_size", [64, 100])
@pytest.mark.filterwarnings("ignore:NPG with `policy_batch_size`")
def test_npg_with_policy_batches_logs_its_kl_from_the_behaviour_policy(policy_batch_size):
    model = filled(NPG, target_kl=1e-3, policy_batch_size=policy_batch_size)
    kl = _kl_from_behaviour(model, model.train)
    assert model._n_updates == math.ceil(TINY["n_steps"] / policy_batch_size)
    # Each step moves target_kl from where it starts, so the KL from the behaviour policy adds up over the batches.
    assert kl > model.target_kl
    assert logged(model, "kl_divergence") == pytest.approx(kl, rel=1e-4)


def test_sub_sampling_factor_uses_every_nth_sample_for_the_policy_only():
    model = filled(TRPO, sub_sampling_factor=4)
    sizes = []
    natural_step = model._natural_step
    model._natural_step = lambda batch, *rest: (sizes.append(batch.size), natural_step(batch, *rest))[1]
    model.train()
    assert sizes == [TINY["n_steps"] // 4]


class _Proposal1D:
    """A one-parameter problem: surrogate(theta) = theta, KL(theta) = theta**2, full step from 0 to 1."""

    def __init__(self, improves=True):
        self.param = nn.Parameter(torch.zeros(1))
        sign = 1.0 if improves else -1.0
        self.proposal = StepProposal(
            params=[self.param],
            start=torch.zeros(1),
            full_step=torch.ones(1),
            kl_scale=1.0,
            surrogate_before=0.0,
            kl_before=0.0,
            expected_improvement=1.0,
            measure=lambda: (sign * self.param.item(), self.param.item() ** 2),
        )


def test_trpo_backtracks_to_the_first_step_inside_the_trust_region():
    model = TRPO("MlpPolicy", "CartPole-v1", target_kl=0.25, line_search_shrinking_factor=0.8, **TINY)
    problem = _Proposal1D()
    outcome = model._accept_step(problem.proposal)
    # 0.8**k <= 0.5 first at k = 4 (0.4096): KL 0.168 <= 0.25.
    assert outcome.fraction == pytest.approx(0.8**4)
    assert problem.param.item() == pytest.approx(0.8**4)
    assert outcome.kl == pytest.approx(0.8**8) and outcome.kl <= 0.25


def test_trpo_restores_the_old_parameters_when_no_candidate_improves():
    model = TRPO("MlpPolicy", "CartPole-v1", target_kl=0.25, line_search_max_iter=5, **TINY)
    problem = _Proposal1D(improves=False)
    outcome = model._accept_step(problem.proposal)
    assert outcome.fraction == 0.0 and outcome.kl == 0.0
    assert problem.param.item() == 0.0
    assert outcome.metrics["line_search_last_kl"] == pytest.approx(0.8**8)


@pytest.mark.parametrize("target_kl", [0.05, 0.5])
def test_trpo_never_accepts_a_step_beyond_target_kl(target_kl):
    # Lightly damped steps on Pendulum overshoot the quadratic model: NPG's full step exceeds the target here.
    settings = {"target_kl": target_kl, "cg_damping": 1e-3}
    npg, trpo = filled(NPG, **settings), filled(TRPO, line_search_shrinking_factor=0.5, **settings)
    assert (npg.rollout_buffer.observations == trpo.rollout_buffer.observations).all()
    npg.train()
    trpo.train()
    assert logged(npg, "kl_divergence") > target_kl, "the test must exercise a full step that overshoots"
    assert 0.0 < logged(trpo, "step_fraction") < 1.0
    assert 0.0 < logged(trpo, "kl_divergence") <= target_kl
    assert logged(trpo, "surrogate_improvement") > 0.0


@pytest.mark.parametrize("algo", [NPG, TRPO])
@pytest.mark.parametrize("fault", ["nan_advantage", "zero_advantage"])
def test_faulty_batch_is_skipped_parameters_unchanged_and_counted(algo, fault):
    model = filled(algo, normalize_advantage=fault == "nan_advantage")
    if fault == "nan_advantage":
        model.rollout_buffer.advantages[3] = float("nan")
    else:
        model.rollout_buffer.advantages[:] = 0.0
    before = get_flat_params(model.actor_parameters)
    with pytest.warns(RuntimeWarning, match="natural step skipped"):
        model.train()
    assert torch.equal(get_flat_params(model.actor_parameters), before)
    assert model.skipped_steps == 1 and logged(model, "skipped_steps") == 1
    assert logged(model, "step_fraction") == 0.0


class _SwappedNamesExtractor(nn.Module):
    """Its actor network is called ``value_net`` and its critic network ``policy_net``."""

    def __init__(self, feature_dim: int):
        super().__init__()
        self.latent_dim_pi = self.latent_dim_vf = 8
        self.value_net = nn.Sequential(nn.Linear(feature_dim, 8), nn.Tanh())
        self.policy_net = nn.Sequential(nn.Linear(feature_dim, 8), nn.Tanh())

    def forward(self, features):
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features):
        return self.value_net(features)

    def forward_critic(self, features):
        return self.policy_net(features)


class _SwappedNamesPolicy(ActorCriticPolicy):
    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = _SwappedNamesExtractor(self.features_dim)


@pytest.mark.parametrize("algo", [NPG, TRPO])
def test_actor_parameters_come_from_the_graph_not_from_names(algo):
    model = algo(_SwappedNamesPolicy, "Pendulum-v1", **TINY)
    names = {id(p): n for n, p in model.policy.named_parameters()}
    actor = {names[id(p)] for p in model.actor_parameters}
    critic = {names[id(p)] for p in model.critic_parameters}
    assert actor == {
        "log_std",
        "mlp_extractor.value_net.0.weight",
        "mlp_extractor.value_net.0.bias",
        "action_net.weight",
        "action_net.bias",
    }
    assert critic == {
        "mlp_extractor.policy_net.0.weight",
        "mlp_extractor.policy_net.0.bias",
        "value_net.weight",
        "value_net.bias",
    }
    model.learn(2 * TINY["n_steps"])


class _ShiftedObjectiveTRPO(TRPO):
    """Overrides the one objective method: a constant added to the surrogate, and a record of every call."""

    SHIFT = 1000.0

    def policy_objective(self, batch, distribution, behaviour):
        objective = super().policy_objective(batch, distribution, behaviour)
        self.calls.append("base point" if torch.is_grad_enabled() else "candidate")
        return objective._replace(surrogate=objective.surrogate + self.SHIFT)


def test_an_overridden_objective_is_what_the_base_point_and_every_line_search_candidate_measure():
    model = filled(_ShiftedObjectiveTRPO, line_search_shrinking_factor=0.5)
    model.calls = []
    model.train()
    assert model.calls[0] == "base point" and model.calls.count("base point") == 1
    assert model.calls.count("candidate") >= 1
    # Had the candidates been measured without the override, none would beat the shifted base point.
    assert logged(model, "is_line_search_success") == 1.0 and logged(model, "step_fraction") > 0.0
    assert logged(model, "policy_objective") == pytest.approx(_ShiftedObjectiveTRPO.SHIFT, abs=1.0)
    assert 0.0 < logged(model, "surrogate_improvement") < 1.0


def test_an_entropy_bonus_in_the_objective_changes_the_step():
    class EntropyBonusNPG(NPG):
        def policy_objective(self, batch, distribution, behaviour):
            objective = super().policy_objective(batch, distribution, behaviour)
            return objective._replace(surrogate=objective.surrogate + distribution.entropy().mean())

    plain, bonus = filled(NPG), filled(EntropyBonusNPG)
    plain.train()
    bonus.train()
    assert logged(bonus, "policy_grad_norm") != logged(plain, "policy_grad_norm")
    assert not torch.equal(get_flat_params(bonus.actor_parameters), get_flat_params(plain.actor_parameters))


@pytest.mark.parametrize("algo", [NPG, TRPO])
@pytest.mark.parametrize("scale", [1e-3, 1e-5])
def test_the_natural_step_does_not_depend_on_the_reward_scale(algo, scale):
    """With raw advantages (what scaled rewards give the policy), conjugate gradient stops relative to the gradient."""
    reference, scaled = filled(algo, normalize_advantage=False), filled(algo, normalize_advantage=False)
    scaled.rollout_buffer.advantages *= scale
    start = get_flat_params(reference.actor_parameters)
    reference.train()
    scaled.train()
    assert scaled.skipped_steps == reference.skipped_steps == 0
    assert logged(scaled, "cg_iterations") > 3 and logged(reference, "cg_iterations") > 3
    step, scaled_step = get_flat_params(reference.actor_parameters) - start, get_flat_params(scaled.actor_parameters) - start
    # The same step up to float32 rounding (the iteration counts may differ by one or two near the tolerance).
    assert float((scaled_step - step).norm() / step.norm()) < 1e-4


# ------------------------------------------------------------------ target_kl as a schedule of the remaining progress

#: The KL radius falls from 0.04 at the start of training to 0.01 at its end.
RADIUS_SCHEDULE = LinearSchedule(0.04, 0.01, end_fraction=1.0)
#: Four updates of 64 samples run at these remaining progresses (SB3 updates it after each rollout).
FOUR_UPDATES = {"n_steps": 64, "batch_size": 64}
FOUR_PROGRESSES = (0.75, 0.5, 0.25, 0.0)


def _learn_four_updates(algo, tmp_path, target_kl):
    """Four updates on Pendulum; the radius each natural step was solved with, and ``train/target_kl`` of each."""
    radii, logged = [], []
    propose = actor_update.propose_step

    def spy(surrogate, params, fisher, mean, settings, *rest):
        radii.append(settings.target_kl)
        return propose(surrogate, params, fisher, mean, settings, *rest)

    model = algo("MlpPolicy", "Pendulum-v1", target_kl=target_kl, **{**TINY, **FOUR_UPDATES})
    model.set_logger(configure(str(tmp_path), ["csv"]))
    record = model.logger.record

    def recorded(key, value, exclude=None):
        if key == "train/target_kl":
            logged.append(value)
        record(key, value, exclude)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(actor_update, "propose_step", spy)
        patch.setattr(model.logger, "record", recorded)
        model.learn(len(FOUR_PROGRESSES) * FOUR_UPDATES["n_steps"])
    return model, radii, logged


@pytest.mark.parametrize("algo", [NPG, TRPO])
def test_a_target_kl_schedule_sets_the_radius_of_each_update_and_the_log_says_which(algo, tmp_path):
    model, radii, logged = _learn_four_updates(algo, tmp_path, RADIUS_SCHEDULE)
    expected = [RADIUS_SCHEDULE(progress) for progress in FOUR_PROGRESSES]  # 0.0325, 0.025, 0.0175, 0.01
    assert radii == pytest.approx(expected)
    assert logged == pytest.approx(expected)
    assert model.target_kl is RADIUS_SCHEDULE  # kept as given, for save and load


@pytest.mark.parametrize("algo", [NPG, TRPO])
def test_a_float_target_kl_is_the_same_radius_at_every_update_as_before(algo, tmp_path):
    model, radii, logged = _learn_four_updates(algo, tmp_path / "float", 0.02)
    assert model.target_kl == 0.02 and isinstance(model.target_kl, float)
    assert radii == logged == [0.02] * len(FOUR_PROGRESSES)
    constant, _, _ = _learn_four_updates(algo, tmp_path / "constant", ConstantSchedule(0.02))
    assert torch.equal(get_flat_params(constant.policy.parameters()), get_flat_params(model.policy.parameters()))


@pytest.mark.parametrize(("progress", "radius"), [(1.0, 1.5e-3), (0.25, 0.75e-3)])
def test_npg_step_lands_at_the_schedules_radius_at_the_current_progress(progress, radius):
    model = filled(NPG, "CartPole-v1", target_kl=lambda remaining: 1e-3 * (0.5 + remaining), **EXACT_CG)
    model._current_progress_remaining = progress
    model.train()
    assert logged(model, "target_kl") == pytest.approx(radius)
    assert logged(model, "kl_divergence") == pytest.approx(radius, rel=0.15)


def test_trpo_accepts_a_candidate_within_the_schedules_radius_at_the_current_progress():
    model = TRPO("MlpPolicy", "CartPole-v1", target_kl=lambda remaining: 0.25 * remaining, **TINY)
    model._current_progress_remaining = 0.5
    outcome = model._accept_step(_Proposal1D().proposal)
    # Radius 0.125: 0.8**(2k) <= 0.125 first at k = 5 (at the start of training, radius 0.25, it was k = 4).
    assert outcome.fraction == pytest.approx(0.8**5)
    assert outcome.kl <= 0.125


@pytest.mark.parametrize("algo", [NPG, TRPO])
@pytest.mark.parametrize(
    "schedule", [LinearSchedule(0.02, 0.0, 1.0), lambda remaining: 0.02 * remaining], ids=["sb3", "lambda"]
)
def test_a_target_kl_schedule_reaching_0_takes_no_step_at_the_end(algo, schedule, tmp_path):
    model, radii, logged_radii = _learn_four_updates(algo, tmp_path, schedule)
    # The last update (radius 0) proposes no step (three radii solved for, four logged), refuses none, moves nothing.
    assert radii == pytest.approx([0.015, 0.01, 0.005]) and logged_radii == pytest.approx([0.015, 0.01, 0.005, 0.0])
    assert logged(model, "step_fraction") == 0.0 and logged(model, "kl_divergence") == 0.0
    assert logged(model, "surrogate_improvement") == 0.0 and model.skipped_steps == 0


def test_a_schedule_value_within_rounding_of_0_is_0_and_progress_past_the_end_is_the_end():
    assert scheduled_value("target_kl", lambda remaining: 0.25 if remaining > 0 else -1e-12, 0.0) == 0.0
    assert scheduled_value("target_kl", lambda remaining: 0.25 * remaining, -0.3) == 0.0  # learn() overshot
    with pytest.raises(ValueError, match=r"`target_kl`.* gives -0\.001 at progress_remaining=0"):
        scheduled_value("target_kl", lambda remaining: 0.25 if remaining > 0 else -1e-3, 0.0)


@pytest.mark.parametrize("algo", [NPG, TRPO])
@pytest.mark.parametrize("value", [-0.01, math.nan, math.inf])
def test_a_schedule_value_that_is_negative_or_not_finite_stops_training_naming_target_kl(algo, value):
    model = algo("MlpPolicy", "Pendulum-v1", target_kl=lambda remaining: 0.01 if remaining > 0.5 else value, **TINY)
    with pytest.raises(ValueError, match=r"`target_kl`.* gives .* at progress_remaining=0\.5"):
        model.learn(4 * TINY["n_steps"])
    assert model._n_updates == 1  # the second update (at progress 0.5) stopped before its natural step


def test_a_rollout_too_small_to_normalize_names_both_ways_out():
    with pytest.raises(
        ValueError, match=r"raise `n_steps` or the number of environments, or pass `normalize_advantage=False`"
    ):
        NPG("MlpPolicy", "CartPole-v1", n_steps=1, batch_size=1, device="cpu")


@pytest.mark.parametrize("algo", [NPG, TRPO])
def test_tensorboard_logging_without_tensorboard_says_which_extra_to_install(algo, tmp_path, monkeypatch):
    from stable_baselines3.common import utils as sb3_utils

    monkeypatch.setattr(sb3_utils, "SummaryWriter", None)  # as if tensorboard were not installed
    model = algo("MlpPolicy", "CartPole-v1", tensorboard_log=str(tmp_path), **TINY)
    with pytest.raises(ImportError, match=r'tensorboard is not installed.*pip install "sb3-npg\[tensorboard\]"'):
        model.learn(TINY["n_steps"])
