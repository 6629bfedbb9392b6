"""Cost per vectorized step of the NaN/inf guard: SB3's VecCheckNan against our FiniteRolloutCheck's check.

    .venv/bin/python -m benchmarks.bench_finite_check

Both guard a vectorized environment that returns the arrays of a CartPole step with 8 environments and costs almost
nothing itself, so the difference of the timings is the guard's: ``VecCheckNan`` wraps it (it checks the actions in
``step_async`` and the results in ``step_wait``), our check runs on what its ``step`` returned. Best of 5 repeats.
"""

from __future__ import annotations

import timeit
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env import VecCheckNan, VecEnv

from sb3_npg.common.checks import check_finite

N_ENVS = 8
CALLS = 20_000
REPEATS = 5


class _ConstantVecEnv(VecEnv):
    """Returns the same CartPole-shaped arrays on every step: an environment that costs (almost) nothing."""

    render_mode = None

    def __init__(self, n_envs: int):
        super().__init__(n_envs, spaces.Box(-1.0, 1.0, (4,), np.float32), spaces.Discrete(2))
        self.observations = np.zeros((n_envs, 4), np.float32)
        self.rewards = np.zeros(n_envs, np.float32)
        self.dones = np.zeros(n_envs, bool)
        self.infos: list[dict[str, Any]] = [{} for _ in range(n_envs)]

    def reset(self) -> np.ndarray:
        return self.observations

    def step_async(self, actions: np.ndarray) -> None:
        pass

    def step_wait(self) -> Any:
        return self.observations, self.rewards, self.dones, self.infos

    def close(self) -> None:
        pass

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(self, attr_name)] * self.num_envs

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        setattr(self, attr_name, value)

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
        return []

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> Sequence[bool]:
        return [False] * self.num_envs


def main() -> None:
    env = _ConstantVecEnv(N_ENVS)
    guarded = VecCheckNan(_ConstantVecEnv(N_ENVS), raise_exception=True)
    actions = np.zeros(N_ENVS, np.int64)

    def bare() -> None:
        env.step(actions)

    def vec_check_nan() -> None:
        guarded.step(actions)

    def finite_check() -> None:
        observations, rewards, _, _ = env.step(actions)
        check_finite(observations, rewards, "step")

    steps = {"bare": bare, "VecCheckNan": vec_check_nan, "FiniteRolloutCheck": finite_check}
    seconds = {name: min(timeit.repeat(step, number=CALLS, repeat=REPEATS)) / CALLS for name, step in steps.items()}
    print("| guard | microseconds per step, the guard alone |\n|---|---|")
    for name in ("VecCheckNan", "FiniteRolloutCheck"):
        print(f"| {name} | {(seconds[name] - seconds['bare']) * 1e6:.1f} |")


if __name__ == "__main__":
    main()
