"""Property-based checks of the constructor: every invalid option is refused by name, every valid set trains.

Each example draws valid values for a random subset of the options. The invalid-draw test, run once per option,
then sets that option to an invalid value (out of range, zero where it makes no sense, NaN, inf, wrong type). The
valid and invalid ranges below are written from the documented meaning of each option, independently of
``sb3_npg.common.validation``. Run with ``--hypothesis-show-statistics`` to see the draws of each kind (``event``).
"""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from stable_baselines3.common.utils import LinearSchedule

from sb3_npg import NPG, TRPO

ENVS = {"discrete": "CartPole-v1", "box": "Pendulum-v1"}
FIXED = {"policy_kwargs": {"net_arch": [8]}, "device": "cpu", "seed": 0}
#: Hypothesis draws the same examples on every run and machine (no random seed, no example database): a failure
#: seen once is seen again.
REPRODUCIBLE = {"derandomize": True, "database": None}
#: Invalid draws (per option) fail at construction, in milliseconds; valid ones train for one update.
N_INVALID_EXAMPLES = 15
N_VALID_EXAMPLES = 40

_wrong_type = st.sampled_from(["0.1", [1], {"a": 1}, b"x"]) | st.none()
_not_a_number = st.sampled_from([math.nan, math.inf, -math.inf])


def _int_option(low: int, high: int, minimum: int, *, optional: bool = False):
    """(valid, invalid) strategies for an integer option whose smallest sensible value is ``minimum``."""
    valid = st.integers(low, high)
    invalid = (
        st.integers(max_value=minimum - 1)
        | st.floats()  # any float, 8.0 included: the options are documented as integers
        | st.booleans()
        | st.sampled_from(["8", [8]])
    )
    if optional:
        return st.none() | valid, invalid
    return valid, invalid | st.none()


def _float_option(
    low: float, high: float, *, exclude_low: bool = False, exclude_high: bool = False, sample_high: float | None = None
):
    """(valid, invalid) strategies for a finite float option in [low, high] (ends excluded as asked); valid values
    are drawn up to ``sample_high`` when the option is unbounded above (``high=inf``)."""
    valid = st.floats(low, high if sample_high is None else sample_high, exclude_min=exclude_low, exclude_max=exclude_high)
    below = st.floats(max_value=low, exclude_max=not exclude_low, allow_nan=False, allow_infinity=False)
    above = (
        st.floats(min_value=high, exclude_min=not exclude_high, allow_nan=False, allow_infinity=False)
        if math.isfinite(high)
        else st.nothing()
    )
    return valid, below | above | _not_a_number | _wrong_type | st.booleans()


def _choice_option(choices):
    return st.sampled_from(choices), st.text(max_size=8).filter(lambda text: text not in choices) | st.integers()


def _bool_option():
    return st.booleans(), st.integers(0, 1) | st.floats(0, 1) | st.sampled_from(["True", "no"])


_target_kl_numbers, _target_kl_invalid = _float_option(0.0, math.inf, exclude_low=True, sample_high=1.0)
#: ``target_kl`` may be a schedule of the remaining progress, >= 0 at every progress (0 at the last update: no step).
_target_kl_schedules = st.sampled_from(
    [
        LinearSchedule(0.05, 0.005, end_fraction=1.0),
        lambda progress: 0.01 * (1 + progress),
        LinearSchedule(0.05, 0.0, end_fraction=1.0),
    ]
)

OPTIONS = {
    "learning_rate": (
        st.floats(1e-6, 1.0) | st.just(lambda progress: 1e-3 * progress),
        st.floats(max_value=0.0, allow_nan=False) | _not_a_number | _wrong_type,
    ),
    "n_steps": _int_option(2, 48, 1),
    "batch_size": _int_option(1, 128, 1),
    "gamma": _float_option(0.0, 1.0),
    "gae_lambda": _float_option(0.0, 1.0),
    "cg_max_steps": _int_option(1, 25, 1),
    "cg_damping": _float_option(0.0, math.inf, sample_high=10.0),
    "n_critic_updates": _int_option(0, 3, 0),
    "normalize_advantage": _bool_option(),
    "target_kl": (_target_kl_numbers | _target_kl_schedules, _target_kl_invalid),
    "sub_sampling_factor": _int_option(1, 6, 1),
    "stats_window_size": _int_option(1, 500, 1),
    "max_grad_norm": (
        st.none() | st.floats(allow_nan=False),  # <= 0 and inf are meaningful: no clipping
        st.just(math.nan) | st.sampled_from(["0.5", [0.5]]),
    ),
    "cg_residual_tol": _float_option(0.0, math.inf, sample_high=1.0),
    "policy_batch_size": _int_option(1, 64, 1, optional=True),
    "fisher": _choice_option(("analytic", "autograd")),
    "fisher_solver": _choice_option(("cg", "kfac", "kfac_preconditioned_cg")),
    "fisher_sub_sampling_factor": _int_option(1, 6, 1),
    "critic_fit": _choice_option(("minibatch", "lbfgs")),
    "normalize_value_targets": _bool_option(),
    "use_sde": _bool_option(),
    "sde_sample_freq": (st.integers(-1, 16), st.floats(allow_nan=True) | _wrong_type),
}
LINE_SEARCH_OPTIONS = {
    "line_search_shrinking_factor": _float_option(0.0, 1.0, exclude_low=True, exclude_high=True),
    "line_search_max_iter": _int_option(1, 12, 1),
}


