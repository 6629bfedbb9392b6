"""ACKTR: the KL clip, the running factors, saving them, every space and policy, and its critic."""

import copy
import inspect
from pathlib import Path

import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.utils import LinearSchedule

import tests.test_integration as integration
import tests.test_logging as logging_tests
import tests.test_rollouts as rollouts
from sb3_npg import ACKTR
from sb3_npg.acktr import BASELINES_ATARI_SETTINGS, sb2_acktr_kwargs
from sb3_npg.acktr.acktr import ACKTR_LOGGED_KEYS
from sb3_npg.acktr.critic import critic_batch_curvature
from sb3_npg.common.algorithm import NOT_ON_STDOUT
from sb3_npg.common.batches import policy_sample, rollout_tensors
from sb3_npg.common.kfac_policy import kfac_product
from sb3_npg.common.natural_gradient import get_flat_params
from tests.float_comparisons import (
    AMPLIFIED_RTOL,
    float64_buffer,
    preprocess_to_float64,
    relative_step_difference,
    to_float64,
    unit_roundoff,
)

TINY = {"n_steps": 64, "batch_size": 32, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}
#: The paper's (and baselines') K-FAC critic, one step per update.
KFAC_CRITIC = {"critic_fit": "kfac", "n_critic_updates": 1}
#: OpenAI baselines' acktr/acktr.py (``learn``'s defaults; its ``KfacOptimizer``'s ``epsilon`` and ``stats_decay``),
#: written out here apart from the library's constant so that a change to either shows.
OPENAI_BASELINES_ATARI = {
    "n_steps": 20,
    "learning_rate": 0.25,
    "gamma": 0.99,
    "gae_lambda": 1.0,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "vf_fisher_coef": 1.0,
    "max_grad_norm": 0.5,
    "normalize_advantage": False,
    "kfac_clip": 0.001,
    "kfac_update": 1,
    "kfac_damping": 0.01,
    "kfac_stats_decay": 0.99,
    "critic_fit": "kfac",
    "critic_kfac_clip": None,
    "n_critic_updates": 1,
    "normalize_value_targets": False,
}
#: The defaults for vector observations, as the class docstring and docs/guide/algorithms.md give them.
DOCUMENTED_DEFAULTS = {
    **OPENAI_BASELINES_ATARI,
    "n_steps": 1024,
    "gae_lambda": 0.98,
    "ent_coef": 0.0,
    "normalize_advantage": True,
    "kfac_clip": 0.01,
    "kfac_stats_decay": 0.5,
    "critic_fit": "minibatch",
    "n_critic_updates": 10,
}
#: float32 steps: the quadratic model's KL of a step is met to this relative precision.
STEP_RTOL = 1e-4


class RecordingACKTR(ACKTR):
    """ACKTR recording every proposal and outcome of its hook, and every batch's curvature."""

    def _setup_model(self) -> None:
        super()._setup_model()
        self.outcomes: list = []
        self.batches: list = []

    def _accept_step(self, proposal):
        outcome = super()._accept_step(proposal)
        self.outcomes.append((proposal, outcome))
        return outcome

    def _actor_curvature(self, observations):
        batch = super()._actor_curvature(observations)
        self.batches.append(copy.deepcopy(batch))
        return batch


def _quadratic_kl(model: ACKTR, step: torch.Tensor) -> float:
    """``1/2 step^T F_hat step`` under the model's running K-FAC Fisher."""
    return 0.5 * float(torch.dot(step, kfac_product(model._actor_plan, model.kfac_statistics.curvature(), step)))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_clipped_step_has_the_quadratic_model_kl_kfac_clip(env_id):
    model = RecordingACKTR("MlpPolicy", env_id, learning_rate=1e3, kfac_clip=0.002, **TINY)
    model.learn(TINY["n_steps"])
    ((proposal, outcome),) = model.outcomes
    assert outcome.fraction == 1.0 and outcome.metrics["kl_clip_fraction"] == 1.0
    assert _quadratic_kl(model, proposal.full_step) == pytest.approx(0.002, rel=STEP_RTOL)


