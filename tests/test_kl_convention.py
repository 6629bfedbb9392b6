"""``kl_per_action_dimension``: sb3-contrib's per-dimension ``target_kl`` and ``cg_damping``, scaled to our summed KL."""

import pytest
import torch
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_npg import NPG, TRPO
from sb3_npg.common.natural_gradient import get_flat_params
from tests.test_integration import VECTOR, _SpacesEnv
from tests.test_reliability import KL_SPACES

TINY = {"n_steps": 64, "batch_size": 32, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}
#: The per-dimension values given with the option, as sb3-contrib's TRPO takes them.
PER_DIMENSION = {"target_kl": 0.01, "cg_damping": 0.1}
#: Per action space of ``KL_SPACES``: how many per-dimension KLs sb3-contrib averages (a Box's size, a MultiBinary's
#: bits; SB3 already sums a MultiDiscrete's sub-actions), written out rather than computed by the code under test.
KL_COMPONENTS = {"discrete": 1, "box": 3, "multi_discrete": 1, "multi_binary": 3}
#: Two models built alike and given the same radius and damping take the same step, up to float32 rounding.
# portable: one process, the same computation; the radii differ by one float64 ulp (3 * 0.01 against 0.03)
SAME_STEP_RTOL = 1e-5


def _env(action: str) -> DummyVecEnv:
    return DummyVecEnv([lambda: _SpacesEnv(VECTOR, KL_SPACES[action])])


def _one_update(algo: type, action: str, **options) -> tuple[torch.Tensor, float]:
    model = algo("MlpPolicy", _env(action), **TINY, **options)
    model.learn(TINY["n_steps"])
    return get_flat_params(model.actor_parameters), model.logger.name_to_value["train/target_kl"]


@pytest.mark.parametrize("algo", [NPG, TRPO])
@pytest.mark.parametrize("action", KL_SPACES)
def test_per_dimension_values_take_the_step_of_the_values_times_the_dimensions(algo, action):
    scale = KL_COMPONENTS[action]
    per_dimension, radius = _one_update(algo, action, kl_per_action_dimension=True, **PER_DIMENSION)
    summed, summed_radius = _one_update(algo, action, **{key: scale * value for key, value in PER_DIMENSION.items()})
    assert torch.allclose(per_dimension, summed, rtol=SAME_STEP_RTOL, atol=0.0)
    assert radius == pytest.approx(summed_radius) == pytest.approx(scale * PER_DIMENSION["target_kl"])


@pytest.mark.parametrize("fisher_solver", ["kfac", "kfac_preconditioned_cg"])
def test_k_fac_takes_the_scaled_damping_too(fisher_solver):
    per_dimension, _ = _one_update(TRPO, "box", fisher_solver=fisher_solver, kl_per_action_dimension=True, **PER_DIMENSION)
    summed, _ = _one_update(
        TRPO, "box", fisher_solver=fisher_solver, **{key: 3 * value for key, value in PER_DIMENSION.items()}
    )
    assert torch.allclose(per_dimension, summed, rtol=SAME_STEP_RTOL, atol=0.0)


def test_the_option_differs_from_the_plain_values_on_a_box():
    """The comparison above can fail: on a 3-dimensional Box the per-dimension reading moves the policy further."""
    per_dimension, _ = _one_update(TRPO, "box", kl_per_action_dimension=True, **PER_DIMENSION)
    plain, _ = _one_update(TRPO, "box", **PER_DIMENSION)
    start = get_flat_params(TRPO("MlpPolicy", _env("box"), **TINY).actor_parameters)
    assert (per_dimension - start).norm() > (plain - start).norm()


def test_a_schedule_is_scaled_and_the_option_is_saved(tmp_path):
    schedule = LinearSchedule(0.02, 0.01, 1.0)
    model = TRPO("MlpPolicy", _env("box"), kl_per_action_dimension=True, target_kl=schedule, **TINY)
    model.learn(2 * TINY["n_steps"])
    expected = 3 * schedule(model._current_progress_remaining)
    assert model.logger.name_to_value["train/target_kl"] == pytest.approx(expected)
    model.save(tmp_path / "model.zip")
    loaded = TRPO.load(tmp_path / "model.zip", env=_env("box"))
    assert loaded.kl_per_action_dimension is True
    assert loaded.damping == pytest.approx(3 * loaded.cg_damping)


def test_the_option_must_be_a_bool():
    with pytest.raises(ValueError, match="kl_per_action_dimension"):
        TRPO("MlpPolicy", _env("box"), kl_per_action_dimension="yes", **TINY)
