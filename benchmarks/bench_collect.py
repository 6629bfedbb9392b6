"""Rollout collection per sample: our loop against SB3's ``collect_rollouts``, next to the environment's own cost.

    .venv/bin/python -m benchmarks.bench_collect [--reps 7] [--configs CartPole-v1,HalfCheetah-v5] [--out FILE]

For each configuration one TRPO model (default MLP policy) collects ``n_steps`` steps per rollout with its fast loop
(``rollout_collection="fast"``) and with SB3's ``OnPolicyAlgorithm.collect_rollouts``, alternated (A B A B) over
``--reps`` repetitions after a warm-up, one torch thread, with the callbacks ``learn()`` installs. Two floors are
timed in the same alternation: the bare environment stepping with random actions (one ``gymnasium`` env, no
wrappers), and the same vectorized environment as the model's (``Monitor``, ``VecNormalize`` where the
configuration has it) stepping with random actions; both floors draw a new random action per step, all of them
before the clock starts. The table reports the median microseconds per sample and the
ratios ours / SB3's and ours / the vectorized floor.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.vec_env import VecNormalize

from benchmarks.common import TIMING_WARMUP_ROUNDS, configs_parser, run_configs
from sb3_npg import TRPO

#: name -> environment, number of envs, VecNormalize, steps per environment per rollout.
COLLECT_CONFIGS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"env_id": "CartPole-v1", "n_envs": 1, "normalize": False, "n_steps": 1024},
    "Pendulum-v1": {"env_id": "Pendulum-v1", "n_envs": 1, "normalize": False, "n_steps": 1024},
    "HalfCheetah-v5": {"env_id": "HalfCheetah-v5", "n_envs": 2, "normalize": True, "n_steps": 1024},
    "Humanoid-v5": {"env_id": "Humanoid-v5", "n_envs": 1, "normalize": True, "n_steps": 1024},
}
CONTENDERS = ("bare env", "VecEnv, random actions", "SB3 collect_rollouts", "ours")


def _vec_env(config: dict[str, Any], seed: int) -> Any:
    env = make_vec_env(config["env_id"], n_envs=config["n_envs"], seed=seed)
    return VecNormalize(env) if config["normalize"] else env


def _random_action_sequence(space: gym.Space, count: int, seed: int) -> np.ndarray:
    """``count`` random actions, drawn before the clock starts (sampling a ``Box`` costs more than some steps)."""
    space.seed(seed)
    return np.stack([space.sample() for _ in range(count)])


def _bare(config: dict[str, Any], seed: int) -> Any:
    """Seconds per sample of the bare environment stepping with random actions."""
    env = gym.make(config["env_id"])
    env.reset(seed=seed)
    steps = config["n_steps"] * config["n_envs"]
    actions = _random_action_sequence(env.action_space, steps, seed)

    def run() -> float:
        start = time.perf_counter()
        for action in actions:
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
        return (time.perf_counter() - start) / steps

    return run


def _random_actions(config: dict[str, Any], seed: int) -> Any:
    """Seconds per sample of the model's kind of vectorized environment stepping with random actions."""
    env = _vec_env(config, seed)
    env.reset()
    actions = _random_action_sequence(env.action_space, config["n_steps"] * config["n_envs"], seed)
    actions = actions.reshape(config["n_steps"], config["n_envs"], *actions.shape[1:])

    def run() -> float:
        start = time.perf_counter()
        for step_actions in actions:
            env.step(step_actions)
        return (time.perf_counter() - start) / (config["n_steps"] * config["n_envs"])

    return run


def _collect(model: TRPO, loop: Any) -> Any:
    """Seconds per sample of one rollout collected by ``loop`` (ours or SB3's) with ``learn()``'s callbacks."""
    _, callback = model._setup_learn(10**9)

    def run() -> float:
        start = time.perf_counter()
        loop(model.env, callback, model.rollout_buffer, model.n_steps)
        return (time.perf_counter() - start) / (model.n_steps * model.n_envs)

    return run


def bench_config(name: str, config: dict[str, Any], reps: int, seed: int = 0) -> dict[str, Any]:
    """Median seconds per sample of every contender, alternated."""
    model = TRPO("MlpPolicy", _vec_env(config, seed), n_steps=config["n_steps"], seed=seed, device="cpu")
    model.set_logger(configure(None, []))
    runs = {
        "bare env": _bare(config, seed),
        "VecEnv, random actions": _random_actions(config, seed),
        "SB3 collect_rollouts": _collect(model, lambda *args: OnPolicyAlgorithm.collect_rollouts(model, *args)),
        "ours": _collect(model, model.collect_rollouts),
    }
    times: dict[str, list[float]] = {contender: [] for contender in CONTENDERS}
    for rep in range(TIMING_WARMUP_ROUNDS + reps):
        for contender in CONTENDERS:
            elapsed = runs[contender]()
            if rep >= TIMING_WARMUP_ROUNDS:
                times[contender].append(elapsed)
    medians = {contender: statistics.median(measured) for contender, measured in times.items()}
    ratios = [ours / sb3 for ours, sb3 in zip(times["ours"], times["SB3 collect_rollouts"], strict=True)]
    return {
        "config": name,
        "n_envs": config["n_envs"],
        "us_per_sample": {contender: 1e6 * median for contender, median in medians.items()},
        "ours_over_sb3": statistics.median(ratios),
        "ours_over_vec_env_floor": medians["ours"] / medians["VecEnv, random actions"],
    }


def timing_table(
    results: list[dict[str, Any]], times: str, columns: tuple[str, ...], unit: str, ratios: dict[str, str]
) -> str:
    """
    One row per configuration: its median times, then its ratios (two decimals).

    :param times: the key of each row's times (``us_per_sample``...), one per column
    :param ratios: header -> key of the row's ratio
    """
    lines = [
        "| configuration | envs | "
        + " | ".join(f"{column} ({unit})" for column in columns)
        + " | "
        + " | ".join(ratios)
        + " |",
        "|---|---|" + "---|" * (len(columns) + len(ratios)),
    ]
    for row in results:
        cells = " | ".join(f"{row[times][column]:.0f}" for column in columns)
        shown = " | ".join(f"{row[key]:.2f}" for key in ratios.values())
        lines.append(f"| {row['config']} | {row['n_envs']} | {cells} | {shown} |")
    return "\n".join(lines)


def markdown_table(results: list[dict[str, Any]]) -> str:
    """One row per configuration."""
    ratios = {"ours / SB3's (median)": "ours_over_sb3", "ours / VecEnv floor": "ours_over_vec_env_floor"}
    return timing_table(results, "us_per_sample", CONTENDERS, "us / sample", ratios)


def main() -> None:
    parser = configs_parser(__doc__, COLLECT_CONFIGS)
    parser.set_defaults(reps=7)
    run_configs(parser.parse_args(), COLLECT_CONFIGS, bench_config, markdown_table)


if __name__ == "__main__":
    main()