def test_the_learning_rate_caps_a_step_below_the_clip():
    model = RecordingACKTR("MlpPolicy", "CartPole-v1", learning_rate=1e-4, kfac_clip=0.002, **TINY)
    before = get_flat_params(model.actor_parameters)
    model.learn(TINY["n_steps"])
    ((proposal, outcome),) = model.outcomes
    step = get_flat_params(model.actor_parameters) - before
    direction = proposal.full_step / proposal.kl_scale
    assert outcome.fraction < 1.0 and outcome.metrics["step_size"] == pytest.approx(1e-4)
    # The step is a difference of float32 parameters: each rounded to half an ulp of the larger of before and after.
    atol = 2 * unit_roundoff(torch.float32) * float(before.abs().max() + step.abs().max())
    torch.testing.assert_close(step, 1e-4 * direction, rtol=0.0, atol=atol)
    assert _quadratic_kl(model, step) < 0.002


def test_the_factors_are_the_exponentially_weighted_average_of_every_batch():
    decay = 0.8
    model = RecordingACKTR("MlpPolicy", "Pendulum-v1", kfac_stats_decay=decay, **TINY)
    model.learn(4 * TINY["n_steps"])
    assert len(model.batches) == 4 and int(model.kfac_statistics.updates) == 4
    expected = [factor.clone() for pair in model.batches[0].layer_factors for factor in pair]
    expected += [block.clone() for block in model.batches[0].block_fishers]
    for batch in model.batches[1:]:
        fresh = [factor for pair in batch.layer_factors for factor in pair] + list(batch.block_fishers)
        expected = [decay * old + (1 - decay) * new for old, new in zip(expected, fresh, strict=True)]
    running = model.kfac_statistics._tensors("running")
    assert len(running) == len(expected) == 2 * len(model._actor_plan.layers) + len(model._actor_plan.blocks)
    for got, want in zip(running, expected, strict=True):
        # portable: float32, four elementwise averaging steps of the same tensors (no reduction): a few ulps each
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(running[0], model.batches[-1].layer_factors[0][0]), "the average must not be the last batch"


def _copy_rollout(source: ACKTR, target: ACKTR) -> None:
    for name in ("observations", "actions", "rewards", "advantages", "returns", "episode_starts", "values", "log_probs"):
        destination = getattr(target.rollout_buffer, name)
        destination[:] = getattr(source.rollout_buffer, name).reshape(destination.shape)
    target.rollout_buffer.full, target.rollout_buffer.generator_ready = True, False


@pytest.mark.parametrize("kfac_update", [1, 2])
def test_a_loaded_model_takes_exactly_the_update_the_saved_one_takes(tmp_path, kfac_update, monkeypatch):
    """With ``kfac_update=2`` the third update inverted, the fourth reuses that inverse: a loaded model rebuilds it from
    the saved copy of the curvature it came from, not from the running averages.

    The saved float32 state loads to the bit; the compared update runs in float64 (``tests/float_comparisons.py``):
    two copies of one rollout sit differently in memory, which changes a float32 matrix product's last bits by an
    amount that depends on the CPU's kernels, and the inverse's eigendecompositions amplify it."""
    # The K-FAC critic (its statistics are saved too) in one step: the default minibatch critic shuffles its batch
    # with NumPy's global generator, which a loaded model does not share.
    model = ACKTR("MlpPolicy", "Pendulum-v1", kfac_update=kfac_update, **KFAC_CRITIC, **TINY)
    model.learn(3 * TINY["n_steps"])
    model.save(tmp_path / "acktr.zip")
    loaded = ACKTR.load(tmp_path / "acktr.zip", env=model.get_env())
    assert int(loaded.kfac_statistics.updates) == 3
    for statistics in ("kfac_statistics", "critic_kfac_statistics"):
        saved, restored = getattr(model, statistics).state_dict(), getattr(loaded, statistics).state_dict()
        assert all(torch.equal(restored[name], value) for name, value in saved.items()), statistics
    _copy_rollout(model, loaded)
    preprocess_to_float64(monkeypatch)
    start = get_flat_params(list(model.policy.parameters())).double()
    for each in (model, loaded):
        to_float64(each)
        float64_buffer(each)
        each.set_logger(configure(None, []))
        each.train()
    want, got = (get_flat_params(list(each.policy.parameters())) for each in (model, loaded))
    assert relative_step_difference(got, want, start) < AMPLIFIED_RTOL
    for statistics in ("kfac_statistics", "critic_kfac_statistics"):
        saved, restored = getattr(model, statistics).state_dict(), getattr(loaded, statistics).state_dict()
        for name, value in saved.items():
            if not value.is_floating_point():  # the counters
                assert torch.equal(restored[name], value), name
                continue
            difference = float((restored[name] - value).norm() / value.norm().clamp_min(torch.finfo(value.dtype).tiny))
            assert difference < AMPLIFIED_RTOL, name


