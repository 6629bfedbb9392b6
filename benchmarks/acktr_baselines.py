"""ACKTR against OpenAI baselines' (Stable-Baselines 2's) on CartPole-v1 and Pendulum-v1: what differs, measured.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.acktr_baselines --part all

Writes ``benchmarks/results/acktr_baselines/<part>.json``. Every setting is passed explicitly (the constructor's
defaults may change): ``SETTINGS`` below.

- ``steps`` (i, iii): per update, our step's quadratic-model KL against the one baselines' rule takes for the same
  ``kfac_clip`` and the same direction (``min(lr, sqrt(clip / g^T d)) d``), the ratio ``g^T d / d^T F_hat d`` (the
  damping's share of baselines' curvature: what a translated SB2 clip leaves over), and the measured KL of the step over
  ``kfac_clip``; under baselines' settings (20 steps per update, ``kfac_stats_decay=0.99``), the same with
  ``kfac_stats_decay=0``, and the acktr.yml entries (0.5), with each damping mode; and SB2's defaults through
  ``sb2_acktr_kwargs`` (constant learning rate), against baselines' rule with SB2's (twice our) clip.
- ``critic`` (ii): the trace of each critic layer's ``G`` from baselines' sampled Fisher loss
  ``-k mean((V - stop_gradient(V + eps))^2)`` (averaged over ``NOISE_DRAWS`` draws of ``eps``) over ours with the same
  ``vf_fisher_coef``, on a rollout's observations.
- ``damping`` (iv): the acktr.yml entries with ``kfac_damping_mode="factored"`` against ``"eigenbasis"``, the mean return
  of ``EVAL_EPISODES`` deterministic episodes after ``--timesteps`` steps, seeds 0-2.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import configure

from benchmarks.common import REPOSITORY, write_results
from sb3_npg import ACKTR
from sb3_npg.acktr import sb2_acktr_kwargs
from sb3_npg.acktr.critic import critic_batch_curvature
from sb3_npg.acktr.sb2 import SB2_KFAC_CLIP_FACTOR, SB2_OPTIMIZER
from sb3_npg.common.kfac import DAMPING_MODES
from sb3_npg.common.kfac_layers import record_layers
from sb3_npg.common.natural_step import StepOutcome, StepProposal

RESULTS = REPOSITORY / "benchmarks" / "results" / "acktr_baselines"
ENVS = ("CartPole-v1", "Pendulum-v1")
#: sb3_npg/zoo/hyperparams/acktr.yml's CartPole-v1 and Pendulum-v1 entries at the time of writing, without n_timesteps.
ZOO_ENTRIES: dict[str, dict[str, Any]] = {
    "CartPole-v1": {
        "n_envs": 2,
        "n_steps": 512,
        "gae_lambda": 0.98,
        "normalize_advantage": True,
        "ent_coef": 0.0,
        "kfac_clip": 0.01,
        "kfac_stats_decay": 0.5,
        "n_critic_updates": 10,
        "normalize_value_targets": True,
        "critic_kfac_clip": 0.5,
    },
    "Pendulum-v1": {
        "n_envs": 2,
        "n_steps": 1024,
        "gamma": 0.9,
        "gae_lambda": 0.95,
        "normalize_advantage": True,
        "ent_coef": 0.0,
        "use_sde": True,
        "sde_sample_freq": 4,
        "kfac_clip": 0.02,
        "kfac_stats_decay": 0.5,
        "critic_fit": "minibatch",
        "n_critic_updates": 15,
        "batch_size": 128,
    },
}
#: OpenAI baselines' discrete ACKTR (acktr/acktr.py) and its KfacOptimizer, with a constant learning rate, one env.
BASELINES = {
    "n_envs": 1,
    "n_steps": 20,
    "learning_rate": 0.25,
    "kfac_clip": 0.001,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "vf_fisher_coef": 1.0,
    "max_grad_norm": 0.5,
    "gae_lambda": 1.0,
    "kfac_damping": 0.01,
    "kfac_stats_decay": 0.99,
    "kfac_update": 1,
    "critic_fit": "kfac",
    "n_critic_updates": 1,
    "normalize_advantage": False,
}
#: Every setting the constructor would otherwise take from its defaults, for the entries.
ENTRY_BASE = {"learning_rate": 0.25, "kfac_damping": 0.01, "kfac_update": 1, "vf_coef": 0.5, "vf_fisher_coef": 1.0}
#: The runs of the ``steps`` part: a name, the settings, and how many steps each runs.
STEP_TIMESTEPS = {"baselines": 10_000, "entry": 20_000, "sb2": 10_000}
NOISE_DRAWS = 64
EVAL_EPISODES = 10
SEEDS = (0, 1, 2)
DAMPING_TIMESTEPS = 50_000


def settings(env_id: str, kind: str, **changes: Any) -> dict[str, Any]:
    """The explicit settings of one run: baselines' or the acktr.yml entry's, with ``changes``."""
    base = dict(BASELINES) if kind == "baselines" else {**ENTRY_BASE, **ZOO_ENTRIES[env_id]}
    return {**base, **changes}


def make_model(cls: type[ACKTR], env_id: str, config: dict[str, Any], seed: int) -> ACKTR:
    """A model on ``config['n_envs']`` seeded environments, logging to memory only."""
    config = dict(config)
    env = make_vec_env(env_id, n_envs=config.pop("n_envs"), seed=seed)
    model = cls("MlpPolicy", env, seed=seed, device="cpu", **config)
    model.set_logger(configure(None, []))
    return model


class StepRecordingACKTR(ACKTR):
    """ACKTR recording, per step, what the two step rules need: ``d^T F_hat d``, ``g^T d``, the cap and the clip."""

    def _setup_model(self) -> None:
        super()._setup_model()
        self.records: list[dict[str, float]] = []

    def _accept_step(self, proposal: StepProposal) -> StepOutcome:
        outcome = super()._accept_step(proposal)
        curvature = proposal.diagnostics["kfac_curvature"]
        g_dot_d = proposal.expected_improvement / proposal.kl_scale  # g . full_step = kl_scale g . d
        self.records.append(
            {
                "curvature": curvature,
                "g_dot_d": g_dot_d,
                "learning_rate": self.current_learning_rate(),
                "clip": self.current_target_kl(),
                "step_size": outcome.metrics["step_size"],
                "kl": outcome.kl,
            }
        )
        return outcome


def step_summary(records: list[dict[str, float]], sb2_clip_factor: float = 1.0) -> dict[str, float]:
    """Medians over the updates of the two rules' model KLs, the damping's share and the measured KL over the clip
    (baselines' clip is ``sb2_clip_factor`` times ours: 2 for a translated SB2 configuration)."""
    ours, baselines, damping_share, measured, clip_bound = [], [], [], [], []
    for record in records:
        curvature, g_dot_d, cap = record["curvature"], record["g_dot_d"], record["learning_rate"]
        clip = sb2_clip_factor * record["clip"]
        if not (curvature > 0 and g_dot_d > 0):
            continue
        ours_kl = 0.5 * record["step_size"] ** 2 * curvature
        baselines_size = min(cap, math.sqrt(clip / g_dot_d))  # lr * min(1, sqrt(clip / (lr^2 g^T d)))
        ours.append(ours_kl / clip)
        baselines.append(0.5 * baselines_size**2 * curvature / clip)
        damping_share.append(g_dot_d / curvature)
        measured.append(record["kl"] / clip)
        clip_bound.append(float(record["step_size"] < cap))
    return {
        "updates": len(ours),
        "clip_bound_fraction": float(np.mean(clip_bound)),
        "median_our_model_kl_over_clip": statistics.median(ours),
        "median_baselines_model_kl_over_clip": statistics.median(baselines),
        "median_our_over_baselines_model_kl": statistics.median(o / b for o, b in zip(ours, baselines, strict=True)),
        "median_g_dot_d_over_curvature": statistics.median(damping_share),
        "median_measured_kl_over_clip": statistics.median(measured),
        "p90_measured_kl_over_clip": float(np.percentile(measured, 90)),
        "median_measured_over_our_model_kl": statistics.median(m / o for m, o in zip(measured, ours, strict=True)),
    }


def part_steps(seed: int) -> list[dict[str, Any]]:
    results = []
    for env_id in ENVS:
        for kind in ("baselines", "entry"):
            entry_decay = settings(env_id, kind)["kfac_stats_decay"]
            for decay in (entry_decay, 0.0):
                for mode in DAMPING_MODES:
                    config = settings(env_id, kind, kfac_stats_decay=decay, kfac_damping_mode=mode)
                    model = make_model(StepRecordingACKTR, env_id, config, seed)
                    start = time.perf_counter()
                    model.learn(STEP_TIMESTEPS[kind])
                    summary = step_summary(model.records)
                    row = {"env_id": env_id, "settings": kind, "kfac_stats_decay": decay, "kfac_damping_mode": mode}
                    results.append({**row, **summary, "seconds": time.perf_counter() - start, "seed": seed})
                    print(results[-1], flush=True)
        for decay in (SB2_OPTIMIZER["kfac_stats_decay"], 0.0):  # SB2's settings through the translation
            sb2 = sb2_acktr_kwargs(lr_schedule="constant", continuous_actions=env_id == "Pendulum-v1")
            model = make_model(StepRecordingACKTR, env_id, {"n_envs": 1, **sb2, "kfac_stats_decay": decay}, seed)
            model.learn(STEP_TIMESTEPS["sb2"])
            summary = step_summary(model.records, sb2_clip_factor=1.0 / SB2_KFAC_CLIP_FACTOR)
            row = {"env_id": env_id, "settings": "sb2_translated", "kfac_stats_decay": decay}
            results.append({**row, "kfac_damping_mode": sb2["kfac_damping_mode"], **summary, "seed": seed})
            print(results[-1], flush=True)
    return results


def sb2_critic_output_factors(model: ACKTR, observations: torch.Tensor, coef: float, generator: torch.Generator):
    """Each critic layer's ``G`` from baselines' sampled Fisher loss, one draw of the noise (its K-FAC multiplies the
    output gradients of a mean loss by the batch size)."""
    layers = model._critic_plan.layers
    with record_layers(layers) as records:
        values = model.policy.predict_values(observations)
    noise = torch.randn(values.shape, generator=generator)
    loss = -coef * (values - (values + noise).detach()).pow(2).mean()
    grads = torch.autograd.grad(loss, [records[layer].outputs for layer in layers])
    batch = len(observations)
    return [(grad * batch).T @ (grad * batch) / batch for grad in grads]


def part_critic(seed: int) -> list[dict[str, Any]]:
    results = []
    for env_id in ENVS:
        for coef in (1.0, 0.5):
            # Baselines' critic learns raw returns: so does this one (with normalized ones, G has a 1 / std^2 more).
            config = settings(env_id, "entry", critic_fit="kfac", vf_fisher_coef=coef, normalize_value_targets=False)
            model = make_model(ACKTR, env_id, config, seed)
            model.learn(config["n_steps"] * config["n_envs"])
            observations = torch.as_tensor(model.rollout_buffer.observations).reshape(-1, model.observation_space.shape[0])
            ours = critic_batch_curvature(model._critic_plan, model.policy, observations, coef, lambda x: x)
            generator = torch.Generator().manual_seed(seed)
            draws = [sb2_critic_output_factors(model, observations, coef, generator) for _ in range(NOISE_DRAWS)]
            ratios = [
                float(sum(draw[index] for draw in draws).trace() / NOISE_DRAWS / ours.layer_factors[index][1].trace())
                for index in range(len(ours.layer_factors))
            ]
            results.append({"env_id": env_id, "vf_fisher_coef": coef, "baselines_over_ours_trace": ratios, "seed": seed})
            print(results[-1], flush=True)
    return results


def part_damping(timesteps: int) -> list[dict[str, Any]]:
    results = []
    for env_id in ENVS:
        for mode in DAMPING_MODES:
            for seed in SEEDS:
                model = make_model(ACKTR, env_id, settings(env_id, "entry", kfac_damping_mode=mode), seed)
                start = time.perf_counter()
                model.learn(timesteps)
                eval_env = make_vec_env(env_id, n_envs=1, seed=1000 + seed)
                mean, std = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
                row = {"env_id": env_id, "kfac_damping_mode": mode, "seed": seed, "timesteps": timesteps}
                results.append({**row, "return": float(mean), "std": float(std), "seconds": time.perf_counter() - start})
                print(results[-1], flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("steps", "critic", "damping", "all"), default="all")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the steps and critic parts")
    parser.add_argument("--timesteps", type=int, default=DAMPING_TIMESTEPS, help="steps of each damping run")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    parts = ("steps", "critic", "damping") if args.part == "all" else (args.part,)
    for part in parts:
        if part == "steps":
            results = part_steps(args.seed)
        elif part == "critic":
            results = part_critic(args.seed)
        else:
            results = part_damping(args.timesteps)
        write_results(args.output / f"{part}.json", copy.deepcopy(results))


if __name__ == "__main__":
    main()
