"""Our rollout loop fills the buffer as SB3's ``OnPolicyAlgorithm.collect_rollouts`` does, for every space and feature."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize
from torch import nn

from sb3_npg import NPG, TRPO
from tests.test_integration import ACTION_SPACES, IMAGE, OBSERVATION_SPACES, _SpacesEnv

#: Filled by the environment and the sampled actions: equal to the bit.
EXACT_FIELDS = ("observations", "actions", "episode_starts")
#: Computed by the policy: batched after the rollout here, per step in SB3's loop, so equal up to float rounding.
ROUNDED_FIELDS = ("rewards", "values", "log_probs", "returns", "advantages")
ROLLOUTS = 3
N_STEPS = 96
GENERATOR_SEED = 123


def _collected(model, collect):
    """Three consecutive rollouts of ``model`` by ``collect``, from reset generators, as copies of the buffer."""
    torch.manual_seed(GENERATOR_SEED)
    np.random.seed(GENERATOR_SEED)
    _, callback = model._setup_learn(10 * ROLLOUTS * model.n_steps * model.n_envs)
    rollouts = []
    for _ in range(ROLLOUTS):
        assert collect(model.env, callback, model.rollout_buffer, model.n_steps)
        buffer = model.rollout_buffer
        fields = EXACT_FIELDS + ROUNDED_FIELDS
        if isinstance(buffer.observations, dict):
            rollouts.append({**{key: value.copy() for key, value in buffer.observations.items()},
                             **{field: getattr(buffer, field).copy() for field in fields[1:]}})  # fmt: skip
        else:
            rollouts.append({field: getattr(buffer, field).copy() for field in fields})
    last = model._last_obs
    last = {key: value.copy() for key, value in last.items()} if isinstance(last, dict) else last.copy()
    episodes = [(info["r"], info["l"]) for info in model.ep_info_buffer] + [list(model.ep_success_buffer)]
    model.collected = (model.num_timesteps, episodes, last)
    return rollouts


def assert_same_rollouts(make_model):
    """Twin models from the same seed: ours collects with its loop, the other with SB3's; the buffers must agree."""
    ours, theirs = make_model(), make_model()
    assert ours.sb3_loop_reason() is None, "the fast loop must be the one tested"
    mine = _collected(ours, ours.collect_rollouts)
    reference = _collected(theirs, lambda *args: OnPolicyAlgorithm.collect_rollouts(theirs, *args))
    for number, (got, want) in enumerate(zip(mine, reference, strict=True)):
        for field, expected in want.items():
            if field in ROUNDED_FIELDS:
                # portable: float32, one forward pass in another batch shape: sums of 64 terms, far below 1e-5 of values near 1
                assert np.allclose(got[field], expected, rtol=1e-5, atol=1e-5), f"rollout {number}: {field}"
            else:
                assert np.array_equal(got[field], expected), f"rollout {number}: {field}"
    # The episode statistics, the step count and where the next rollout starts are SB3's too.
    (steps, episodes, last), (their_steps, their_episodes, their_last) = ours.collected, theirs.collected
    assert steps == their_steps
    keyed, their_keyed = (item if isinstance(item, dict) else {"": item} for item in (last, their_last))
    assert all(np.array_equal(keyed[key], their_keyed[key]) for key in keyed), "next observation"
    assert episodes == their_episodes, "episode returns, lengths and successes"
    return mine


TINY = {"n_steps": N_STEPS, "batch_size": 32, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}


@pytest.mark.parametrize(
    ("env_id", "options"),
    [
        ("CartPole-v1", {}),
        ("Pendulum-v1", {}),
        ("Pendulum-v1", {"use_sde": True, "sde_sample_freq": 4}),
        ("Pendulum-v1", {"use_sde": True, "policy_kwargs": {"net_arch": [16], "squash_output": True}}),
        ("MountainCarContinuous-v0", {}),
    ],
    ids=["discrete", "box", "gsde", "gsde-squashed", "box-clipped"],
)
def test_the_same_rollouts_as_sb3s_loop_on_classic_control(algo, env_id, options):
    rollouts = assert_same_rollouts(lambda: algo("MlpPolicy", make_vec_env(env_id, n_envs=2, seed=0), **{**TINY, **options}))
    if env_id == "Pendulum-v1":  # 200-step episodes: the third rollout holds truncations, bootstrapped by the value
        assert any(rollout["episode_starts"][1:].any() for rollout in rollouts)


