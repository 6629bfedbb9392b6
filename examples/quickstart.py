"""Quick start: train NPG on CartPole-v1, save, load, and evaluate.

python examples/quickstart.py [--timesteps 30000] [--algo npg|trpo]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from stable_baselines3.common.evaluation import evaluate_policy

from sb3_npg import NPG, TRPO

ALGOS = {"npg": NPG, "trpo": TRPO}


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=30_000)
    parser.add_argument("--algo", choices=sorted(ALGOS), default="npg")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    algo = ALGOS[args.algo]
    model = algo("MlpPolicy", "CartPole-v1", n_steps=512, batch_size=512, n_critic_updates=20, seed=args.seed)
    model.learn(args.timesteps)

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{args.algo}_cartpole"
        model.save(path)
        loaded = algo.load(path, env=model.get_env())

    mean, std = evaluate_policy(loaded, loaded.get_env(), n_eval_episodes=10, deterministic=True)
    print(f"{algo.__name__} on CartPole-v1 after {loaded.num_timesteps} steps: {mean:.1f} +- {std:.1f} (10 episodes)")
    return float(mean)


if __name__ == "__main__":
    main()
