"""Every algorithm with every supported action space, observation type and SB3 feature, on tiny budgets."""

import copy
import inspect
import math

import gymnasium as gym
import numpy as np
import pytest
import sb3_contrib
import torch
from gymnasium import spaces
from stable_baselines3.common.callbacks import CheckpointCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

from sb3_npg import NPG, TRPO, __version__
from sb3_npg.common.algorithm import ALWAYS_LOGGED_KEYS, NaturalPolicyGradient
from tests.conftest import ALGOS

TINY = {"n_steps": 64, "batch_size": 32, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}

ACTION_SPACES = {
    "discrete": spaces.Discrete(3),
    "box": spaces.Box(-1.0, 1.0, (3,), dtype=np.float32),
    "multidiscrete": spaces.MultiDiscrete([2, 3]),
    "multibinary": spaces.MultiBinary(4),
}
IMAGE = spaces.Box(0, 255, (36, 36, 1), dtype=np.uint8)
VECTOR = spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)
OBSERVATION_SPACES = {
    "vector": ("MlpPolicy", VECTOR),
    "image": ("CnnPolicy", IMAGE),
    "dict": ("MultiInputPolicy", spaces.Dict({"image": IMAGE, "vector": VECTOR})),
}


class _SpacesEnv(gym.Env):
    """Random observations of any space; the reward depends on the action, so advantages vary."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space, ep_length: int = 16):
        self.observation_space, self.action_space, self.ep_length = observation_space, action_space, ep_length
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.steps = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.steps += 1
        reward = float(np.sum(np.asarray(action, dtype=np.float64))) + float(self.np_random.normal())
        return self.observation_space.sample(), reward, False, self.steps >= self.ep_length, {}


def _changed(before: list[torch.Tensor], params) -> bool:
    return any(not torch.equal(b, p.detach()) for b, p in zip(before, params, strict=True))


@pytest.mark.parametrize("observation", OBSERVATION_SPACES)
@pytest.mark.parametrize("action", ACTION_SPACES)
def test_every_action_and_observation_space_moves_actor_and_critic(algo, action, observation):
    policy, observation_space = OBSERVATION_SPACES[observation]
    env = _SpacesEnv(observation_space, ACTION_SPACES[action])
    kwargs = {**TINY, "policy_kwargs": {"net_arch": [16], "normalize_images": True}}
    if observation == "image":
        kwargs["policy_kwargs"]["features_extractor_kwargs"] = {"features_dim": 16}
    model = algo(policy, env, **kwargs)
    actor = [p.detach().clone() for p in model.actor_parameters]
    critic = [p.detach().clone() for p in model.critic_parameters]
    model.learn(3 * TINY["n_steps"])
    assert model.num_timesteps == 3 * TINY["n_steps"]
    assert model.skipped_steps == 0
    assert _changed(actor, model.actor_parameters), "the natural step never moved the actor"
    assert _changed(critic, model.critic_parameters), "the critic was never fitted"
    assert all(torch.isfinite(p).all() for p in model.policy.parameters())


def test_gsde_on_box_actions(algo):
    model = algo("MlpPolicy", "Pendulum-v1", use_sde=True, sde_sample_freq=4, **TINY)
    log_std = model.policy.log_std.detach().clone()
    model.learn(3 * TINY["n_steps"])
    assert any(p is model.policy.log_std for p in model.actor_parameters)
    assert not torch.equal(log_std, model.policy.log_std.detach())


def test_image_observations_with_cnn_policy_keeps_shared_extractor_out_of_the_critic(algo):
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1)
    model = algo("CnnPolicy", env, n_steps=32, batch_size=16, seed=0, device="cpu", policy_kwargs={"net_arch": [16]})
    extractor = set(map(id, model.policy.features_extractor.parameters()))
    assert extractor <= set(map(id, model.actor_parameters))
    assert not extractor & set(map(id, model.critic_parameters))
    assert {id(p) for p in model.policy.optimizer.param_groups[0]["params"]} == set(map(id, model.critic_parameters))
    model.learn(64)


@pytest.mark.parametrize("vec_env_cls", [DummyVecEnv, SubprocVecEnv])
def test_four_envs_and_vec_normalize(algo, vec_env_cls):
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=4, seed=0, vec_env_cls=vec_env_cls))
    model = algo("MlpPolicy", env, **{**TINY, "n_steps": 32})
    model.learn(256)
    assert model.num_timesteps == 256
    assert model.get_vec_normalize_env() is env
    assert env.obs_rms.count > 256
    env.close()


def test_learning_rate_schedule_reaches_the_critic_optimizer(algo):
    model = algo("MlpPolicy", "CartPole-v1", learning_rate=lambda progress: 1e-3 * progress, **TINY)
    model.learn(2 * TINY["n_steps"])
    # The first update ran at remaining progress 0.5, the second at 0: the schedule's values reach the optimizer.
    assert model.policy.optimizer.param_groups[0]["lr"] == 0.0
    assert model.logger.name_to_value["train/learning_rate"] == 0.0


def test_every_documented_key_is_logged_each_update(algo, tmp_path):
    model = algo("MlpPolicy", "Pendulum-v1", **TINY)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(3 * TINY["n_steps"])
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    expected = {f"train/{key}" for key in ALWAYS_LOGGED_KEYS}
    expected |= {"train/explained_variance", "train/std", "train/learning_rate", "train/n_updates", "train/skipped_steps"}
    if algo is TRPO:
        expected |= {"train/is_line_search_success", "train/line_search_last_kl"}
    assert expected <= set(header)
    rows = (tmp_path / "progress.csv").read_text().splitlines()[1:]
    column = header.index("train/kl_divergence")
    logged = [row.split(",")[column] for row in rows if row.split(",")[column]]
    assert len(logged) == 2 and all(0 < float(kl) < 1 for kl in logged)


def test_tensorboard_progress_bar_and_callbacks(algo, tmp_path):
    eval_callback = EvalCallback(
        make_vec_env("CartPole-v1", n_envs=1), eval_freq=64, n_eval_episodes=2, log_path=str(tmp_path / "eval"), verbose=0
    )
    checkpoint = CheckpointCallback(save_freq=64, save_path=str(tmp_path / "ckpt"), name_prefix="m")
    model = algo("MlpPolicy", "CartPole-v1", tensorboard_log=str(tmp_path / "tb"), **TINY)
    model.learn(128, callback=[eval_callback, checkpoint], tb_log_name="run", progress_bar=True)
    assert (tmp_path / "tb" / "run_1").is_dir()
    assert eval_callback.n_calls == 128
    assert list(np.load(tmp_path / "eval" / "evaluations.npz")["timesteps"]) == [64, 128]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["m_128_steps.zip", "m_64_steps.zip"]
    model.learn(64, reset_num_timesteps=False, tb_log_name="run")
    assert model.num_timesteps == 192


def test_save_load_round_trip_keeps_predictions_parameters_and_critic_optimizer(algo, tmp_path):
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    model = algo("MlpPolicy", env, policy_batch_size=32, max_grad_norm=0.3, **TINY)
    model.learn(2 * TINY["n_steps"])
    observations = np.stack([env.observation_space.sample() for _ in range(10)])
    actions, _ = model.predict(observations, deterministic=True)
    model.save(tmp_path / "model")
    loaded = algo.load(tmp_path / "model", env=env, device="cpu")
    assert isinstance(loaded, algo)
    assert np.array_equal(loaded.predict(observations, deterministic=True)[0], actions)
    for key, value in model.policy.state_dict().items():
        assert torch.equal(value, loaded.policy.state_dict()[key])
    saved_state = model.policy.optimizer.state_dict()["state"]
    loaded_state = loaded.policy.optimizer.state_dict()["state"]
    assert saved_state.keys() == loaded_state.keys() and len(saved_state) > 0
    for index, state in saved_state.items():
        assert torch.equal(state["exp_avg"], loaded_state[index]["exp_avg"])
    assert (loaded.policy_batch_size, loaded.max_grad_norm, loaded.target_kl) == (32, 0.3, 0.01)
    assert [p.shape for p in loaded.actor_parameters] == [p.shape for p in model.actor_parameters]
    loaded.learn(TINY["n_steps"], reset_num_timesteps=False)


def test_a_model_deep_copies_before_and_after_training(algo):
    model = algo("MlpPolicy", "CartPole-v1", **TINY)
    observations = np.zeros((4, 4), np.float32)
    for _ in range(2):
        copied = copy.deepcopy(model)
        assert np.array_equal(
            copied.predict(observations, deterministic=True)[0], model.predict(observations, deterministic=True)[0]
        )
        model.learn(TINY["n_steps"])


def test_set_parameters_copies_one_model_into_another(algo):
    source = algo("MlpPolicy", "CartPole-v1", **TINY).learn(TINY["n_steps"] * 2)
    target = algo("MlpPolicy", "CartPole-v1", **{**TINY, "seed": 1})
    target.set_parameters(source.get_parameters())
    for a, b in zip(source.policy.parameters(), target.policy.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("learning_rate", -1.0),
        ("learning_rate", math.nan),
        ("n_steps", 0),
        ("batch_size", 0),
        ("batch_size", 2.5),
        ("gamma", 1.5),
        ("gae_lambda", -0.1),
        ("cg_max_steps", 0),
        ("cg_damping", -1e-3),
        ("cg_damping", math.inf),
        ("cg_residual_tol", -1.0),
        ("n_critic_updates", -1),
        ("target_kl", 0.0),
        ("target_kl", math.nan),
        ("sub_sampling_factor", 0),
        ("max_grad_norm", math.nan),
        ("max_grad_norm", "big"),
        ("policy_batch_size", 0),
        ("stats_window_size", 0),
        ("normalize_advantage", "yes"),
        ("fisher", "exact"),
        ("fisher_sub_sampling_factor", 0),
        ("critic_fit", "adam"),
        ("fisher_solver", "lbfgs"),
        ("normalize_value_targets", "yes"),
    ],
)
def test_invalid_options_raise_value_error_naming_the_option(algo, option, value):
    with pytest.raises(ValueError, match=f"`{option}`"):
        algo("MlpPolicy", "CartPole-v1", **{**TINY, option: value})


#: Options as NumPy scalars, as a config computed with NumPy gives them.
NUMPY_OPTIONS = {
    "learning_rate": np.float32(1e-3),
    "target_kl": np.float32(0.01),
    "gamma": np.float64(0.98),
    "cg_damping": np.float32(0.1),
    "n_steps": np.int64(64),
    "batch_size": np.int32(32),
    "max_grad_norm": np.float32(0.5),
    "normalize_advantage": np.bool_(True),
}


def test_numpy_scalars_are_taken_wherever_a_number_is(algo, tmp_path):
    model = algo("MlpPolicy", "CartPole-v1", **{**TINY, **NUMPY_OPTIONS})
    for name, value in NUMPY_OPTIONS.items():
        assert type(getattr(model, name)) is type(value.item()) and getattr(model, name) == value.item(), name
    model.learn(2 * TINY["n_steps"])  # np.float32 target_kl once failed here, in SB3's schedule of the first update
    assert model.logger.name_to_value["train/target_kl"] == pytest.approx(0.01)
    model.save(tmp_path / "model.zip")
    loaded = algo.load(tmp_path / "model.zip", env=model.get_env(), target_kl=np.float32(0.02))
    assert type(loaded.target_kl) is float
    loaded.learn(TINY["n_steps"], reset_num_timesteps=False)
    assert loaded.logger.name_to_value["train/target_kl"] == pytest.approx(0.02)


@pytest.mark.parametrize(("option", "value"), [("line_search_shrinking_factor", 1.0), ("line_search_max_iter", 0)])
def test_invalid_line_search_options(option, value):
    with pytest.raises(ValueError, match=f"`{option}`"):
        TRPO("MlpPolicy", "CartPole-v1", **{option: value})
    with pytest.raises(TypeError, match=rf"^NPG\.__init__\(\) got an unexpected keyword argument '{option}'$"):
        NPG("MlpPolicy", "CartPole-v1", **{option: value})


def test_rollout_too_small_to_normalize_and_oversized_batch(algo):
    with pytest.raises(ValueError, match="n_steps \\* n_envs"):
        algo("MlpPolicy", "CartPole-v1", n_steps=1)
    with pytest.warns(UserWarning, match="`batch_size`=512 is larger than the rollout") as caught:
        algo("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=512)
    assert caught[0].filename == __file__  # the user's line, not one inside sb3-npg


def test_configuration_errors_are_also_assertion_errors_as_sb3_contribs_asserts_are(algo):
    """Code written against sb3-contrib catches AssertionError; ours says which option and why."""
    with pytest.raises(AssertionError, match="`target_kl`"):
        algo("MlpPolicy", "CartPole-v1", target_kl=-1.0)
    with pytest.raises(AssertionError, match="n_steps \\* n_envs"):
        algo("MlpPolicy", "CartPole-v1", n_steps=1)
    with pytest.raises(AssertionError, match="does not support the action space"):
        algo("MlpPolicy", DummyVecEnv([_TupleActionEnv]))


class _TupleActionEnv(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
    action_space = spaces.Tuple((spaces.Discrete(2), spaces.Discrete(2)))


def test_unsupported_action_space_raises_a_clear_error(algo):
    with pytest.raises(ValueError, match="does not support the action space Tuple"):
        algo("MlpPolicy", DummyVecEnv([_TupleActionEnv]))


def test_trpo_accepts_every_sb3_contrib_keyword_with_the_same_default():
    ours = inspect.signature(TRPO.__init__).parameters
    for name, parameter in inspect.signature(sb3_contrib.TRPO.__init__).parameters.items():
        assert name in ours, f"missing sb3-contrib keyword {name}"
        assert ours[name].default == parameter.default, name
    positional = [n for n, p in ours.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    contrib = list(inspect.signature(sb3_contrib.TRPO.__init__).parameters)
    assert positional == contrib[: len(positional)], "positional order differs from sb3-contrib"


def test_npg_takes_trpo_keywords_minus_the_line_search():
    npg = set(inspect.signature(NPG.__init__).parameters)
    trpo = set(inspect.signature(TRPO.__init__).parameters)
    assert trpo - npg == {"line_search_shrinking_factor", "line_search_max_iter"}
    assert npg <= trpo


def _param_docs(algo):
    """Each ``:param name:`` entry of the class's own docstring, with its continuation lines, by name."""
    entries: dict[str, list[str]] = {}
    for line in algo.__dict__["__doc__"].splitlines():
        if line.strip().startswith(":param "):
            name = line.split(":param ", 1)[1].split(":", 1)[0]
            entries[name] = [line]
        elif entries and line.startswith(" " * 8):
            entries[name].append(line)
    return entries


