"""Checks of user-given hyperparameters: each raises a :class:`ConfigurationError` naming the option and its range."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

#: A check of one option: called with the option's name and value, it raises a :class:`ConfigurationError`.
OptionCheck = Callable[[str, Any], None]


class ConfigurationError(ValueError, AssertionError):
    """
    An option (or the environment it meets) that the algorithm cannot run with.

    A ``ValueError`` with a message naming the option, and also an ``AssertionError``: sb3-contrib checks its options
    with ``assert``, so code written against sb3-contrib that catches ``AssertionError`` keeps working.
    """


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value: Any, minimum: int) -> None:
    """
    Require an integer ``>= minimum``.

    :param name: the option's name, quoted in the error
    :param value: the value given
    :param minimum: the smallest allowed value
    """
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ConfigurationError(f"`{name}` must be an integer >= {minimum}, got {value!r}")


def check_optional_int(name: str, value: Any, minimum: int) -> None:
    """
    Require ``None`` or an integer ``>= minimum``.

    :param name: the option's name, quoted in the error
    :param value: the value given
    :param minimum: the smallest allowed value
    """
    if value is not None:
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
            raise ConfigurationError(f"`{name}` must be None or an integer >= {minimum}, got {value!r}")


def check_float(
    name: str,
    value: Any,
    low: float,
    high: float = math.inf,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """
    Require a finite real number in the interval given (``high=inf`` means unbounded above).

    :param name: the option's name, quoted in the error
    :param value: the value given
    :param low: the lower bound
    :param high: the upper bound
    :param low_inclusive: whether ``low`` itself is allowed
    :param high_inclusive: whether ``high`` itself is allowed
    """
    above = _is_real(value) and (value >= low if low_inclusive else value > low)
    below = _is_real(value) and (value <= high if high_inclusive else value < high)
    if not (above and below and math.isfinite(value)):
        interval = f"{'[' if low_inclusive else '('}{low}, {high}{']' if high_inclusive and math.isfinite(high) else ')'}"
        raise ConfigurationError(f"`{name}` must be a finite number in {interval}, got {value!r}")


def check_optional_float(name: str, value: Any) -> None:
    """
    Require ``None`` or a real number that is not NaN (any sign; the caller gives meaning to ``<= 0``).

    :param name: the option's name, quoted in the error
    :param value: the value given
    """
    if value is not None and (not _is_real(value) or math.isnan(value)):
        raise ConfigurationError(f"`{name}` must be None or a number (<= 0 disables it), got {value!r}")


def check_positive_or_schedule(name: str, value: Any) -> None:
    """
    Require a positive finite number, or a schedule (a callable of the remaining progress, whose values
    :func:`scheduled_value` checks when they are used).

    :param name: the option's name, quoted in the error
    :param value: the value given
    """
    if not callable(value):
        check_float(name, value, 0.0, low_inclusive=False)


#: Where training ends, and where a schedule's remaining progress is taken at (SB3 runs 1 -> 0).
END_OF_TRAINING = 0.0
#: A schedule's value this far below 0, relative to its value at the start of training, is float rounding of 0: the
#: relative epsilon of float32 (the widest float a schedule is likely computed in), with a margin of a few roundings.
SCHEDULE_ROUNDING = 8 * float(np.finfo(np.float32).eps)


def scheduled_value(name: str, schedule: Callable[[float], float], progress_remaining: float) -> float:
    """
    The value of an option's schedule at the remaining progress, required >= 0 and finite.

    The remaining progress is taken at no less than 0: ``learn()`` collects whole rollouts, so its last update can
    come after ``total_timesteps``, where SB3's remaining progress is below 0 and a schedule is not defined. A
    schedule may reach 0 (SB3's ``LinearSchedule(start, 0.0, 1.0)``, ``lambda p: c * p``): a value of 0 means no
    step; a value below 0 by no more than float rounding (:data:`SCHEDULE_ROUNDING` of the start value) is taken
    as 0.

    :param name: the option's name, quoted in the error
    :param schedule: the option's schedule (SB3's ``FloatSchedule`` of the value given)
    :param progress_remaining: the remaining progress, from 1 at the start of training to 0 at its end
    :return: the schedule's value, >= 0
    """
    progress = max(progress_remaining, END_OF_TRAINING)
    value = schedule(progress)
    if _is_real(value) and math.isfinite(value) and value < 0 and _is_rounding_of_zero(value, schedule):
        return 0.0
    if not (_is_real(value) and math.isfinite(value) and value >= 0):
        raise ConfigurationError(
            f"`{name}` must be a finite number >= 0 at every remaining progress, but its schedule gives {value!r} "
            f"at progress_remaining={progress:g}"
        )
    return float(value)


def _is_rounding_of_zero(value: float, schedule: Callable[[float], float]) -> bool:
    """Whether a negative ``value`` of ``schedule`` is within float rounding of 0, against the start value."""
    start = schedule(1.0)
    return _is_real(start) and math.isfinite(start) and -value <= SCHEDULE_ROUNDING * abs(start)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """
    Require one of a few strings.

    :param name: the option's name, quoted in the error
    :param value: the value given
    :param choices: the allowed values
    """
    if not isinstance(value, str) or value not in choices:
        raise ConfigurationError(f"`{name}` must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_bool(name: str, value: Any) -> None:
    """
    Require a bool.

    :param name: the option's name, quoted in the error
    :param value: the value given
    """
    if not isinstance(value, bool):
        raise ConfigurationError(f"`{name}` must be a bool, got {value!r}")


def check_integer(name: str, value: Any) -> None:
    """
    Require an integer (of any sign).

    :param name: the option's name, quoted in the error
    :param value: the value given
    """
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ConfigurationError(f"`{name}` must be an integer, got {value!r}")


#: Checks shared by many options.
POSITIVE_INT: OptionCheck = partial(check_int, minimum=1)
NON_NEGATIVE_INT: OptionCheck = partial(check_int, minimum=0)
NON_NEGATIVE: OptionCheck = partial(check_float, low=0.0)
POSITIVE: OptionCheck = partial(check_float, low=0.0, low_inclusive=False)
UNIT_INTERVAL: OptionCheck = partial(check_float, low=0.0, high=1.0)
OPEN_UNIT_INTERVAL: OptionCheck = partial(check_float, low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)
OPTIONAL_POSITIVE_INT: OptionCheck = partial(check_optional_int, minimum=1)


def check_options(owner: object, checks: dict[str, OptionCheck], exempt: frozenset[str] = frozenset()) -> None:
    """
    Run ``checks`` on the options of ``owner`` in order; the first one outside its range raises. A NumPy scalar
    (``np.float32(0.01)``, ``np.int64(2048)``, ``np.bool_(True)``) is replaced by the Python number it holds first, so
    it is taken wherever a Python number is.

    :param owner: the object holding the options as attributes (``_name`` when ``name`` is not one)
    :param checks: option name -> its check
    :param exempt: options not to check (replaced on purpose, such as ``load``'s ``custom_objects``)
    """
    for name, check in checks.items():
        if name not in exempt:
            attribute = name if hasattr(owner, name) else f"_{name}"
            value = getattr(owner, attribute)
            if isinstance(value, np.generic):  # np.float32(0.01) and the like: SB3's schedules take Python numbers only
                value = value.item()
                setattr(owner, attribute, value)
            check(name, value)