@st.composite
def configurations(draw, algo, invalid=None):
    """(env kind, kwargs, name of the invalid option or None): valid values for a random subset of the options, and
    the option ``invalid`` (if any) set to an invalid value."""
    options = {**OPTIONS, **(LINE_SEARCH_OPTIONS if algo is TRPO else {})}
    names = sorted(options)
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    kwargs = {name: draw(options[name][0]) for name in chosen}
    env_kind = draw(st.sampled_from(sorted(ENVS)))
    if env_kind == "discrete":
        kwargs.pop("use_sde", None)  # gSDE on Discrete actions is drawn as invalid below
    if kwargs.get("fisher_solver", "cg") != "cg" and kwargs.get("cg_damping", 1.0) == 0.0:
        kwargs["cg_damping"] = draw(st.floats(1e-6, 10.0))  # K-FAC's inverse needs damping
    batch = _policy_batch(kwargs)
    if kwargs.get("fisher_sub_sampling_factor", 1) > max(1, batch - 1):  # the Fisher needs 2 samples of each batch
        kwargs["fisher_sub_sampling_factor"] = draw(st.integers(1, max(1, batch - 1)))
    if invalid is not None:
        if invalid == "use_sde" and env_kind == "discrete" and draw(st.booleans()):
            kwargs[invalid] = True  # a valid type, but gSDE needs a Box action space
        elif invalid == "fisher_sub_sampling_factor" and batch > 1 and draw(st.booleans()):
            kwargs[invalid] = draw(st.integers(batch, 2 * batch))  # valid alone, but leaves one sample of each batch
        else:
            kwargs[invalid] = draw(options[invalid][1])
    return env_kind, kwargs, invalid


def _policy_batch(kwargs) -> int:
    """The samples of a full policy batch of a configuration (one environment)."""
    samples = math.ceil(kwargs.get("n_steps", 2048) / kwargs.get("sub_sampling_factor", 1))
    return min(kwargs.get("policy_batch_size") or samples, samples)


def _check(algo, config):
    env_kind, kwargs, invalid = config
    env_id = ENVS[env_kind]
    if invalid is not None:
        event(f"{algo.__name__}: invalid {invalid}")
        with pytest.raises((ValueError, TypeError), match=rf"`{invalid}[`=]"):  # the option itself, quoted
            algo("MlpPolicy", env_id, **FIXED, **kwargs)
        return
    event(f"{algo.__name__}: valid")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = algo("MlpPolicy", env_id, **FIXED, **kwargs)
        construction_warnings = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        model.learn(model.n_steps * model.n_envs)
    for warned in construction_warnings:
        event(f"{algo.__name__}: valid, warned ({warned.split('`')[1]})")
    assert model._n_updates >= 1
    assert "train/kl_divergence" in model.logger.name_to_value
    assert all(bool(torch.isfinite(param).all()) for param in model.policy.parameters())
    assert np.isfinite(model.logger.name_to_value["train/skipped_steps"])


@pytest.mark.parametrize(
    ("algo", "option"),
    [(NPG, name) for name in sorted(OPTIONS)] + [(TRPO, name) for name in sorted({**OPTIONS, **LINE_SEARCH_OPTIONS})],
    ids=lambda value: getattr(value, "__name__", value),
)
@settings(max_examples=N_INVALID_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], **REPRODUCIBLE)
@given(data=st.data())
def test_every_invalid_draw_is_refused_at_construction_naming_the_option(algo, option, data):
    _check(algo, data.draw(configurations(algo, invalid=option)))


@pytest.mark.parametrize("algo", [NPG, TRPO], ids=lambda algo: algo.__name__)
@settings(max_examples=N_VALID_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], **REPRODUCIBLE)
@given(data=st.data())
def test_every_valid_draw_constructs_and_completes_an_update(algo, data):
    _check(algo, data.draw(configurations(algo)))
