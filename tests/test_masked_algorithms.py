"""MaskableNPG, MaskableTRPO and MaskableACKTR in sb3-contrib's MaskablePPO API (issue 46)."""

import inspect

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer
from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback
from sb3_contrib.common.maskable.evaluation import evaluate_policy
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from sb3_contrib.common.maskable.utils import get_action_masks
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure

from sb3_npg import NPG, TRPO
from sb3_npg.common.batches import MaskedInputs
from sb3_npg.common.distributions import frozen_distribution, mean_kl
from sb3_npg.common.natural_gradient import get_flat_params
from sb3_npg.mask import MaskableACKTR, MaskableNPG, MaskableTRPO
from tests.float_comparisons import reduction_tolerance

TINY = {"n_steps": 64, "batch_size": 32, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}
MASKED = [MaskableNPG, MaskableTRPO, MaskableACKTR]
#: sb3-contrib's test environments: half the actions of a Discrete(10), one of each MultiDiscrete/MultiBinary's invalid.
ENVS = {
    "discrete": lambda: InvalidActionEnvDiscrete(dim=10, n_invalid_actions=5),
    "multi_discrete": lambda: InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=2),
    "multi_binary": lambda: InvalidActionEnvMultiBinary(dims=4, n_invalid_actions=2),
}
#: Sub-spaces of each environment's mask: (start, width) of each categorical (a bit is a two-way categorical).
GROUPS = {"discrete": [(0, 10)], "multi_discrete": [(0, 3), (3, 4)], "multi_binary": [(0, 2), (2, 2), (4, 2), (6, 2)]}
FIELDS = ("observations", "actions", "rewards", "episode_starts", "action_masks")