@pytest.mark.parametrize("observation", OBSERVATION_SPACES)
@pytest.mark.parametrize("action", ACTION_SPACES)
def test_the_same_rollouts_as_sb3s_loop_for_every_action_and_observation_space(action, observation):
    policy, observation_space = OBSERVATION_SPACES[observation]
    kwargs = {**TINY, "policy_kwargs": {"net_arch": [16], "normalize_images": True}}
    if observation == "image":
        kwargs["policy_kwargs"]["features_extractor_kwargs"] = {"features_dim": 16}

    def model():
        env = DummyVecEnv([lambda: _SpacesEnv(observation_space, ACTION_SPACES[action])] * 2)
        return NPG(policy, env, **kwargs)

    assert_same_rollouts(model)


#: Observations that an MLP policy's actor converts before its first layer, each its own way in the fast sampler.
MLP_OBSERVATIONS = {
    "float64": spaces.Box(-1.0, 1.0, (4,), dtype=np.float64),  # MuJoCo's without VecNormalize: cast to float32
    "matrix": spaces.Box(-1.0, 1.0, (3, 2), dtype=np.float32),  # flattened
    "image": IMAGE,  # scaled to [0, 1]
    "discrete": spaces.Discrete(5),  # one-hot
}


@pytest.mark.parametrize("observation", MLP_OBSERVATIONS)
def test_the_same_rollouts_as_sb3s_loop_for_observations_an_mlp_converts(observation):
    action = ACTION_SPACES["box"]

    def model():
        return NPG("MlpPolicy", DummyVecEnv([lambda: _SpacesEnv(MLP_OBSERVATIONS[observation], action)] * 2), **TINY)

    assert_same_rollouts(model)


def test_the_same_rollouts_as_sb3s_loop_with_a_box_action_of_two_dimensions():
    matrix_action = spaces.Box(-1.0, 1.0, (2, 2), dtype=np.float32)

    def model():
        return NPG("MlpPolicy", DummyVecEnv([lambda: _SpacesEnv(OBSERVATION_SPACES["vector"][1], matrix_action)] * 2), **TINY)

    assert_same_rollouts(model)


def test_the_same_rollouts_as_sb3s_loop_with_vec_normalize():
    def model():
        return TRPO("MlpPolicy", VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0)), **TINY)

    assert_same_rollouts(model)


class _TinyExtractor(BaseFeaturesExtractor):
    """A user's features extractor: reached the same way by both loops."""

    def __init__(self, observation_space: spaces.Box):
        super().__init__(observation_space, features_dim=8)
        self.net = nn.Sequential(nn.Linear(int(np.prod(observation_space.shape)), 8), nn.Tanh())

    def forward(self, observations):
        return self.net(observations)


