"""Registration of ``npg`` and ``npg_trpo`` in the RL Zoo's dicts, and where their hyperparameter files live."""

from __future__ import annotations

from pathlib import Path

from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_npg.npg import NPG
from sb3_npg.trpo import TRPO
from sb3_npg.zoo.samplers import SAMPLERS

#: Our algorithms under their Zoo names; ``npg_trpo`` never shadows sb3-contrib's ``trpo``.
ZOO_ALGOS: dict[str, type[BaseAlgorithm]] = {"npg": NPG, "npg_trpo": TRPO}
HYPERPARAMS_DIR = Path(__file__).parent / "hyperparams"


def hyperparams_path(algo: str) -> Path:
    """
    The shipped hyperparameter file of one of our Zoo names.

    :param algo: ``npg`` or ``npg_trpo``
    :return: the path of ``sb3_npg/zoo/hyperparams/{algo}.yml``
    :raises ValueError: for a name that is not ours
    """
    if algo not in ZOO_ALGOS:
        raise ValueError(f"{algo!r} is not an sb3-npg algorithm: expected one of {sorted(ZOO_ALGOS)}")
    return HYPERPARAMS_DIR / f"{algo}.yml"


def register() -> None:
    """
    Add ``npg`` and ``npg_trpo`` to ``rl_zoo3``'s algorithms, Optuna samplers and converters.

    Idempotent: a second call finds the same entries and changes nothing. Entries of other algorithms (sb3-contrib's
    ``trpo`` among them) are never touched.

    :raises ImportError: when ``rl_zoo3`` is not installed (``pip install sb3-npg[zoo]``)
    """
    try:
        from rl_zoo3 import hyperparams_opt, utils
    except ImportError as error:  # pragma: no cover - depends on the installed extras
        raise ImportError("The RL Zoo integration needs rl_zoo3: pip install 'sb3-npg[zoo]'") from error
    from rl_zoo3.hyperparams_opt import convert_onpolicy_params

    for name, algo in ZOO_ALGOS.items():
        utils.ALGOS[name] = algo
        hyperparams_opt.HYPERPARAMS_SAMPLER[name] = SAMPLERS[name]  # type: ignore[assignment]
        hyperparams_opt.HYPERPARAMS_CONVERTER[name] = convert_onpolicy_params
