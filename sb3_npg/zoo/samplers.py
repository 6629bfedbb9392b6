"""Optuna samplers of NPG, TRPO and ACKTR hyperparameters, in the RL Zoo's sampler signature.

Each returns constructor arguments (through the Zoo's ``convert_onpolicy_params``, which is also registered as the
converter that turns a stored trial back into arguments). Ranges follow the Zoo's TRPO sampler; ``target_kl`` and
``cg_damping`` scale with the number of action dimensions of a Box, since our KL is summed over them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

Sampler = Callable[["optuna.Trial", int, int, dict], dict[str, Any]]

#: Powers of two of the rollout length per environment and of the critic's minibatch (as the Zoo's TRPO sampler).
N_STEPS_POW = (5, 12)
BATCH_SIZE_POW = (5, 10)
ONE_MINUS_GAMMA = (1e-4, 0.03)
ONE_MINUS_GAE_LAMBDA = (1e-4, 0.1)
LEARNING_RATE = (1e-5, 2e-3)
N_CRITIC_UPDATES = (5, 30)
CG_MAX_STEPS = (5, 30)
#: Per action dimension of a Box (the whole range for Discrete, MultiDiscrete and MultiBinary actions).
TARGET_KL_PER_DIMENSION = (1e-3, 0.1)
CG_DAMPING_PER_DIMENSION = (1e-2, 0.5)
FISHER_SUB_SAMPLING_FACTORS = (1, 5)
CRITIC_FITS = ("minibatch", "lbfgs")
NORMALIZE_VALUE_TARGETS = (False, True)
LINE_SEARCH_SHRINKING_FACTORS = (0.6, 0.7, 0.8, 0.9)


def sample_npg_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sample NPG's hyperparameters.

    :param trial: the Optuna trial
    :param n_actions: the number of action dimensions of a Box action space (the Zoo passes 0 otherwise)
    :param n_envs: the number of environments (unused: ``n_steps`` is per environment)
    :param additional_args: the Zoo's extra sampler arguments (unused)
    :return: constructor arguments
    """
    from rl_zoo3.hyperparams_opt import convert_onpolicy_params

    dims = max(1, n_actions)
    n_steps_pow = trial.suggest_int("n_steps_pow", *N_STEPS_POW)
    batch_size_pow = trial.suggest_int("batch_size_pow", *BATCH_SIZE_POW)
    one_minus_gamma = trial.suggest_float("one_minus_gamma", *ONE_MINUS_GAMMA, log=True)
    trial.set_user_attr("gamma", 1 - one_minus_gamma)
    trial.set_user_attr("n_steps", 2**n_steps_pow)
    trial.set_user_attr("batch_size", 2**batch_size_pow)
    sampled = {
        "n_steps_pow": n_steps_pow,
        "batch_size_pow": batch_size_pow,
        "one_minus_gamma": one_minus_gamma,
        "one_minus_gae_lambda": trial.suggest_float("one_minus_gae_lambda", *ONE_MINUS_GAE_LAMBDA, log=True),
        "learning_rate": trial.suggest_float("learning_rate", *LEARNING_RATE, log=True),
        "n_critic_updates": trial.suggest_int("n_critic_updates", *N_CRITIC_UPDATES),
        "cg_max_steps": trial.suggest_int("cg_max_steps", *CG_MAX_STEPS),
        "cg_damping": trial.suggest_float("cg_damping", *(dims * x for x in CG_DAMPING_PER_DIMENSION), log=True),
        "target_kl": trial.suggest_float("target_kl", *(dims * x for x in TARGET_KL_PER_DIMENSION), log=True),
        "fisher_sub_sampling_factor": trial.suggest_categorical("fisher_sub_sampling_factor", FISHER_SUB_SAMPLING_FACTORS),
        "critic_fit": trial.suggest_categorical("critic_fit", CRITIC_FITS),
        "normalize_value_targets": trial.suggest_categorical("normalize_value_targets", NORMALIZE_VALUE_TARGETS),
        "net_arch": trial.suggest_categorical("net_arch", ["small", "medium"]),
        "activation_fn": trial.suggest_categorical("activation_fn", ["tanh", "relu"]),
    }
    return convert_onpolicy_params(sampled)


