"""Continuous control: TRPO on Pendulum-v1 with VecNormalize, an EvalCallback and TensorBoard logging.

python examples/continuous_control.py [--timesteps 40000] [--logdir runs]
tensorboard --logdir runs      # train/kl_divergence, train/cg_iterations, eval/mean_reward, ...
"""

from __future__ import annotations

import argparse

from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

from sb3_npg import NPG, TRPO

ALGOS = {"npg": NPG, "trpo": TRPO}
N_ENVS = 2


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=40_000)
    parser.add_argument("--algo", choices=sorted(ALGOS), default="trpo")
    parser.add_argument("--logdir", default="runs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=N_ENVS, seed=args.seed), norm_reward=True)
    # The evaluation env shares the training statistics and reports raw rewards.
    eval_env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=args.seed + 1), training=False, norm_reward=False)
    eval_env.obs_rms = env.obs_rms
    evaluation = EvalCallback(eval_env, eval_freq=max(args.timesteps // (5 * N_ENVS), 1), n_eval_episodes=5, verbose=0)

    model = ALGOS[args.algo](
        "MlpPolicy",
        env,
        n_steps=1024,
        gamma=0.9,
        n_critic_updates=15,
        use_sde=True,
        sde_sample_freq=4,
        tensorboard_log=args.logdir,
        seed=args.seed,
        verbose=0,
    )
    model.learn(args.timesteps, callback=evaluation, tb_log_name=f"{args.algo}_pendulum")
    print(
        f"{type(model).__name__} on Pendulum-v1 (VecNormalize) after {model.num_timesteps} steps: "
        f"best eval mean {evaluation.best_mean_reward:.1f}; TensorBoard logs in {args.logdir}/"
    )
    return float(evaluation.best_mean_reward)


if __name__ == "__main__":
    main()