def test_the_policy_stays_sb3s_own_and_saves_and_loads_alone(tmp_path):
    model = ACKTR("MlpPolicy", "CartPole-v1", **TINY)
    model.learn(TINY["n_steps"])
    model.policy.save(tmp_path / "policy.pth")
    policy = type(model.policy).load(tmp_path / "policy.pth")
    assert set(policy.state_dict()) == set(model.policy.state_dict())


@pytest.mark.parametrize("observation", integration.OBSERVATION_SPACES)
@pytest.mark.parametrize("action", integration.ACTION_SPACES)
def test_every_action_and_observation_space_moves_actor_and_critic(action, observation):
    integration.test_every_action_and_observation_space_moves_actor_and_critic(ACKTR, action, observation)


def test_gsde_and_cnn_policies():
    integration.test_gsde_on_box_actions(ACKTR)
    integration.test_image_observations_with_cnn_policy_keeps_shared_extractor_out_of_the_critic(ACKTR)


def test_cnn_layers_are_kronecker_factored_not_refused():
    env = integration._SpacesEnv(integration.IMAGE, integration.ACTION_SPACES["discrete"])
    kwargs = {**TINY, "policy_kwargs": {"net_arch": [16], "features_extractor_kwargs": {"features_dim": 16}}}
    model = ACKTR("CnnPolicy", env, **kwargs)
    convolutions = [layer for layer in model._actor_plan.layers if isinstance(layer, torch.nn.Conv2d)]
    assert len(convolutions) == 3 and not model._actor_plan.blocks


def _value_loss(model) -> float:
    """The critic's mean squared error on the rollout's returns (the observations flattened over environments)."""
    buffer = model.rollout_buffer
    observations = torch.as_tensor(buffer.observations.reshape(-1, *buffer.obs_shape))
    with torch.no_grad():
        values = model.policy.predict_values(observations).flatten()
    return float(torch.nn.functional.mse_loss(values, torch.as_tensor(buffer.returns.flatten())))