def sample_npg_trpo_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """
    Sample TRPO's hyperparameters: NPG's and the line search's shrinking factor.

    :param trial: the Optuna trial
    :param n_actions: the number of action dimensions of a Box action space (the Zoo passes 0 otherwise)
    :param n_envs: the number of environments
    :param additional_args: the Zoo's extra sampler arguments
    :return: constructor arguments
    """
    hyperparams = sample_npg_params(trial, n_actions, n_envs, additional_args)
    factor = trial.suggest_categorical("line_search_shrinking_factor", LINE_SEARCH_SHRINKING_FACTORS)
    return {**hyperparams, "line_search_shrinking_factor": factor}


#: ACKTR's ranges: rollouts of 8 to 2048 steps per environment, the K-FAC step's cap and KL clip (per action dimension
#: of a Box), the damping and decay of the factors, the entropy bonus and the critic's fit.
ACKTR_N_STEPS_POW = (3, 11)
ACKTR_LEARNING_RATE = (0.01, 1.0)
KFAC_CLIP_PER_DIMENSION = (1e-4, 0.05)
KFAC_DAMPING = (1e-3, 0.3)
KFAC_STATS_DECAY = (0.0, 0.5, 0.9, 0.95, 0.99)
ENT_COEF = (1e-8, 0.01)
ACKTR_CRITIC_FITS = ("kfac", "minibatch")
ACKTR_N_CRITIC_UPDATES = (1, 25)
NORMALIZE_ADVANTAGE = (False, True)


def sample_acktr_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """Sample ACKTR's hyperparameters (the arguments as :func:`sample_npg_params` takes them); ``kfac_clip`` scales
    with the number of action dimensions of a Box, as NPG's ``target_kl`` does."""
    from rl_zoo3.hyperparams_opt import convert_onpolicy_params

    dims = max(1, n_actions)
    n_steps_pow = trial.suggest_int("n_steps_pow", *ACKTR_N_STEPS_POW)
    one_minus_gamma = trial.suggest_float("one_minus_gamma", *ONE_MINUS_GAMMA, log=True)
    trial.set_user_attr("gamma", 1 - one_minus_gamma)
    trial.set_user_attr("n_steps", 2**n_steps_pow)
    sampled = {
        "n_steps_pow": n_steps_pow,
        "one_minus_gamma": one_minus_gamma,
        "one_minus_gae_lambda": trial.suggest_float("one_minus_gae_lambda", *ONE_MINUS_GAE_LAMBDA, log=True),
        "learning_rate": trial.suggest_float("learning_rate", *ACKTR_LEARNING_RATE, log=True),
        "kfac_clip": trial.suggest_float("kfac_clip", *(dims * x for x in KFAC_CLIP_PER_DIMENSION), log=True),
        "kfac_damping": trial.suggest_float("kfac_damping", *KFAC_DAMPING, log=True),
        "kfac_stats_decay": trial.suggest_categorical("kfac_stats_decay", KFAC_STATS_DECAY),
        "ent_coef": trial.suggest_float("ent_coef", *ENT_COEF, log=True),
        "normalize_advantage": trial.suggest_categorical("normalize_advantage", NORMALIZE_ADVANTAGE),
        "critic_fit": trial.suggest_categorical("critic_fit", ACKTR_CRITIC_FITS),
        "n_critic_updates": trial.suggest_int("n_critic_updates", *ACKTR_N_CRITIC_UPDATES),
        "normalize_value_targets": trial.suggest_categorical("normalize_value_targets", NORMALIZE_VALUE_TARGETS),
        "net_arch": trial.suggest_categorical("net_arch", ["small", "medium"]),
        "activation_fn": trial.suggest_categorical("activation_fn", ["tanh", "relu"]),
    }
    return convert_onpolicy_params(sampled)


SAMPLERS: dict[str, Sampler] = {
    "npg": sample_npg_params,
    "npg_trpo": sample_npg_trpo_params,
    "acktr": sample_acktr_params,
}
