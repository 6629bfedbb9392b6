"""RL Zoo (``rl_zoo3``) integration: our algorithms as ``npg`` and ``npg_trpo``, hyperparameter files, Optuna samplers.

``rl_zoo3`` has no plugin entry points: its algorithms are the dict ``rl_zoo3.utils.ALGOS`` and its samplers the
dicts ``rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER`` / ``HYPERPARAMS_CONVERTER``. :func:`register` adds ours to
them in place (every Zoo module holds the same dict objects). The command line (``sb3-npg-zoo`` or
``python -m sb3_npg.zoo``) calls it, then runs the Zoo's own scripts.
"""

from sb3_npg.zoo.registry import ZOO_ALGOS, hyperparams_path, register

__all__ = ["ZOO_ALGOS", "hyperparams_path", "register"]