class ValueLossBeforeTheUpdate(BaseCallback):
    """The critic's loss on the rollout just collected, with the parameters ``train()`` starts from."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.losses.append(_value_loss(self.model))


@pytest.mark.parametrize("critic_fit", ["kfac", "minibatch", "lbfgs"])
def test_every_critic_fit_lowers_the_value_loss(critic_fit):
    model = ACKTR("MlpPolicy", "Pendulum-v1", critic_fit=critic_fit, n_critic_updates=5, normalize_advantage=True, **TINY)
    before = ValueLossBeforeTheUpdate()
    model.learn(TINY["n_steps"], callback=before)
    assert _value_loss(model) < before.losses[-1]
    assert model.logger.name_to_value["train/learning_rate"] == 0.25
    if critic_fit == "minibatch":
        assert model.policy.optimizer.param_groups[0]["lr"] == model.critic_learning_rate


def test_the_kfac_critic_step_obeys_its_own_clip():
    model = ACKTR("MlpPolicy", "Pendulum-v1", learning_rate=1e3, critic_kfac_clip=0.05, **KFAC_CRITIC, **TINY)
    before = get_flat_params(model.critic_parameters)
    model.learn(TINY["n_steps"])
    step = get_flat_params(model.critic_parameters) - before
    curvature = model.critic_kfac_statistics.curvature()
    kl = 0.5 * float(torch.dot(step, kfac_product(model._critic_plan, curvature, step)))
    assert kl == pytest.approx(0.05, rel=1e-3)


def test_callbacks_see_every_step():
    class Count(BaseCallback):
        calls = 0

        def _on_step(self) -> bool:
            Count.calls += 1
            return True

    ACKTR("MlpPolicy", "Pendulum-v1", **TINY).learn(2 * TINY["n_steps"], callback=Count())
    assert Count.calls == 2 * TINY["n_steps"]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_fast_loop_collects_sb3s_rollouts_between_acktr_updates(env_id):
    rollouts.assert_same_rollouts(
        lambda: ACKTR("MlpPolicy", make_vec_env(env_id, n_envs=2, seed=0), **{**rollouts.TINY, "n_critic_updates": 2})
    )


def test_options_are_checked_with_their_names():
    for option, value in [
        ("kfac_clip", 0.0),
        ("kfac_update", 0),
        ("kfac_damping", 0.0),
        ("kfac_stats_decay", 1.0),
        ("vf_fisher_coef", 0.0),
        ("critic_kfac_clip", -1.0),
        ("critic_fit", "adam"),
        ("ent_coef", -0.1),
    ]:
        with pytest.raises(ValueError, match=f"`{option}`"):
            ACKTR("MlpPolicy", "CartPole-v1", **{**TINY, option: value})


def test_the_signature_keeps_stable_baselines_2s_keyword_names_and_documents_every_option():
    parameters = inspect.signature(ACKTR).parameters
    for name in ("n_steps", "ent_coef", "vf_coef", "vf_fisher_coef", "learning_rate", "max_grad_norm", "kfac_clip"):
        assert name in parameters, name
    for name in parameters:
        if not name.startswith("_") and name not in ("policy", "env"):
            assert f":param {name}:" in ACKTR.__doc__, name


def test_the_atari_settings_are_openai_baselines_and_the_defaults_the_documented_ones():
    assert BASELINES_ATARI_SETTINGS == OPENAI_BASELINES_ATARI
    parameters = inspect.signature(ACKTR).parameters
    assert {name: parameters[name].default for name in DOCUMENTED_DEFAULTS} == DOCUMENTED_DEFAULTS
    page = (Path(__file__).parents[1] / "docs" / "guide" / "algorithms.md").read_text(encoding="utf-8")
    page = page[page.index("Its defaults are for vector observations") :].split("\n\n", 1)[0]  # the paragraph
    docstring = " ".join(ACKTR.__doc__.split())
    for name, value in DOCUMENTED_DEFAULTS.items():
        if value != OPENAI_BASELINES_ATARI[name]:
            shown = f'"{value}"' if isinstance(value, str) else repr(value)
            assert f"`{name}={shown}`" in page, name
            assert f"``{name}={shown}``" in docstring, name


def test_the_atari_settings_reach_the_model():
    model = ACKTR("MlpPolicy", "CartPole-v1", **{**BASELINES_ATARI_SETTINGS, "seed": 0, "device": "cpu"})
    assert {name: getattr(model, name) for name in BASELINES_ATARI_SETTINGS} == BASELINES_ATARI_SETTINGS


def test_the_objective_adds_ent_coef_times_the_mean_entropy():
    model = ACKTR("MlpPolicy", "CartPole-v1", ent_coef=0.5, **TINY)
    model.learn(TINY["n_steps"])
    sample = policy_sample(rollout_tensors(model.rollout_buffer), 1, discrete_actions=True, normalize=None)
    distribution = model.policy.get_distribution(sample.observations)
    with_bonus = model.policy_objective(sample, distribution, distribution)
    model.ent_coef = 0.0
    without = model.policy_objective(sample, distribution, distribution)
    entropy = distribution.entropy().mean()
    assert float(entropy) > 0.0
    torch.testing.assert_close(with_bonus.surrogate - without.surrogate, 0.5 * entropy)
    assert torch.equal(with_bonus.kl, without.kl)


def test_statistics_loaded_into_a_live_model_replace_its_cached_inverse():
    model = ACKTR("MlpPolicy", "Pendulum-v1", kfac_update=100, **TINY)
    model.learn(TINY["n_steps"])
    state = copy.deepcopy(model.kfac_statistics.state_dict())
    first = model.kfac_statistics.inverse(model._actor_plan, model._kfac_settings)
    model.learn(TINY["n_steps"], reset_num_timesteps=False)
    assert model.kfac_statistics.inverse(model._actor_plan, model._kfac_settings) is first  # kfac_update=100: kept
    model.set_parameters({**model.get_parameters(), "kfac_statistics": state})
    assert model.kfac_statistics.inverse(model._actor_plan, model._kfac_settings) is not first


def test_the_log_holds_acktrs_keys_and_the_stdout_table_stays_short(tmp_path, capsys):
    model = ACKTR("MlpPolicy", "Pendulum-v1", **TINY)
    model.set_logger(configure(str(tmp_path), ["stdout", "csv"]))
    capsys.readouterr()
    model.learn(2 * TINY["n_steps"])
    printed = logging_tests._train_rows(capsys.readouterr().out)
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    assert {f"train/{key}" for key in ACKTR_LOGGED_KEYS} <= set(header)
    assert not {"train/cg_iterations", "train/cg_residual"} & set(header), "ACKTR runs no conjugate gradient"
    assert {"kl_divergence", "kl_clip_fraction", "step_fraction", "value_loss"} <= set(printed)
    assert len(printed) <= 12 and not set(printed) & NOT_ON_STDOUT, printed


@pytest.mark.parametrize("kfac_update", [1, 2, 3])
def test_the_inverse_is_recomputed_every_kfac_update_updates(kfac_update):
    """The running factors are averaged at every update; the inverse comes from them at the first update and then
    every ``kfac_update`` updates (1, 1 + k, 1 + 2k...), for the actor and the K-FAC critic alike."""
    model = ACKTR("MlpPolicy", "Pendulum-v1", kfac_update=kfac_update, **KFAC_CRITIC, **TINY)
    inverted_at = []
    for _ in range(7):
        model.learn(TINY["n_steps"], reset_num_timesteps=False)
        inverted_at.append((int(model.kfac_statistics.inverted_at), int(model.critic_kfac_statistics.inverted_at)))
    updates = range(1, 8)
    expected = [1 + (update - 1) // kfac_update * kfac_update for update in updates]
    assert inverted_at == [(at, at) for at in expected]
    assert int(model.kfac_statistics.updates) == int(model.critic_kfac_statistics.updates) == 7


def test_between_inversions_the_step_is_scaled_by_the_current_factors_not_the_inverted_ones():
    """With ``kfac_update=2`` the second update reuses the first one's inverse, but its KL clip is the quadratic
    model's under the running factors that update has just averaged in."""
    settings = {**TINY, "learning_rate": 1e3, "kfac_clip": 0.002, "kfac_update": 2, "kfac_stats_decay": 0.5}
    model = RecordingACKTR("MlpPolicy", "Pendulum-v1", **settings)
    model.learn(2 * TINY["n_steps"])
    proposal, outcome = model.outcomes[-1]
    assert int(model.kfac_statistics.inverted_at) == 1 and outcome.fraction == 1.0
    assert _quadratic_kl(model, proposal.full_step) == pytest.approx(0.002, rel=STEP_RTOL)
    inverted = model.kfac_statistics.curvature("inverted")
    stale = 0.5 * float(torch.dot(proposal.full_step, kfac_product(model._actor_plan, inverted, proposal.full_step)))
    assert abs(stale - 0.002) > 100 * STEP_RTOL * 0.002  # the stale factors would give another step


