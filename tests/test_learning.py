"""NPG, TRPO and ACKTR actually learn: CartPole-v1 and Pendulum-v1 within 100k steps (seed 0; NPG and TRPO with the
settings documented in benchmarks/learning.py, the RL Zoo's tuned TRPO settings, alone, with ``FAST_SETTINGS`` and with
K-FAC as the Fisher solver; ACKTR with its shipped Zoo entry). Each run stops as
soon as the evaluation reaches the threshold, so the suite stays fast while the budget is the full 100k steps."""

import pytest

from benchmarks.learning import LEARNING_CONFIGS, run_learning
from sb3_npg import FAST_SETTINGS

SETTINGS = {"zoo": {}, "zoo+FAST_SETTINGS": FAST_SETTINGS, "zoo+kfac": {"fisher_solver": "kfac"}}


@pytest.mark.parametrize("settings", list(SETTINGS))
@pytest.mark.parametrize("env_id", list(LEARNING_CONFIGS))
@pytest.mark.parametrize("algo", ["npg", "trpo"])
def test_reaches_the_threshold_within_the_budget(algo, env_id, settings):
    result = run_learning(algo, env_id, seed=0, settings=SETTINGS[settings])
    config = LEARNING_CONFIGS[env_id]
    assert result.timesteps <= config["budget"]
    assert result.best_mean_return >= config["threshold"], result


@pytest.mark.parametrize("env_id", list(LEARNING_CONFIGS))
def test_acktr_reaches_the_threshold_within_the_budget_with_its_shipped_entry(env_id):
    result = run_learning("acktr", env_id, seed=0)
    assert result.timesteps <= LEARNING_CONFIGS[env_id]["budget"]
    assert result.best_mean_return >= LEARNING_CONFIGS[env_id]["threshold"], result


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("env_id", list(LEARNING_CONFIGS))
@pytest.mark.parametrize("algo", ["npg", "trpo", "acktr"])
def test_other_seeds_reach_the_threshold_too(algo, env_id, seed):
    result = run_learning(algo, env_id, seed=seed)
    assert result.best_mean_return >= LEARNING_CONFIGS[env_id]["threshold"], result