def _valid(name: str, actions: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Per step, whether every sub-action is one its mask allows."""
    actions = actions.reshape(len(masks), -1).astype(int)
    ok = np.ones(len(masks), dtype=bool)
    for column, (start, _size) in enumerate(GROUPS[name]):
        ok &= masks[np.arange(len(masks)), start + actions[:, column]] == 1
    return ok


def _filled(algo, name, **options):
    model = algo("MlpPolicy", make_vec_env(ENVS[name], n_envs=2, seed=0), **{**TINY, **options})
    _, callback = model._setup_learn(TINY["n_steps"])
    model.collect_rollouts(model.env, callback, model.rollout_buffer, TINY["n_steps"])
    return model


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("algo", MASKED, ids=lambda algo: algo.__name__)
def test_the_fast_loop_collects_what_maskable_ppos_loop_collects_and_never_a_masked_action(algo, name):
    fast, reference = _filled(algo, name), _filled(algo, name, rollout_collection="sb3")
    assert fast.sb3_loop_reason() is None and reference.sb3_loop_reason() == "rollout_collection='sb3'"
    for field in FIELDS:
        assert np.array_equal(getattr(fast.rollout_buffer, field), getattr(reference.rollout_buffer, field)), field
    # portable: float32, the same policy's values and log-probabilities in batched passes against per-step ones
    for field in ("values", "log_probs"):
        np.testing.assert_allclose(getattr(fast.rollout_buffer, field), getattr(reference.rollout_buffer, field), 1e-5, 1e-5)
    buffer = fast.rollout_buffer
    masks = buffer.action_masks.reshape(-1, buffer.action_masks.shape[-1])
    assert masks.min() == 0, "the environment must mask something"
    assert _valid(name, buffer.actions, masks).all()


@pytest.mark.parametrize("name", ENVS)
def test_predict_never_returns_a_masked_action(name):
    env = make_vec_env(ENVS[name], n_envs=1, seed=0)
    model = MaskableTRPO("MlpPolicy", env, **TINY)
    observation = env.reset()
    for _ in range(20):
        masks = get_action_masks(env)
        for deterministic in (False, True):
            action, _ = model.predict(observation, deterministic=deterministic, action_masks=masks)
            assert _valid(name, np.asarray(action), masks.reshape(1, -1)).all()
        observation, *_ = env.step(action)


@pytest.mark.parametrize("masked, plain", [(MaskableNPG, NPG), (MaskableTRPO, TRPO)], ids=["NPG", "TRPO"])
def test_without_masks_the_masked_class_takes_the_unmasked_classs_update(masked, plain):
    """``use_masking=False``: every action valid, so the same rollout and the same step as the unmasked class."""
    models = []
    for algo, options in ((masked, {"use_masking": False}), (plain, {})):
        model = algo("MlpPolicy", make_vec_env(ENVS["discrete"], n_envs=2, seed=0), **TINY)
        model.learn(TINY["n_steps"] * 2, **options)
        models.append(model)
    got, want = (get_flat_params(list(model.policy.parameters())) for model in models)
    start = get_flat_params(
        list(plain("MlpPolicy", make_vec_env(ENVS["discrete"], n_envs=2, seed=0), **TINY).policy.parameters())
    )
    step = (want - start).norm()
    assert step > 0 and float((got - want).norm() / step) < 1e-3  # float32 through CG: compared to the step's size
    masked_model = masked("MlpPolicy", make_vec_env(ENVS["discrete"], n_envs=2, seed=0), **TINY)
    masked_model.learn(TINY["n_steps"] * 2)
    moved = get_flat_params(list(masked_model.policy.parameters()))
    assert float((moved - want).norm() / step) > 1e-2, "with masks the update must differ"


@pytest.mark.parametrize("algo", MASKED, ids=lambda algo: algo.__name__)
def test_save_load_evaluation_and_callbacks_work_as_with_maskable_ppo(algo, tmp_path):
    env = make_vec_env(ENVS["discrete"], n_envs=1, seed=0)
    model = algo("MlpPolicy", env, **TINY)
    callback = MaskableEvalCallback(make_vec_env(ENVS["discrete"], n_envs=1, seed=1), eval_freq=64, n_eval_episodes=2)
    model.learn(2 * TINY["n_steps"], callback=callback)
    assert callback.n_calls > 0 and 0.0 <= callback.last_mean_reward <= 100.0  # rewards 0 or 1, 100 steps
    model.save(tmp_path / "model.zip")
    loaded = algo.load(tmp_path / "model.zip", env=env)
    assert isinstance(loaded.policy, MaskableActorCriticPolicy)
    observation = env.reset()
    masks = get_action_masks(env)
    assert np.array_equal(
        model.predict(observation, deterministic=True, action_masks=masks)[0],
        loaded.predict(observation, deterministic=True, action_masks=masks)[0],
    )
    for before, after in zip(model.policy.parameters(), loaded.policy.parameters(), strict=True):
        assert torch.equal(before, after)
    mean, _ = evaluate_policy(loaded, env, n_eval_episodes=2, use_masking=True)
    assert np.isfinite(mean)


def test_an_environment_without_masks_a_box_action_space_and_gsde_are_refused():
    with pytest.raises(ValueError, match="ActionMasker"):
        MaskableTRPO("MlpPolicy", "CartPole-v1", **TINY).learn(64)
    with pytest.raises(ValueError, match="masks Discrete, MultiDiscrete, MultiBinary actions, not Box"):
        MaskableTRPO("MlpPolicy", "Pendulum-v1", **TINY)
    with pytest.raises(ValueError, match="Box action space"):
        MaskableTRPO("MlpPolicy", make_vec_env(ENVS["discrete"], n_envs=1), use_sde=True, **TINY)


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize("algo", [MaskableNPG, MaskableTRPO], ids=lambda algo: algo.__name__)
def test_the_logged_kl_is_the_kl_over_the_valid_actions_under_the_stored_masks(algo, name):
    """The update measures its trust region with the behaviour policy's masks: the unmasked KL differs."""
    model = _filled(algo, name)
    buffer = model.rollout_buffer
    count = buffer.buffer_size * buffer.n_envs
    observations = torch.as_tensor(buffer.observations.reshape(count, -1))
    masks = torch.as_tensor(buffer.action_masks.reshape(count, -1))
    inputs = MaskedInputs(observations, masks)
    before = frozen_distribution(model.policy, inputs)
    unmasked_before = frozen_distribution(model.policy, observations)
    model.set_logger(configure(None, []))
    model.train()
    masked_kl = float(mean_kl(before, frozen_distribution(model.policy, inputs)))
    unmasked_kl = float(mean_kl(unmasked_before, frozen_distribution(model.policy, observations)))
    logged = model.logger.name_to_value["train/kl_divergence"]
    # Two float32 means of the same non-negative KLs of `count` samples, in other orders: each within gamma_n.
    assert logged == pytest.approx(masked_kl, rel=2 * reduction_tolerance(count * masks.shape[1], torch.float32))
    assert abs(unmasked_kl - masked_kl) > 1e-2 * masked_kl


class _DictObservations(gym.ObservationWrapper):
    """sb3-contrib's masked environment with its observation in a Dict (its ``action_masks`` passed through)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = spaces.Dict({"state": env.observation_space})

    def observation(self, observation):
        return {"state": observation}

    def action_masks(self):
        return self.env.action_masks()


@pytest.mark.parametrize("algo", MASKED, ids=lambda algo: algo.__name__)
def test_dict_observations_take_the_dict_buffer_and_the_same_rollout_as_maskable_ppos_loop(algo):
    def make():
        return make_vec_env(lambda: _DictObservations(ENVS["discrete"]()), n_envs=2, seed=0)

    models = []
    for options in ({}, {"rollout_collection": "sb3"}):
        model = algo("MultiInputPolicy", make(), **{**TINY, **options})
        _, callback = model._setup_learn(TINY["n_steps"])
        model.collect_rollouts(model.env, callback, model.rollout_buffer, TINY["n_steps"])
        models.append(model)
    fast, reference = (model.rollout_buffer for model in models)
    assert isinstance(fast, MaskableDictRolloutBuffer) and models[0].sb3_loop_reason() is None
    for field in ("actions", "rewards", "episode_starts", "action_masks"):
        assert np.array_equal(getattr(fast, field), getattr(reference, field)), field
    assert np.array_equal(fast.observations["state"], reference.observations["state"])
    masks = fast.action_masks.reshape(-1, fast.action_masks.shape[-1])
    assert _valid("discrete", fast.actions, masks).all()
    models[0].train()
    assert models[0].logger.name_to_value["train/kl_divergence"] > 0


#: The MaskablePPO keywords each masked class does not take, as docs/guide/masking.md lists them.
PPO_ONLY_KEYWORDS = {
    MaskableNPG: {"clip_range", "clip_range_vf", "n_epochs", "ent_coef", "vf_coef"},
    MaskableTRPO: {"clip_range", "clip_range_vf", "n_epochs", "ent_coef", "vf_coef"},
    MaskableACKTR: {"clip_range", "clip_range_vf", "n_epochs", "target_kl"},
}


@pytest.mark.parametrize("algo", MASKED, ids=lambda algo: algo.__name__)
def test_every_maskable_ppo_keyword_is_taken_but_those_the_guide_lists(algo):
    from pathlib import Path

    from sb3_contrib import MaskablePPO

    ppo = set(inspect.signature(MaskablePPO.__init__).parameters)
    assert ppo - set(inspect.signature(algo.__init__).parameters) == PPO_ONLY_KEYWORDS[algo]
    guide = (Path(__file__).parents[1] / "docs" / "guide" / "masking.md").read_text()
    assert all(f"`{keyword}`" in guide for keyword in PPO_ONLY_KEYWORDS[algo])
