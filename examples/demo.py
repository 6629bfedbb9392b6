"""`make demo`: train NPG and TRPO on CartPole-v1, evaluate each over 10 episodes, print a table, save the models.

python examples/demo.py [--timesteps 50000] [--out models]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_npg import NPG, TRPO

ENV_ID = "CartPole-v1"
N_ENVS = 2
N_EVAL_EPISODES = 10
#: Each algorithm with the settings a user would pick, and where they come from: both with their own defaults, which
#: reach 500 on CartPole-v1 within 50k steps on seeds 0-4 (benchmarks/results/demo_seeds.txt). The RL Zoo's TRPO
#: settings for CartPole-v1 (512 steps per update) did not for TRPO (2 of 5 seeds: demo_seeds_zoo_trpo.txt), and make
#: NPG's full steps overshoot (docs/guide/algorithms.md).
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {"NPG": ("its defaults", {}), "TRPO": ("its defaults", {})}
#: ``train/step_fraction`` of an update whose line search accepted the full natural step (NPG's step).
FULL_STEP = 1.0


def trpo_rows_note(step_fractions: Sequence[float]) -> str:
    """
    The line under the table that says whether TRPO's run was NPG's: with the same seed, every update whose line
    search accepts the full natural step is NPG's update, so when all of them do the two rows are identical.

    :param step_fractions: TRPO's ``train/step_fraction`` of each update
    :return: the line
    """
    shortened = sum(fraction != FULL_STEP for fraction in step_fractions)
    if step_fractions and shortened == 0:
        return (
            f"NPG's and TRPO's rows are identical: TRPO's line search accepted the full natural step on all "
            f"{len(step_fractions)} updates, so each of its updates was NPG's."
        )
    total = len(step_fractions)
    return f"TRPO's line search shortened or refused {shortened} of {total} natural steps (NPG takes them whole)."


def _recording_step_fractions(model: Any) -> list[float]:
    """``train/step_fraction`` after each of ``model``'s updates, in a list filled as it trains."""
    fractions: list[float] = []
    train = model.train

    def recording_train() -> None:
        train()
        fractions.append(float(model.logger.name_to_value["train/step_fraction"]))

    model.train = recording_train
    return fractions


def main(argv: list[str] | None = None) -> list[tuple[str, int, float, float, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=50_000)
    parser.add_argument("--out", default="models")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)

    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = []
    step_fractions: list[float] = []
    for algo in (NPG, TRPO):
        source, settings = SETTINGS[algo.__name__]
        print(f"Training {algo.__name__} ({source}) on {ENV_ID} for {args.timesteps} steps")
        model = algo("MlpPolicy", make_vec_env(ENV_ID, n_envs=N_ENVS, seed=args.seed), seed=args.seed, **settings)
        step_fractions = _recording_step_fractions(model)
        start = time.perf_counter()
        model.learn(args.timesteps, progress_bar=not args.no_progress_bar)
        wall = time.perf_counter() - start
        eval_env = make_vec_env(ENV_ID, n_envs=1, seed=args.seed + 1000)
        mean, std = evaluate_policy(model, eval_env, n_eval_episodes=N_EVAL_EPISODES, deterministic=True)
        path = Path(args.out) / f"{algo.__name__.lower()}_{ENV_ID}"
        model.save(path)
        rows.append((algo.__name__, model.num_timesteps, float(mean), float(std), wall))
        print(f"saved {path}.zip")

    print(f"\n{ENV_ID}: deterministic evaluation over {N_EVAL_EPISODES} episodes")
    width = max(len(source) for source, _ in SETTINGS.values())
    print(f"| {'algorithm':<9} | {'settings':<{width}} | {'timesteps':>9} | {'mean +- std return':>18} | {'wall time':>9} |")
    print(f"|{'-' * 11}|{'-' * (width + 2)}|{'-' * 11}|{'-' * 20}|{'-' * 11}|")
    for name, steps, mean, std, wall in rows:
        source = SETTINGS[name][0]
        print(f"| {name:<9} | {source:<{width}} | {steps:>9} | {f'{mean:.1f} +- {std:.1f}':>18} | {f'{wall:.1f} s':>9} |")
    print(trpo_rows_note(step_fractions))  # the last model trained is TRPO's
    return rows


if __name__ == "__main__":
    main()
