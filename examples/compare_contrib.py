"""NPG vs TRPO vs sb3-contrib's TRPO on the same seed, printed side by side.

    python examples/compare_contrib.py [--timesteps 20000] [--env CartPole-v1] [--seed 0]

Needs sb3-contrib (``pip install sb3-npg[test]`` or ``[benchmarks]``).
"""

from __future__ import annotations

import argparse
import time

import sb3_contrib
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_npg import NPG, TRPO

CONTENDERS = {"sb3_npg.NPG": NPG, "sb3_npg.TRPO": TRPO, "sb3_contrib.TRPO": sb3_contrib.TRPO}
# The RL Zoo's tuned sb3-contrib TRPO settings for CartPole-v1, given unchanged to all three.
SETTINGS = {"n_steps": 512, "batch_size": 512, "cg_damping": 1e-3, "gae_lambda": 0.98, "n_critic_updates": 20}
N_ENVS = 2
N_EVAL_EPISODES = 10


def main(argv: list[str] | None = None) -> list[tuple[str, float, float, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=20_000)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rows = []
    for name, algo in CONTENDERS.items():
        env = make_vec_env(args.env, n_envs=N_ENVS, seed=args.seed)
        model = algo("MlpPolicy", env, seed=args.seed, **SETTINGS)
        start = time.perf_counter()
        model.learn(args.timesteps)
        wall = time.perf_counter() - start
        eval_env = make_vec_env(args.env, n_envs=1, seed=args.seed + 1000)
        mean, std = evaluate_policy(model, eval_env, n_eval_episodes=N_EVAL_EPISODES, deterministic=True)
        rows.append((name, float(mean), float(std), wall))

    print(f"{args.env}, {args.timesteps} steps, seed {args.seed}, {N_EVAL_EPISODES} deterministic episodes")
    print(f"{'algorithm':<18} {'mean return':>12} {'std':>8} {'wall s':>8}")
    for name, mean, std, wall in rows:
        print(f"{name:<18} {mean:>12.1f} {std:>8.1f} {wall:>8.1f}")
    return rows


if __name__ == "__main__":
    main()
