"""NPG and TRPO extend as SB3's algorithms do: what a user writes on their first day with a subclass works.

The patterns, each for both algorithms: a subclass with no constructor of its own; one that adds an option and forwards
every other argument (``def __init__(self, *args, new_option=..., **kwargs)``); one that checks its option as ours are
checked; one that changes the objective (``policy_objective``, as ``docs/design.md`` invites). Each is built with
keywords and positionally, learns, saves, loads with its own class (SB3's ``load`` calls
``cls(policy=..., env=..., device=..., _init_setup_model=False)``) and keeps learning. And the classes show their real
signatures to ``inspect`` (``help()``, IDEs, the API page), every parameter with its default.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from sb3_npg import NPG, TRPO
from sb3_npg.common.algorithm import NaturalPolicyGradient
from sb3_npg.common.validation import NON_NEGATIVE

TINY = {"n_steps": 64, "batch_size": 32, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}
#: Keywords only TRPO takes.
LINE_SEARCH_OPTIONS = {"line_search_shrinking_factor", "line_search_max_iter"}
ALGOS = [NPG, TRPO]


def _entropy_bonus(base: type[NaturalPolicyGradient]) -> type[NaturalPolicyGradient]:
    """The usual way to add an option: a keyword of its own, everything else forwarded; checked as ours are; used in
    the objective."""

    class EntropyBonus(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args, entropy_coef: float = 0.0, **kwargs):
            self.entropy_coef = entropy_coef  # before the shared constructor, which validates every option
            super().__init__(*args, **kwargs)

        def _option_checks(self):
            return {**super()._option_checks(), "entropy_coef": NON_NEGATIVE}

        def policy_objective(self, batch, distribution, behaviour):
            objective = super().policy_objective(batch, distribution, behaviour)
            bonus = self.entropy_coef * distribution.entropy().mean()
            return objective._replace(surrogate=objective.surrogate + bonus)

    EntropyBonus.__name__ = EntropyBonus.__qualname__ = f"EntropyBonus{base.__name__}"
    return EntropyBonus


ENTROPY_NPG, ENTROPY_TRPO = _entropy_bonus(NPG), _entropy_bonus(TRPO)


class PlainNPG(NPG):
    """A subclass with no constructor of its own."""


class PlainTRPO(TRPO):
    """A subclass with no constructor of its own."""


def _parameters(model) -> torch.Tensor:
    return torch.cat([parameter.detach().flatten() for parameter in model.policy.parameters()])


@pytest.mark.parametrize("algo", ALGOS)
def test_a_subclass_forwarding_keywords_takes_every_option_of_its_base(algo):
    subclass = _entropy_bonus(algo)
    options = {**TINY, "target_kl": 0.02, "cg_damping": 0.05, "max_grad_norm": None, "critic_fit": "lbfgs"}
    if algo is TRPO:
        options["line_search_max_iter"] = 4
    model = subclass("MlpPolicy", "CartPole-v1", entropy_coef=0.01, **options)
    assert model.entropy_coef == 0.01
    for name, value in options.items():
        if name not in ("seed", "device", "policy_kwargs"):
            assert getattr(model, name) == value, name
    positional = subclass("MlpPolicy", "CartPole-v1", 1e-3, 64, 32, seed=0, device="cpu")  # as the base's positions
    assert (positional.n_steps, positional.batch_size, positional.entropy_coef) == (64, 32, 0.0)


@pytest.mark.parametrize("algo", ALGOS)
def test_a_wrong_keyword_still_raises_in_a_subclass(algo):
    with pytest.raises(TypeError, match="unexpected keyword argument 'not_an_option'"):
        _entropy_bonus(algo)("MlpPolicy", "CartPole-v1", not_an_option=1, **TINY)


@pytest.mark.parametrize("algo", ALGOS)
def test_a_subclass_option_is_validated_like_ours(algo):
    with pytest.raises(ValueError, match="`entropy_coef`"):
        _entropy_bonus(algo)("MlpPolicy", "CartPole-v1", entropy_coef=-1.0, **TINY)


@pytest.mark.parametrize("algo", ALGOS)
def test_a_subclass_option_changes_the_objective_through_policy_objective(algo):
    subclass = _entropy_bonus(algo)
    plain = subclass("MlpPolicy", "CartPole-v1", **TINY).learn(TINY["n_steps"])
    bonus = subclass("MlpPolicy", "CartPole-v1", entropy_coef=10.0, **TINY).learn(TINY["n_steps"])
    # Same seed, same rollout: only the objective differs, so the surrogate (with the bonus) and the step do.
    logged = {model: model.logger.name_to_value["train/policy_objective"] for model in (plain, bonus)}
    assert logged[bonus] > logged[plain] + 1.0  # 10 * the entropy of a 2-action policy near uniform (~0.69)
    assert not torch.equal(_parameters(plain), _parameters(bonus))


@pytest.mark.parametrize("subclass", [ENTROPY_NPG, ENTROPY_TRPO, PlainNPG, PlainTRPO], ids=lambda cls: cls.__name__)
def test_a_subclass_saves_loads_with_its_own_class_and_keeps_learning(subclass, tmp_path):
    options = {"entropy_coef": 0.05} if "entropy_coef" in inspect.signature(subclass).parameters else {}
    model = subclass("MlpPolicy", "CartPole-v1", target_kl=0.02, **options, **TINY).learn(2 * TINY["n_steps"])
    model.save(tmp_path / "mine.zip")
    loaded = subclass.load(tmp_path / "mine.zip", device="cpu")
    assert type(loaded) is subclass
    assert torch.equal(_parameters(loaded), _parameters(model))
    assert loaded.target_kl == 0.02 and getattr(loaded, "entropy_coef", None) == options.get("entropy_coef")
    observations = np.random.default_rng(0).uniform(-0.05, 0.05, (8, 4)).astype(np.float32)
    assert np.array_equal(
        loaded.predict(observations, deterministic=True)[0], model.predict(observations, deterministic=True)[0]
    )
    loaded.set_env(model.get_env())
    loaded.learn(TINY["n_steps"], reset_num_timesteps=False)
    assert loaded.num_timesteps == 3 * TINY["n_steps"] and not torch.equal(_parameters(loaded), _parameters(model))
    assert type(subclass.__mro__[1].load(tmp_path / "mine.zip")) is subclass.__mro__[1]  # its base loads it too


@pytest.mark.parametrize("algo", ALGOS)
def test_the_signature_lists_every_parameter_with_its_default(algo):
    shown = inspect.signature(algo).parameters
    shared = inspect.signature(NaturalPolicyGradient.__init__).parameters
    own = LINE_SEARCH_OPTIONS if algo is TRPO else set()
    assert set(shown) == (set(shared) - {"self"}) | own
    for name, parameter in shown.items():
        if name in shared:
            assert parameter.default == shared[name].default and parameter.kind == shared[name].kind, name
        assert name in ("policy", "env") or parameter.default is not inspect.Parameter.empty, name
    assert list(shown)[:2] == ["policy", "env"]


@pytest.mark.parametrize("subclass", [PlainNPG, PlainTRPO], ids=lambda cls: cls.__name__)
def test_a_subclass_without_a_constructor_shows_its_base_signature(subclass):
    assert inspect.signature(subclass) == inspect.signature(subclass.__mro__[1])