#: A power of two: scaling every weight of the critic's Gauss-Newton factor by it rounds the same, so the factors of
#: two runs differ by that factor exactly; a few ulps are allowed all the same.
FISHER_SCALE = 4.0
# portable: a power-of-two scale is exact in float32; 8 ulps allowed for a product's last bits
SCALED_RTOL = 1e-6


def _critic_factors(model: ACKTR) -> list[torch.Tensor]:
    """The K-FAC critic's running factors, each layer's ``A`` then ``G``."""
    return [factor.clone() for factor in model.critic_kfac_statistics._tensors("running")]


def test_vf_fisher_coef_scales_the_critics_gauss_newton_output_factors():
    """The critic's Fisher is ``vf_fisher_coef E[J^T J]``: its ``G`` factors (never its input factors) scale by it."""
    factors = {}
    for coef in (1.0, FISHER_SCALE):
        model = ACKTR("MlpPolicy", "Pendulum-v1", vf_fisher_coef=coef, **KFAC_CRITIC, **TINY)
        model.learn(TINY["n_steps"])
        factors[coef] = _critic_factors(model)
    for index, (unit, scaled) in enumerate(zip(factors[1.0], factors[FISHER_SCALE], strict=True)):
        is_output_factor = index % 2 == 1
        expected = FISHER_SCALE * unit if is_output_factor else unit
        torch.testing.assert_close(scaled, expected, rtol=SCALED_RTOL, atol=0.0)


