"""Registration of ``npg``, ``npg_trpo`` and ``acktr`` in the RL Zoo, and where their hyperparameter files live."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.utils import LinearSchedule

from sb3_npg.acktr import ACKTR
from sb3_npg.common.validation import POSITIVE
from sb3_npg.npg import NPG
from sb3_npg.trpo import TRPO
from sb3_npg.zoo.samplers import SAMPLERS

#: Our algorithms under their Zoo names; ``npg_trpo`` never shadows sb3-contrib's ``trpo``, and rl_zoo3 has no ``acktr``.
ZOO_ALGOS: dict[str, type[BaseAlgorithm]] = {"npg": NPG, "npg_trpo": TRPO, "acktr": ACKTR}
#: The KL radii a Zoo file may give as ``lin_`` schedule strings (:func:`zoo_target_kl`): NPG's and TRPO's, ACKTR's.
KL_RADIUS_KEYS = ("target_kl", "kfac_clip")
HYPERPARAMS_DIR = Path(__file__).parent / "hyperparams"
#: sb3-contrib's TRPO settings from the RL Zoo, translated to our KL: the "same settings" file of both names.
SB3_CONTRIB_SETTINGS_FILE = "sb3_contrib_trpo.yml"
#: Where ``target_kl: lin_<start>`` ends, as a fraction of its start. The Zoo's own ``lin_<value>`` (of
#: ``learning_rate``) falls to 0 and below at the last update, where a KL radius must stay > 0.
LINEAR_TARGET_KL_END = 0.1
#: Set on the Zoo's hyperparameter preprocessing once :func:`register` has wrapped it.
CONVERTS_TARGET_KL = "_sb3_npg_converts_target_kl"


def hyperparams_path(algo: str, sb3_contrib_settings: bool = False) -> Path:
    """
    The shipped hyperparameter file of one of our Zoo names.

    :param algo: ``npg``, ``npg_trpo`` or ``acktr``
    :param sb3_contrib_settings: the file of sb3-contrib's TRPO settings from the RL Zoo instead, translated to our
        KL and nothing else (one file for both names), for comparisons with ``sb3_contrib.TRPO`` on the same settings
    :return: the path of ``sb3_npg/zoo/hyperparams/{algo}.yml`` (or of ``sb3_contrib_trpo.yml``)
    :raises ValueError: for a name that is not ours
    """
    if algo not in ZOO_ALGOS:
        raise ValueError(f"{algo!r} is not an sb3-npg algorithm: expected one of {sorted(ZOO_ALGOS)}")
    return HYPERPARAMS_DIR / (SB3_CONTRIB_SETTINGS_FILE if sb3_contrib_settings else f"{algo}.yml")


def zoo_target_kl(value: Any) -> Any:
    """
    ``target_kl`` from a Zoo hyperparameter file as our constructor takes it: ``lin_<start>`` is SB3's
    ``LinearSchedule`` from ``start`` at the first update to ``start * LINEAR_TARGET_KL_END`` at the last one,
    ``lin_<start>_<end>`` the one from ``start`` to ``end``; any other value is passed on unchanged.

    :param value: the file's value (after the Zoo's ``-params`` overrides)
    :return: a schedule for a ``lin_`` string, else ``value``
    :raises ValueError: for another string, or a ``lin_`` one whose ends are not finite numbers > 0
    """
    if not isinstance(value, str):
        return value
    kind, *ends = value.split("_")
    try:
        if kind != "lin" or len(ends) not in (1, 2):
            raise ValueError("not lin_<start> or lin_<start>_<end>")
        start = float(ends[0])
        end = float(ends[1]) if len(ends) == 2 else start * LINEAR_TARGET_KL_END
        for radius in (start, end):
            POSITIVE("target_kl", radius)
    except ValueError as error:
        raise ValueError(f"Invalid value for target_kl: {value!r} (a number, lin_<start> or lin_<start>_<end>)") from error
    return LinearSchedule(start, end, end_fraction=1.0)


def _converting_target_kl(preprocess: Callable[..., Any]) -> Callable[..., Any]:
    """The Zoo's hyperparameter preprocessing, with :func:`zoo_target_kl` applied first for our algorithms."""

    def preprocess_hyperparams(manager: Any, hyperparams: dict[str, Any]) -> Any:
        if manager.algo in ZOO_ALGOS:
            radii = {key: zoo_target_kl(hyperparams[key]) for key in KL_RADIUS_KEYS if key in hyperparams}
            hyperparams = {**hyperparams, **radii}
        return preprocess(manager, hyperparams)

    setattr(preprocess_hyperparams, CONVERTS_TARGET_KL, True)
    return preprocess_hyperparams


def register() -> None:
    """
    Add ``npg``, ``npg_trpo`` and ``acktr`` to ``rl_zoo3``'s algorithms, Optuna samplers and converters, and let
    their hyperparameters give ``target_kl`` (``kfac_clip`` for ACKTR) as a schedule string (:func:`zoo_target_kl`;
    the Zoo converts the schedule strings of a few other keys only).

    Idempotent: a second call finds the same entries and changes nothing. Entries and hyperparameters of other
    algorithms (sb3-contrib's ``trpo`` among them) are never touched.

    :raises ImportError: when ``rl_zoo3`` is not installed (``pip install sb3-npg[zoo]``)
    """
    try:
        from rl_zoo3 import hyperparams_opt, utils
        from rl_zoo3.exp_manager import ExperimentManager
    except ImportError as error:  # pragma: no cover - depends on the installed extras
        raise ImportError("The RL Zoo integration needs rl_zoo3: pip install 'sb3-npg[zoo]'") from error
    from rl_zoo3.hyperparams_opt import convert_onpolicy_params

    for name, algo in ZOO_ALGOS.items():
        utils.ALGOS[name] = algo
        hyperparams_opt.HYPERPARAMS_SAMPLER[name] = SAMPLERS[name]  # type: ignore[assignment]
        hyperparams_opt.HYPERPARAMS_CONVERTER[name] = convert_onpolicy_params
    preprocess = ExperimentManager._preprocess_hyperparams
    if not getattr(preprocess, CONVERTS_TARGET_KL, False):
        ExperimentManager._preprocess_hyperparams = _converting_target_kl(preprocess)  # type: ignore[method-assign]
