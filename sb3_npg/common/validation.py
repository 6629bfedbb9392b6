"""Checks of user-given hyperparameters: each raises a :class:`ConfigurationError` naming the option and its range."""

from __future__ import annotations

import math
import numbers
from typing import Any


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


def check_learning_rate(value: Any) -> None:
    """
    Require a positive finite learning rate, or a schedule (a callable of the remaining progress).

    :param value: the value given
    """
    if not callable(value):
        check_float("learning_rate", value, 0.0, low_inclusive=False)


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