#: A learning rate that caps the critic's step (its own KL clip is made loose), and steps large enough to measure.
CAPPED_CRITIC = {**KFAC_CRITIC, "learning_rate": 0.01, "critic_kfac_clip": 1e3, "max_grad_norm": None}


def test_vf_coef_scales_the_critics_step_when_the_learning_rate_caps_it():
    """Under the learning-rate cap the critic moves by ``learning_rate * K^-1 (vf_coef * g)``: linear in ``vf_coef``
    (where the KL clip binds, the scale of the gradient cancels)."""
    steps = {}
    for vf_coef in (0.5, 1.0):
        model = ACKTR("MlpPolicy", "Pendulum-v1", vf_coef=vf_coef, **{**TINY, **CAPPED_CRITIC})
        before = get_flat_params(model.critic_parameters)
        model.learn(TINY["n_steps"])
        assert model.logger.name_to_value["train/value_step_size"] == CAPPED_CRITIC["learning_rate"]  # the cap binds
        steps[vf_coef] = get_flat_params(model.critic_parameters) - before
    # Each parameter's change is rounded once where it is added, to within an ulp of the parameter.
    ulp = torch.finfo(torch.float32).eps * float(before.abs().max())
    assert float(steps[1.0].abs().max()) > 1e3 * ulp
    torch.testing.assert_close(steps[0.5], 0.5 * steps[1.0], rtol=0.0, atol=2 * ulp)