def test_package_surface():
    assert __version__.count(".") == 2
    for algo in ALGOS:
        assert issubclass(algo, NaturalPolicyGradient)
        assert set(algo.policy_aliases) == {"MlpPolicy", "CnnPolicy", "MultiInputPolicy"}
        assert "Paper: https://" in (algo.__doc__ or "")


def test_each_algorithm_documents_every_argument_in_its_own_docstring_and_shared_ones_alike():
    npg, trpo = _param_docs(NPG), _param_docs(TRPO)
    for algo, documented in ((NPG, npg), (TRPO, trpo)):
        arguments = [name for name in inspect.signature(algo.__init__).parameters if name != "self"]
        assert list(documented) == arguments, f"{algo.__name__}: documented in another order or incompletely"
    assert set(trpo) - set(npg) == {"line_search_shrinking_factor", "line_search_max_iter"}
    for name, lines in npg.items():
        assert trpo[name] == lines, f"the docs of `{name}` differ between NPG and TRPO"


def test_critic_optimizer_is_fused_unless_the_user_chose_an_implementation(algo):
    model = algo("MlpPolicy", "CartPole-v1", **TINY)
    assert model.policy.optimizer.param_groups[0]["fused"] is True
    chosen = {**TINY, "policy_kwargs": {"net_arch": [16], "optimizer_kwargs": {"foreach": False}}}
    model = algo("MlpPolicy", "CartPole-v1", **chosen)
    group = model.policy.optimizer.param_groups[0]
    assert group["foreach"] is False and not group["fused"]
