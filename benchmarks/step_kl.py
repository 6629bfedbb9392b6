"""How far the KL of each natural step lands from ``target_kl``: NPG's full step against TRPO's searched one.

    .venv/bin/python -m benchmarks.step_kl --seed 1

Trains NPG and TRPO with the RL Zoo's sb3-contrib TRPO settings for CartPole-v1 (the ones our ``npg`` entry started
from) and reads the logged ``train/kl_divergence`` of every update: the true mean KL between the policy before and
after the step. The quadratic model behind the step size predicts ``target_kl``; a nearly deterministic policy makes
the model too optimistic, TRPO's line search then shortens the step and NPG takes it whole.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import pandas as pd
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure

from benchmarks.common import LEARNING_CONFIGS
from sb3_npg import NPG, TRPO

#: The RL Zoo's sb3-contrib TRPO settings for CartPole-v1, as the learning check uses them.
ZOO_CARTPOLE = LEARNING_CONFIGS["CartPole-v1"]["hyperparams"]
N_ENVS = LEARNING_CONFIGS["CartPole-v1"]["n_envs"]
TIMESTEPS = 100_000
#: An update counts as overshooting when its KL is at least this multiple of ``target_kl``.
OVERSHOOT = 2.0


def step_kls(algo: type[NPG] | type[TRPO], seed: int, timesteps: int = TIMESTEPS) -> np.ndarray:
    """The logged KL of every update of one training run (updates whose step was rejected or skipped excluded)."""
    env = make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=seed)
    model = algo("MlpPolicy", env, seed=seed, **ZOO_CARTPOLE)
    with tempfile.TemporaryDirectory() as folder:
        model.set_logger(configure(folder, ["csv"]))
        model.learn(timesteps, log_interval=1)
        kls = pd.read_csv(f"{folder}/progress.csv")["train/kl_divergence"].dropna().to_numpy()
    return kls[kls > 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"| model | updates | median KL / target | 90th percentile | max | updates at >= {OVERSHOOT:g}x target |")
    print("|---|---|---|---|---|---|")
    for algo in (NPG, TRPO):
        ratios = step_kls(algo, args.seed) / algo("MlpPolicy", "CartPole-v1").target_kl
        share = float(np.mean(ratios >= OVERSHOOT))
        print(
            f"| {algo.__name__} | {len(ratios)} | {np.median(ratios):.2f} | {np.percentile(ratios, 90):.2f} | "
            f"{ratios.max():.2f} | {share:.0%} |"
        )


if __name__ == "__main__":
    main()
