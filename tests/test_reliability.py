"""Reliability: bad environments and numerical faults are caught and counted, runs resume, files load safely."""

import copy
import gc
import io
import json
import os
import warnings
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

import sb3_npg.common.natural_step as natural_step
from sb3_npg import NPG, TRPO
from sb3_npg.common import NonFiniteParametersError
from sb3_npg.common.stats import WeightedMeans
from sb3_npg.common.natural_gradient import get_flat_params
from sb3_npg.common.solvers import FisherSolver, NaturalDirection
from tests.float_comparisons import reduction_tolerance
from sb3_npg.common.persistence import FORMAT_KEY, FORMAT_VERSION, ScaledSchedule, convert_sb3_contrib_trpo

TINY = {"n_steps": 64, "batch_size": 32, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}


def filled(algo, env="Pendulum-v1", **kwargs):
    """A model whose rollout buffer holds one fresh rollout, ready for ``train()``."""
    model = algo("MlpPolicy", env, **{**TINY, **kwargs})
    _, callback = model._setup_learn(model.n_steps * model.n_envs)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    return model


def events(model):
    return {event: model.logger.name_to_value[f"train/events/{event}"] for event in model.counted_events}


def parameters(model):
    return torch.cat([param.detach().flatten() for param in model.policy.parameters()])


# ---------------------------------------------------------------------------------------------- bad environments


class _FaultyEnv(gym.Env):
    """A 1-D reaching task whose observation or reward turns NaN or inf at step ``FAULT_STEP``."""

    FAULT_STEP = 10
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, where="observation", value=float("nan")):
        self.where, self.value, self.steps = where, value, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        observation, reward = np.full(2, 0.5, np.float32), -float(np.square(action).sum())
        if self.steps == self.FAULT_STEP:
            if self.where == "observation":
                observation[0] = self.value
            else:
                reward = self.value
        return observation, reward, False, self.steps % 50 == 0, {}


@pytest.mark.parametrize(("where", "named"), [("observation", "observations"), ("reward", "rewards")])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_observation_or_reward_is_refused_before_any_update(algo, where, named, value):
    model = algo("MlpPolicy", DummyVecEnv([lambda: _FaultyEnv(where, value)]), **TINY)
    before = parameters(model)
    with pytest.raises(ValueError, match=f"Environment 0 returned a NaN or inf {named[:-1]} after a step.*VecCheckNan"):
        model.learn(TINY["n_steps"])
    assert torch.equal(parameters(model), before)


