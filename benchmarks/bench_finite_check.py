"""Cost per vectorized step of the NaN/inf guard: SB3's VecCheckNan against our FiniteRolloutCheck's check.

    .venv/bin/python -m benchmarks.bench_finite_check

Times only the checks (no environment), on the arrays of a CartPole step with 8 environments, best of 5 repeats.
"""

from __future__ import annotations

import timeit

import numpy as np
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecCheckNan

from sb3_npg.common.env_checks import check_finite

N_ENVS = 8
CALLS = 20_000
REPEATS = 5


def main() -> None:
    guard = VecCheckNan(make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=0), raise_exception=True)
    observations = np.zeros((N_ENVS, 4), np.float32)
    rewards = np.zeros(N_ENVS, np.float32)
    dones = np.zeros(N_ENVS, bool)
    actions = np.zeros(N_ENVS, np.int64)

    def vec_check_nan() -> None:  # what one step costs it: the actions in step_async, the results in step_wait
        guard._check_val(event="step_async", actions=actions)
        guard._check_val(event="step_wait", observations=observations, rewards=rewards, dones=dones)

    def finite_check() -> None:
        check_finite(observations, rewards, "step")

    print("| guard | microseconds per step |\n|---|---|")
    for name, check in (("VecCheckNan", vec_check_nan), ("FiniteRolloutCheck", finite_check)):
        seconds = min(timeit.repeat(check, number=CALLS, repeat=REPEATS)) / CALLS
        print(f"| {name} | {seconds * 1e6:.1f} |")


if __name__ == "__main__":
    main()