def test_the_normalized_critics_gauss_newton_factors_are_those_of_its_normalized_values():
    """Under ``normalize_value_targets`` the critic's loss and its Fisher are in normalized units: the factors are the
    same whatever the targets' mean and standard deviation (raw values would scale ``G`` by the variance), and the
    linear head's block is the exact Gauss-Newton block of its normalized output, ``G = vf_fisher_coef``."""
    model = ACKTR("MlpPolicy", "Pendulum-v1", normalize_value_targets=True, **KFAC_CRITIC, **TINY)
    head = model.policy.value_net
    assert model._critic_plan.layers[-1] is head
    observations = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
    factors = []
    for mean, variance in ((0.0, 1.0), (3.0, 64.0)):
        head.target_mean.fill_(mean)
        head.target_var.fill_(variance)
        batch = critic_batch_curvature(model._critic_plan, model.policy, observations, FISHER_SCALE, lambda factor: factor)
        factors.append([factor for pair in batch.layer_factors for factor in pair])
        # d(normalized value) / d(W x + b) is 1 for every sample: the head's G is the coefficient, to float32 rounding.
        # portable: a mean of 32 ones times a power of two is exact in float32; 8 ulps allowed
        torch.testing.assert_close(factors[-1][-1], torch.full((1, 1), FISHER_SCALE), rtol=1e-6, atol=0.0)
    for unit, moved in zip(*factors, strict=True):
        # The normalized values' gradients pass through one multiplication and one division by the std: a few ulps
        # of each factor's scale (its entries are means of products of those gradients, or of the same inputs).
        # portable: float32, one multiplication and one division per gradient, then means of 32: within gamma_32 (2e-6)
        torch.testing.assert_close(moved, unit, rtol=0.0, atol=1e-5 * float(unit.abs().max()))


class SnapshotACKTR(ACKTR):
    """ACKTR keeping the policy's parameters before and after each update."""

    def _setup_model(self) -> None:
        super()._setup_model()
        self.updates: list[tuple[torch.Tensor, torch.Tensor]] = []

    def train(self) -> None:
        before = get_flat_params(list(self.policy.parameters())).clone()
        super().train()
        self.updates.append((before, get_flat_params(list(self.policy.parameters())).clone()))


#: Two updates of TINY's rollouts run at remaining progress 0.5 and 0.
TWO_UPDATES = 2 * TINY["n_steps"]


@pytest.mark.parametrize(
    "option",
    [
        {"learning_rate": LinearSchedule(0.25, 0.0, 1.0)},
        {"learning_rate": lambda remaining: 0.25 * remaining},
        {"kfac_clip": LinearSchedule(0.001, 0.0, 1.0)},
    ],
    ids=["linear_lr", "lambda_lr", "linear_kfac_clip"],
)
def test_a_schedule_reaching_0_finishes_learn_and_its_last_update_moves_nothing(option):
    # The K-FAC critic, whose steps learning_rate caps (the minibatch critic runs at critic_learning_rate).
    model = SnapshotACKTR("MlpPolicy", "Pendulum-v1", **{**TINY, **KFAC_CRITIC, **option})
    model.learn(TWO_UPDATES)
    (first_before, first_after), (last_before, last_after) = model.updates
    assert not torch.equal(first_before, first_after)  # actor and critic moved at progress 0.5
    assert torch.equal(last_before, last_after)  # at progress 0: a zero step for the actor and the critic
    assert model.logger.name_to_value["train/step_fraction"] == 0.0


def test_a_kfac_clip_schedule_below_0_names_kfac_clip():
    model = ACKTR("MlpPolicy", "CartPole-v1", kfac_clip=lambda remaining: 0.001 if remaining > 0.5 else -1.0, **TINY)
    with pytest.raises(ValueError, match=r"`kfac_clip` must be .* gives -1\.0 at progress_remaining=0\.5") as raised:
        model.learn(4 * TINY["n_steps"])
    assert "target_kl" not in str(raised.value)


def test_an_sb2_configuration_with_its_linear_lr_schedule_finishes_learn():
    kwargs = sb2_acktr_kwargs(lr_schedule="linear")
    model = SnapshotACKTR("MlpPolicy", "CartPole-v1", device="cpu", **kwargs)
    model.learn(2 * kwargs["n_steps"])
    assert len(model.updates) == 2 and torch.equal(*model.updates[-1])  # the linear schedule's last step is zero