class _DictActionEnv(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Dict({"move": spaces.Discrete(2)})


def test_dict_action_space_is_refused_by_name(algo):
    with pytest.raises(ValueError, match="does not support the action space Dict"):
        algo("MlpPolicy", DummyVecEnv([_DictActionEnv]))


def test_non_finite_parameters_refuse_the_next_update_and_say_how_to_recover(algo):
    model = algo("MlpPolicy", "Pendulum-v1", **TINY).learn(TINY["n_steps"])
    with torch.no_grad():
        next(iter(model.actor_parameters)).view(-1)[0] = float("nan")
    num_timesteps = model.num_timesteps
    with pytest.raises(NonFiniteParametersError, match=r"CheckpointCallback.*set_parameters"):
        model.learn(TINY["n_steps"], reset_num_timesteps=False)
    assert model.num_timesteps == num_timesteps  # no environment step was taken with the broken policy
    with pytest.raises(NonFiniteParametersError, match="update is refused"):
        model.train()


# ----------------------------------------------------------------------------------- numerical faults in an update


def _refused(model):
    """Train once on the crafted rollout: the step is refused, the parameters are unchanged and finite."""
    before = get_flat_params(model.actor_parameters)
    with pytest.warns(RuntimeWarning, match="natural step skipped"):
        model.train()
    after = get_flat_params(model.actor_parameters)
    assert torch.equal(after, before) and bool(torch.isfinite(after).all())


def _continues(model):
    """A fresh rollout trains normally afterwards: the fault left nothing behind."""
    skipped = model.skipped_steps
    model.learn(model.n_steps, reset_num_timesteps=False)
    assert model.skipped_steps == skipped
    assert bool(torch.isfinite(parameters(model)).all())


def test_equal_advantages_normalize_to_zero_and_the_step_is_refused(algo):
    model = filled(algo, normalize_advantage=True)
    model.rollout_buffer.advantages[:] = 3.0  # every action equally good: nothing to learn
    _refused(model)
    assert events(model)["zero_gradient"] == 1
    _continues(model)


def test_zero_gradient_is_refused(algo):
    model = filled(algo, normalize_advantage=False)
    model.rollout_buffer.advantages[:] = 0.0
    _refused(model)
    assert events(model)["zero_gradient"] == 1
    _continues(model)


def test_fisher_product_that_is_not_positive_is_refused(algo, monkeypatch):
    model = filled(algo)
    monkeypatch.setattr(type(model), "_fisher_product", lambda self, *args: lambda vector: -vector)
    _refused(model)
    counted = events(model)
    assert counted["cg_curvature_failure"] == 1 and counted["non_positive_curvature"] == 1
    monkeypatch.undo()
    _continues(model)


class _FixedSolver(FisherSolver):
    """A solver whose direction is the gradient times ``scale`` and whose curvature is ``curvature``."""

    def __init__(self, scale: float, curvature: float):
        self.scale, self.curvature = scale, curvature

    def solve(self, gradient, fisher, observations):
        return NaturalDirection(gradient * self.scale, self.curvature, {})


#: A faulty solve and the one cause its refused step is counted under.
FAULTY_SOLVES = [
    (float("nan"), 1.0, "non_finite_direction"),
    (float("inf"), 1.0, "non_finite_direction"),
    (1.0, float("nan"), "non_positive_curvature"),
    (1.0, 0.0, "non_positive_curvature"),
    (1.0, -1.0, "non_positive_curvature"),
]


@pytest.mark.parametrize(("scale", "curvature", "cause"), FAULTY_SOLVES)
def test_a_refused_step_is_counted_under_its_own_cause(algo, monkeypatch, scale, curvature, cause):
    """A non-finite direction and a non-positive curvature are different faults, each counted under its own name."""
    model = filled(algo)
    monkeypatch.setattr(type(model), "solver", property(lambda self: _FixedSolver(scale, curvature)))
    _refused(model)
    refused = {event: count for event, count in events(model).items() if count}
    assert refused == {cause: 1} and model.skipped_steps == 1


def test_conjugate_gradient_that_does_not_converge_still_steps_and_is_counted(algo):
    model = filled(algo, cg_max_steps=1, cg_residual_tol=0.0)
    before = get_flat_params(model.actor_parameters)
    model.train()
    after = get_flat_params(model.actor_parameters)
    assert not torch.equal(after, before) and bool(torch.isfinite(after).all())
    assert events(model)["cg_max_steps_reached"] == 1 and model.skipped_steps == 0


def test_line_search_that_never_succeeds_keeps_the_parameters_and_is_counted(monkeypatch):
    model = filled(TRPO, line_search_max_iter=3)
    monkeypatch.setattr(natural_step, "mean_kl", lambda old, new: torch.tensor(float("inf")))  # every candidate too far
    before = get_flat_params(model.actor_parameters)
    model.train()
    assert torch.equal(get_flat_params(model.actor_parameters), before)
    assert events(model)["line_search_failed"] == 1
    assert model.logger.name_to_value["train/step_fraction"] == 0.0
    monkeypatch.undo()
    model.learn(model.n_steps, reset_num_timesteps=False)
    assert events(model)["line_search_failed"] == 1  # counted over training, not reset by a good update


def test_interrupted_line_search_leaves_the_last_accepted_parameters(monkeypatch):
    model = filled(TRPO)
    before = get_flat_params(model.actor_parameters)
    calls = []

    def interrupted(self, proposal):
        proposal.apply(0.5)  # a candidate is in place when the interrupt arrives
        calls.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(TRPO, "_accept_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.train()
    assert calls and torch.equal(get_flat_params(model.actor_parameters), before)


# ------------------------------------------------------------------------------------ determinism and resume


def _state_after(algo, updates, **kwargs):
    model = algo("MlpPolicy", "Pendulum-v1", **{**TINY, **kwargs})
    model.learn(updates * TINY["n_steps"])
    return model


def test_same_seed_gives_bit_identical_parameters_after_five_updates(algo):
    first, second = _state_after(algo, 5), _state_after(algo, 5)
    assert first._n_updates == 5 and torch.equal(parameters(first), parameters(second))
    different = _state_after(algo, 5, seed=1)
    assert not torch.equal(parameters(first), parameters(different))


def _save_load(model, tmp_path):
    """Save the model and its VecNormalize statistics, and load both back as a user resuming would."""
    model.save(tmp_path / "model")
    model.get_vec_normalize_env().save(tmp_path / "vec_normalize.pkl")
    env = VecNormalize.load(tmp_path / "vec_normalize.pkl", make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    return type(model).load(tmp_path / "model", env=env, device="cpu")


def test_a_loaded_model_makes_the_same_update_as_the_one_that_saved_it(algo, tmp_path):
    """Everything an update depends on survives save/load: parameters, critic optimizer state (Adam moments),
    learning-rate progress, update and fault counters, VecNormalize statistics."""
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    model = algo("MlpPolicy", env, learning_rate=lambda progress: 1e-3 * progress, **TINY)
    model.learn(3 * TINY["n_steps"] * 2)
    loaded = _save_load(model, tmp_path)
    assert loaded._n_updates == model._n_updates and loaded.event_counts == model.event_counts
    assert loaded._current_progress_remaining == model._current_progress_remaining
    assert np.array_equal(loaded.get_vec_normalize_env().obs_rms.mean, env.obs_rms.mean)
    _, callback = model._setup_learn(model.n_steps * model.n_envs, reset_num_timesteps=False)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    loaded.rollout_buffer = copy.deepcopy(model.rollout_buffer)
    loaded.set_logger(model.logger)
    state = np.random.get_state()  # the critic's minibatch order; SB3 does not save random generator states
    model.train()
    np.random.set_state(state)
    loaded.train()
    assert torch.equal(parameters(loaded), parameters(model))


#: Two forms of one target_kl schedule, 0.04 at the start of training to 0.01 at its end: SB3's class, and a closure
#: (which SB3's save embeds with cloudpickle).
TARGET_KL_SCHEDULES = [LinearSchedule(0.04, 0.01, end_fraction=1.0), lambda remaining: 0.01 + 0.03 * remaining]


@pytest.mark.parametrize("schedule", TARGET_KL_SCHEDULES, ids=["LinearSchedule", "lambda"])
def test_a_target_kl_schedule_survives_save_and_load_and_keeps_training(algo, schedule, tmp_path):
    model = algo("MlpPolicy", "Pendulum-v1", target_kl=schedule, **TINY)
    model.learn(2 * TINY["n_steps"])
    model.save(tmp_path / "model")
    loaded = algo.load(tmp_path / "model", env=make_vec_env("Pendulum-v1", n_envs=1, seed=0), device="cpu")
    progresses = (1.0, 0.6, 0.0)
    assert callable(loaded.target_kl)
    assert [loaded.target_kl_schedule(p) for p in progresses] == pytest.approx([schedule(p) for p in progresses])
    # Two more updates, at remaining progress 0.25 and 0 of the four in all: the last uses the schedule's end.
    loaded.learn(2 * TINY["n_steps"], reset_num_timesteps=False)
    assert loaded.num_timesteps == 4 * TINY["n_steps"]
    assert loaded.logger.name_to_value["train/target_kl"] == pytest.approx(0.01)


def test_an_sb3_contrib_conversion_scales_a_target_kl_schedule_and_the_result_saves(tmp_path):
    from tests.test_integration import VECTOR, _SpacesEnv

    env = DummyVecEnv([lambda: _SpacesEnv(VECTOR, spaces.Box(-1.0, 1.0, (3,), np.float32))])
    model = TRPO("MlpPolicy", env, target_kl=TARGET_KL_SCHEDULES[0], **TINY)
    with pytest.warns(UserWarning, match=r"target_kl LinearSchedule\(.*\) -> ScaledSchedule\(.*scale=3\)"):
        convert_sb3_contrib_trpo(model, "contrib.zip")
    assert isinstance(model.target_kl, ScaledSchedule)
    assert [model.target_kl_schedule(p) for p in (1.0, 0.0)] == pytest.approx([0.12, 0.03])  # 3 action dimensions
    model.save(tmp_path / "converted")
    assert TRPO.load(tmp_path / "converted", env=env).target_kl_schedule(1.0) == pytest.approx(0.12)


# ------------------------------------------------------------------------------------------------- interruption


class _InterruptAt(BaseCallback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def _on_step(self):
        if self.num_timesteps == self.step:
            raise KeyboardInterrupt
        return True


def test_keyboard_interrupt_leaves_a_model_that_saves_loads_and_predicts(algo, tmp_path):
    model = algo("MlpPolicy", "Pendulum-v1", **TINY)
    with pytest.raises(KeyboardInterrupt):
        model.learn(4 * TINY["n_steps"], callback=_InterruptAt(2 * TINY["n_steps"] + 7))
    assert model._n_updates == 2
    model.save(tmp_path / "interrupted")
    loaded = algo.load(tmp_path / "interrupted", device="cpu")
    observation = np.zeros((1, 3), np.float32)
    assert np.array_equal(
        loaded.predict(observation, deterministic=True)[0], model.predict(observation, deterministic=True)[0]
    )
    loaded.set_env(make_vec_env("Pendulum-v1", n_envs=1, seed=0))
    loaded.learn(TINY["n_steps"], reset_num_timesteps=False)
    assert loaded._n_updates == 3


def test_checkpoints_load_and_continue_training(algo, tmp_path):
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=0))
    checkpoint = CheckpointCallback(TINY["n_steps"], str(tmp_path), name_prefix="run", save_vecnormalize=True)
    algo("MlpPolicy", env, **TINY).learn(2 * TINY["n_steps"], callback=checkpoint)
    saved_env = VecNormalize.load(
        str(tmp_path / f"run_vecnormalize_{TINY['n_steps']}_steps.pkl"), make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    )
    resumed = algo.load(tmp_path / f"run_{TINY['n_steps']}_steps", env=saved_env, device="cpu")
    # CheckpointCallback saves on the rollout's last step, before that rollout's update (as for SB3's PPO).
    assert resumed.num_timesteps == TINY["n_steps"] and resumed._n_updates == 0
    resumed.learn(TINY["n_steps"], reset_num_timesteps=False)
    assert resumed.num_timesteps == 2 * TINY["n_steps"] and resumed._n_updates == 1


# ------------------------------------------------------------------------------------------------------ loading


@pytest.fixture
def saved_trpo(tmp_path):
    path = tmp_path / "trpo.zip"
    TRPO("MlpPolicy", "CartPole-v1", **TINY).save(path)
    return path


def _rewrite_data(source, target, change):
    """Copy a model archive with its ``data`` JSON changed by ``change``."""
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as out:
        for member in archive.namelist():
            content = archive.read(member)
            if member == "data":
                data = json.loads(content)
                change(data)
                content = json.dumps(data).encode()
            out.writestr(member, content)


def test_loading_another_algorithms_file_names_the_right_class(saved_trpo):
    with pytest.raises(ValueError, match=r"holds a TRPO model, not an NPG one: load it with TRPO\.load"):
        NPG.load(saved_trpo)
    assert isinstance(TRPO.load(saved_trpo), TRPO)
    with open(saved_trpo, "rb") as file:  # a file object works too, and is rewound for SB3
        assert isinstance(TRPO.load(io.BufferedReader(file)), TRPO)


class _MyTRPO(TRPO):
    """A user's subclass."""


class _MyNPG(NPG):
    """A user's subclass of the other algorithm."""


def test_subclasses_load_files_of_their_bases_and_bases_load_files_of_their_subclasses(saved_trpo, tmp_path):
    assert type(_MyTRPO.load(saved_trpo)) is _MyTRPO
    _MyTRPO("MlpPolicy", "CartPole-v1", **TINY).save(tmp_path / "mine.zip")
    assert type(TRPO.load(tmp_path / "mine.zip")) is TRPO
    assert type(_MyTRPO.load(tmp_path / "mine.zip")) is _MyTRPO
    for loader, path in ((_MyNPG, saved_trpo), (NPG, tmp_path / "mine.zip"), (_MyNPG, tmp_path / "mine.zip")):
        with pytest.raises(ValueError, match=r"model, not an? "):
            loader.load(path)


@pytest.mark.parametrize(("option", "value"), [("target_kl", -1.0), ("cg_max_steps", 0), ("fisher", "exact")])
def test_options_given_to_load_are_validated_as_the_constructor_validates_them(saved_trpo, option, value):
    with pytest.raises(ValueError, match=f"`{option}`"):
        TRPO("MlpPolicy", "CartPole-v1", **{**TINY, option: value})
    with pytest.raises(ValueError, match=f"`{option}`"):
        TRPO.load(saved_trpo, **{option: value})
    assert TRPO.load(saved_trpo, target_kl=0.02).target_kl == 0.02
    # What the RL Zoo's enjoy does to load without unpickling schedules: a replaced entry is the caller's choice.
    assert TRPO.load(saved_trpo, custom_objects={"learning_rate": 0.0, "lr_schedule": lambda _: 0.0}).learning_rate == 0.0


def test_an_sb3_contrib_trpo_file_loads_with_its_policy_a_fresh_critic_optimizer_and_its_trust_region(tmp_path):
    from sb3_contrib import TRPO as ContribTRPO

    from tests.test_integration import VECTOR, _SpacesEnv

    def env():
        return DummyVecEnv([lambda: _SpacesEnv(VECTOR, spaces.Box(-1.0, 1.0, (3,), np.float32))])

    theirs = ContribTRPO("MlpPolicy", env(), **TINY).learn(2 * TINY["n_steps"])
    theirs.save(tmp_path / "contrib.zip")
    with pytest.warns(UserWarning, match=r"saved by sb3-contrib's TRPO and converted.*target_kl 0\.01 -> 0\.03"):
        ours = TRPO.load(tmp_path / "contrib.zip", env=env(), device="cpu")
    for key, value in theirs.policy.state_dict().items():
        assert torch.equal(value, ours.policy.state_dict()[key]), key
    observations = np.random.default_rng(0).uniform(-1, 1, (16, 4)).astype(np.float32)
    assert np.array_equal(
        ours.predict(observations, deterministic=True)[0], theirs.predict(observations, deterministic=True)[0]
    )
    # A fresh optimizer over the critic only; sb3-contrib's averaged KL becomes our summed one over 3 dimensions.
    assert {id(p) for p in ours.policy.optimizer.param_groups[0]["params"]} == set(map(id, ours.critic_parameters))
    assert not ours.policy.optimizer.state_dict()["state"]
    assert (ours.target_kl, ours.cg_damping) == pytest.approx((3 * theirs.target_kl, 3 * theirs.cg_damping))
    assert ours.num_timesteps == theirs.num_timesteps and ours.max_grad_norm == 0.0
    ours.learn(TINY["n_steps"], reset_num_timesteps=False)
    assert ours.num_timesteps == theirs.num_timesteps + TINY["n_steps"] and bool(torch.isfinite(parameters(ours)).all())
    with pytest.raises(ValueError, match="not saved by sb3-npg"):
        NPG.load(tmp_path / "contrib.zip")


#: Action spaces of several kinds, each with more than one component where it can have several.
KL_SPACES = {
    "discrete": spaces.Discrete(3),
    "box": spaces.Box(-1.0, 1.0, (3,), np.float32),
    "multi_discrete": spaces.MultiDiscrete([3, 2, 4]),
    "multi_binary": spaces.MultiBinary(3),
}


@pytest.mark.parametrize("action", KL_SPACES)
def test_the_conversion_factor_is_how_much_larger_our_kl_is_than_sb3_contribs(action):
    """The factor is measured, not assumed: sb3-contrib's KL is the mean of SB3's ``kl_divergence`` (its train())."""
    from stable_baselines3.common.distributions import kl_divergence

    from sb3_npg.common.distributions import frozen_distribution, mean_kl
    from sb3_npg.common.persistence import kl_components
    from tests.test_integration import VECTOR, _SpacesEnv

    model = TRPO("MlpPolicy", DummyVecEnv([lambda: _SpacesEnv(VECTOR, KL_SPACES[action])]), **TINY)
    observations = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (64, 4)), dtype=torch.float32)
    old = frozen_distribution(model.policy, observations)
    with torch.no_grad():
        for parameter in model.actor_parameters:
            parameter.add_(0.3 * torch.randn_like(parameter))
    new = frozen_distribution(model.policy, observations)
    ours, theirs = float(mean_kl(old, new)), float(kl_divergence(old, new).mean())
    assert theirs > 1e-3
    # Two float32 means of the same non-negative per-dimension KLs, summed in other orders: each within gamma_n.
    rtol = 2 * reduction_tolerance(observations.shape[0] * kl_components(model.action_space), torch.float32)
    assert ours == pytest.approx(kl_components(model.action_space) * theirs, rel=rtol)