def test_a_custom_features_extractor_takes_the_fast_loop_and_gives_sb3s_rollouts():
    kwargs = {**TINY, "policy_kwargs": {"net_arch": [16], "features_extractor_class": _TinyExtractor}}
    assert_same_rollouts(lambda: NPG("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0), **kwargs))


class _NoisyForwardPolicy(ActorCriticPolicy):
    """A user's policy whose ``forward`` does what ``get_distribution`` does not: it adds to the values."""

    def forward(self, obs, deterministic=False):
        actions, values, log_prob = super().forward(obs, deterministic)
        return actions, values + 1.0, log_prob


def test_a_policy_that_overrides_a_loop_method_gets_sb3s_loop_and_says_so():
    model = NPG(_NoisyForwardPolicy, make_vec_env("Pendulum-v1", n_envs=1, seed=0), **TINY)
    assert model.sb3_loop_reason() == "the policy overrides forward"
    _, callback = model._setup_learn(N_STEPS)
    with pytest.warns(UserWarning, match="collects rollouts with SB3's loop: the policy overrides forward"):
        model.collect_rollouts(model.env, callback, model.rollout_buffer, N_STEPS)
    # SB3's loop ran: the values are those of the overridden forward (ours would have lacked the +1).
    with torch.no_grad():
        observations = torch.as_tensor(model.rollout_buffer.observations.reshape(N_STEPS, -1))
        plain = model.policy.predict_values(observations).flatten().numpy()
    # portable: one float32 addition of 1.0 to values near 1: an ulp
    assert np.allclose(model.rollout_buffer.values.flatten(), plain + 1.0, atol=1e-5)


def test_rollout_collection_sb3_asks_for_sb3s_loop_without_a_warning(recwarn):
    model = TRPO("MlpPolicy", "CartPole-v1", rollout_collection="sb3", **TINY)
    assert model.sb3_loop_reason() == "rollout_collection='sb3'"
    model.learn(N_STEPS)
    assert not [warning for warning in recwarn if "SB3's loop" in str(warning.message)]


def test_callbacks_see_sb3s_step_locals_but_values_and_log_probs(algo):
    from stable_baselines3.common.callbacks import BaseCallback

    seen = []

    class Record(BaseCallback):
        def _on_step(self):
            seen.append(set(self.locals))
            return True

    algo("MlpPolicy", "CartPole-v1", **TINY).learn(N_STEPS, callback=Record())
    expected = {"new_obs", "rewards", "dones", "infos", "actions", "clipped_actions", "n_steps", "env", "callback"}
    assert seen and expected <= seen[0] and not {"values", "log_probs"} & seen[0]


def test_image_observations_use_the_fast_loop_with_a_cnn():
    env = DummyVecEnv([lambda: _SpacesEnv(IMAGE, spaces.Discrete(3))])
    model = NPG(
        "CnnPolicy", env, **{**TINY, "policy_kwargs": {"net_arch": [16], "features_extractor_kwargs": {"features_dim": 16}}}
    )
    assert model.sb3_loop_reason() is None


def test_a_callback_that_returns_false_stops_the_rollout_at_that_step(algo):
    from stable_baselines3.common.callbacks import BaseCallback

    class StopAt(BaseCallback):
        def _on_step(self):
            return self.num_timesteps < 50

    model = algo("MlpPolicy", "CartPole-v1", **TINY).learn(10 * N_STEPS, callback=StopAt())
    assert model.num_timesteps == 50 and model._n_updates == 0


@pytest.mark.parametrize(
    "n_envs, n_steps, gamma, gae_lambda", [(1, 64, 0.99, 0.95), (4, 333, 0.9, 1.0), (2, 257, 0.999, 0.0), (3, 1, 0.99, 0.95)]
)
def test_returns_and_advantages_are_sb3s_to_the_bit(n_envs, n_steps, gamma, gae_lambda):
    from stable_baselines3.common.buffers import RolloutBuffer

    from sb3_npg.common.rollouts import compute_returns_and_advantage

    rng = np.random.default_rng(n_steps)
    filled = {
        "rewards": 10 * rng.normal(size=(n_steps, n_envs)),
        "values": rng.normal(size=(n_steps, n_envs)),
        "episode_starts": rng.random((n_steps, n_envs)) < 0.1,  # episode ends inside the rollout
    }
    last_values, dones = torch.randn(n_envs, 1), rng.random(n_envs) < 0.5
    buffers = [
        RolloutBuffer(n_steps, spaces.Box(-1, 1, (3,)), spaces.Discrete(2), gamma=gamma, gae_lambda=gae_lambda, n_envs=n_envs)
        for _ in range(2)
    ]
    for buffer in buffers:
        for field, values in filled.items():
            getattr(buffer, field)[:] = values
    buffers[0].compute_returns_and_advantage(last_values, dones)
    compute_returns_and_advantage(buffers[1], last_values, dones)
    assert np.array_equal(buffers[1].advantages, buffers[0].advantages)
    assert np.array_equal(buffers[1].returns, buffers[0].returns)


class _SucceedsWhenLong(gym.Wrapper):
    """CartPole that reports ``is_success`` at the end of each episode: whether it lasted 20 steps."""

    def reset(self, **kwargs):
        self.length = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.length += 1
        if terminated or truncated:
            info["is_success"] = self.length >= 20
        return observation, reward, terminated, truncated, info


def test_the_same_rollouts_and_success_rate_as_sb3s_loop_with_subprocess_environments():
    models = []

    def model():
        env = make_vec_env("CartPole-v1", n_envs=2, seed=0, wrapper_class=_SucceedsWhenLong, vec_env_cls=SubprocVecEnv)
        models.append(TRPO("MlpPolicy", env, **TINY))
        return models[-1]

    assert_same_rollouts(model)
    successes = list(models[0].ep_success_buffer)
    assert True in successes and False in successes  # what was compared holds both outcomes
