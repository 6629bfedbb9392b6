"""Why one run can show two final returns: the Zoo's evaluation schedule decides which episodes the last evaluation sees.

    .venv/bin/python -m benchmarks.eval_schedule [--algo npg] [--env Pendulum-v1] [--seed 0] [--freqs 25000,10000]

Trains the same algorithm, environment and seed with ``sb3-npg-zoo train`` once per evaluation frequency (each in a
fresh process, one torch thread), then reports: whether the final parameters are identical (the Zoo's evaluations are
deterministic and consume no training randomness, so they must be), the last evaluation of each run (10 episodes on
the Zoo's evaluation environment, which is seeded once and runs on, so each schedule's last evaluation sees other
start states), and the final policy's mean return over ``--episodes`` episodes from fixed seeds, the number both
estimate. This is how the comparison matrix (10 evaluations per run) and the old Zoo verification (4) came to show
different final returns for the same Pendulum-v1 run; both harnesses now share one schedule
(``benchmarks.common.EVALUATIONS_PER_RUN``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_npg.zoo.registry import ZOO_ALGOS

#: Fixed seeds of the reference evaluation start here (never a training or Zoo evaluation seed).
REFERENCE_SEED = 20_000


def _train(algo: str, env_id: str, seed: int, eval_freq: int, folder: str) -> Path:
    """Train with the Zoo, evaluating every ``eval_freq`` steps; return the run's log folder."""
    command = [sys.executable, "-m", "sb3_npg.zoo", "train", "--algo", algo, "--env", env_id, "--seed", str(seed)]
    command += ["-f", folder, "--eval-freq", str(eval_freq), "--eval-episodes", "10", "--num-threads", "1"]
    subprocess.run([*command, "--log-interval", "-1", "--verbose", "0"], check=True, stdout=subprocess.DEVNULL)
    return next(Path(folder).glob(f"{algo}/{env_id}_*"))


def _parameters(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([parameter.detach().flatten() for parameter in model.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="npg", choices=sorted(ZOO_ALGOS))
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--freqs", default="25000,10000", help="evaluation frequencies to compare (steps)")
    parser.add_argument("--episodes", type=int, default=100, help="episodes of the fixed-seed reference evaluation")
    args = parser.parse_args()
    algorithm = ZOO_ALGOS[args.algo]
    models = []
    with tempfile.TemporaryDirectory() as root:
        for freq in map(int, args.freqs.split(",")):
            run = _train(args.algo, args.env, args.seed, freq, f"{root}/{freq}")
            last = np.load(run / "evaluations.npz")["results"][-1]
            print(f"evaluated every {freq} steps: last evaluation {last.mean():.1f} +- {last.std():.1f}")
            print(f"    its episodes: {last.round(0)}")
            models.append(algorithm.load(run / f"{args.env}.zip", device="cpu"))
    same = all(torch.equal(_parameters(models[0].policy), _parameters(model.policy)) for model in models[1:])
    print(f"identical final parameters: {same}")
    env = make_vec_env(args.env, n_envs=1, seed=REFERENCE_SEED)
    mean, std = evaluate_policy(models[0], env, n_eval_episodes=args.episodes, deterministic=True)
    print(f"the final policy over {args.episodes} fixed-seed episodes: {mean:.1f} +- {std:.1f}")


if __name__ == "__main__":
    main()