def test_an_sb3_contrib_multi_discrete_file_keeps_its_trust_region(tmp_path):
    from sb3_contrib import TRPO as ContribTRPO

    from tests.test_integration import VECTOR, _SpacesEnv

    def env():
        return DummyVecEnv([lambda: _SpacesEnv(VECTOR, KL_SPACES["multi_discrete"])])

    ContribTRPO("MlpPolicy", env(), **TINY).save(tmp_path / "contrib.zip")
    with pytest.warns(UserWarning, match=r"its KL equals ours on this action space, so target_kl 0\.01 and cg_damping"):
        ours = TRPO.load(tmp_path / "contrib.zip", env=env(), device="cpu")
    assert (ours.target_kl, ours.cg_damping) == (0.01, 0.1)


def test_loading_a_file_from_a_newer_format_asks_for_an_upgrade(saved_trpo, tmp_path):
    newer = tmp_path / "newer.zip"
    _rewrite_data(saved_trpo, newer, lambda data: data[FORMAT_KEY].update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(ValueError, match=f"file format {FORMAT_VERSION + 1}.*upgrade sb3-npg"):
        TRPO.load(newer)


def test_loading_a_file_not_saved_by_sb3_npg_says_so(tmp_path):
    PPO("MlpPolicy", "CartPole-v1", n_steps=64, device="cpu").save(tmp_path / "ppo.zip")
    with pytest.raises(ValueError, match="not saved by sb3-npg"):
        TRPO.load(tmp_path / "ppo.zip")


@pytest.mark.parametrize("damage", ["truncated", "not_a_zip", "bad_json", "no_policy"])
def test_loading_a_corrupt_file_gives_a_clear_error(saved_trpo, tmp_path, damage):
    broken = tmp_path / "broken.zip"
    content = saved_trpo.read_bytes()
    if damage == "truncated":
        broken.write_bytes(content[: len(content) // 2])
    elif damage == "not_a_zip":
        broken.write_bytes(b"definitely not a model")
    else:
        with zipfile.ZipFile(saved_trpo) as archive, zipfile.ZipFile(broken, "w") as out:
            for member in archive.namelist():
                if damage == "no_policy" and member == "policy.pth":
                    continue
                out.writestr(member, b"{not json" if damage == "bad_json" and member == "data" else archive.read(member))
    with pytest.raises(ValueError, match=r"not a saved model|is corrupt"):
        TRPO.load(broken)


# ---------------------------------------------------------------------------------------------------------- soak

SOAK_UPDATES = 200
WARM_UP_UPDATES = 20
RSS_GROWTH_TOLERANCE = 0.05


def _resident_set_size():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1])


def _live_graph_tensors():
    """Tensors still attached to an autograd graph (a leaked KL or surrogate graph keeps some alive)."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance() on deprecated torch.distributed aliases warns
        warnings.simplefilter("ignore")
        return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor) and obj.grad_fn is not None)


class _Soak(BaseCallback):
    def __init__(self):
        super().__init__()
        self.rss, self.graph_tensors = {}, []

    def _on_rollout_start(self):
        updates = self.model._n_updates
        if updates in (WARM_UP_UPDATES, SOAK_UPDATES - 1):
            self.rss[updates] = _resident_set_size()
        if updates % 50 == 1:
            self.graph_tensors.append(_live_graph_tensors())

    def _on_step(self):
        return True


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set size from /proc")
def test_soak_memory_stays_flat_and_no_graph_survives_an_update(algo):
    model = algo("MlpPolicy", "Pendulum-v1", **{**TINY, "n_steps": 32, "batch_size": 32})
    soak = _Soak()
    model.learn(SOAK_UPDATES * 32, callback=soak)
    assert model._n_updates == SOAK_UPDATES
    growth = soak.rss[SOAK_UPDATES - 1] / soak.rss[WARM_UP_UPDATES] - 1.0
    assert growth < RSS_GROWTH_TOLERANCE, f"resident memory grew {growth:.1%} between updates 20 and 199"
    assert soak.graph_tensors and all(count == 0 for count in soak.graph_tensors)


@pytest.mark.parametrize(("field", "named"), [("observations", "observations"), ("rewards", "rewards")])
def test_train_refuses_a_rollout_holding_nan_even_when_collected_without_the_check(algo, field, named):
    model = filled(algo)  # collected by calling collect_rollouts directly, as a custom loop might
    getattr(model.rollout_buffer, field)[5] = np.nan
    before = parameters(model)
    with pytest.raises(ValueError, match=f"rollout's {named} hold"):
        model.train()
    assert torch.equal(parameters(model), before)


def test_policy_batch_size_that_does_not_divide_warns_once_and_weights_the_last_batch_by_its_samples(monkeypatch):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = NPG("MlpPolicy", "Pendulum-v1", **{**TINY, "n_steps": 100, "policy_batch_size": 30})
        model.learn(2 * 100)
    uneven = [w for w in caught if str(w.message).startswith("`policy_batch_size`=30 does not divide")]
    assert len(uneven) == 1 and "the last batch holds 10 samples" in str(uneven[0].message)
    assert model._n_updates == 2 * 4  # batches of 30, 30, 30 and 10 in each of the two updates
    entropies = []
    record = WeightedMeans.add

    def spy(self, weight, **values):
        if "entropy" in values:
            entropies.append((weight, values["entropy"]))
        record(self, weight, **values)

    monkeypatch.setattr(WeightedMeans, "add", spy)
    model.learn(100, reset_num_timesteps=False)
    assert [weight for weight, _ in entropies] == [30, 30, 30, 10]
    expected = sum(weight * value for weight, value in entropies) / 100
    assert model.logger.name_to_value["train/entropy"] == pytest.approx(expected)


# ------------------------------------------------------------------------------------------- older files


@pytest.mark.parametrize("algo", [NPG, TRPO])
def test_a_file_saved_by_sb3_npg_0_1_0_loads_with_its_parameters_and_event_counts(algo, tmp_path):
    """The file format did not change; only the counters' attribute names did (``fault_counts`` -> ``event_counts``)."""
    path = Path(__file__).parent / "data" / f"{algo.__name__.lower()}_saved_by_0.1.0.zip"
    loaded = algo.load(path, env=make_vec_env("CartPole-v1", n_envs=1, seed=0), device="cpu")
    with zipfile.ZipFile(path) as archive:
        saved = torch.load(io.BytesIO(archive.read("policy.pth")), weights_only=True)
    assert all(torch.equal(value, loaded.policy.state_dict()[key]) for key, value in saved.items())
    expected = {"zero_gradient": 1, "cg_max_steps_reached": 2} | ({"line_search_failed": 3} if algo is TRPO else {})
    assert {event: count for event, count in loaded.event_counts.items() if count} == expected
    assert loaded.skipped_steps == 1 and "fault_counts" not in vars(loaded) and "skipped_steps" not in vars(loaded)
    loaded.learn(64, reset_num_timesteps=False)
    assert loaded.event_counts["cg_max_steps_reached"] == 3  # cg_max_steps=1: every update reaches it
    loaded.save(tmp_path / "again")
    assert algo.load(tmp_path / "again", device="cpu").event_counts == loaded.event_counts
