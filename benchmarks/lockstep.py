"""Our TRPO against sb3-contrib's, update by update, on the same rollouts of one training run.

    .venv/bin/python -m benchmarks.lockstep --env HalfCheetah-v5 --updates 488 --block 49 --seed 1 \
        --out benchmarks/results/lockstep/HalfCheetah-v5_seed1.md

sb3-contrib's TRPO trains with the RL Zoo's settings (its ``trpo.yml``), ours with the same settings
translated to our KL (``sb3_contrib_trpo.yml``, not the tuned ``npg_trpo.yml``). Before each of
sb3-contrib's updates, ours is given the same policy weights and a copy of the same rollout, and both update. The
table compares, per block of updates:

- the actor step: the relative difference ``|ours - theirs| / |theirs|`` of the parameter change, the share of
  updates on which the line searches took the same fraction of the full step (equal step lengths within 1%), and on
  the others, how often ours was the shorter step;
- the policy's standard deviation after the step, which is where the KL directions differ (ours KL(old || new), the
  paper's; sb3-contrib's KL(new || old));
- the critic: the value loss on the rollout after each fit, from the same starting weights (each with its own Adam
  state), and the ratio of the two.

The run follows sb3-contrib's trajectory; ours never collects. Equal columns mean the two updates are the same
algorithm, so any gap in the comparison matrix comes from elsewhere (or from seed variance).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import sb3_contrib
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.vec_env import VecNormalize
from torch.nn import functional as F

from benchmarks.common import default_hyperparams, hyperparams_entry
from sb3_npg import TRPO
from sb3_npg.common.natural_gradient import get_flat_params
from sb3_npg.zoo import hyperparams_path

#: Keys of a Zoo entry that configure the harness, not the algorithm.
ZOO_HARNESS_KEYS = ("normalize", "n_envs", "n_timesteps", "policy")
#: Two line-search step lengths count as the same fraction when they differ by less than this, relatively.
SAME_FRACTION_TOLERANCE = 0.01
#: Updates per row of the table.
DEFAULT_BLOCK = 10
#: Guards the relative differences against a rejected (zero) step.
MIN_LENGTH = 1e-12


def _algorithm_kwargs(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if key not in ZOO_HARNESS_KEYS}


def build_pair(env_id: str, seed: int) -> tuple[OnPolicyAlgorithm, TRPO]:
    """sb3-contrib's TRPO on a Zoo-style environment and ours, sharing that environment, with the same weights."""
    theirs_entry = hyperparams_entry(default_hyperparams("trpo"), env_id)
    # sb3-contrib's settings translated to our KL, not our tuned entry: the same problem, update by update
    ours_entry = hyperparams_entry(hyperparams_path("npg_trpo", sb3_contrib_settings=True), env_id)
    env = make_vec_env(env_id, n_envs=theirs_entry.get("n_envs", 1), seed=seed)
    if theirs_entry.get("normalize", False):
        env = VecNormalize(env, gamma=theirs_entry.get("gamma", 0.99))
    theirs = sb3_contrib.TRPO("MlpPolicy", env, seed=seed, device="cpu", **_algorithm_kwargs(theirs_entry))
    ours = TRPO("MlpPolicy", env, seed=seed, device="cpu", **_algorithm_kwargs(ours_entry))
    for model in (theirs, ours):
        model.set_logger(configure(None, []))
    ours.policy.load_state_dict(theirs.policy.state_dict())
    return theirs, ours


def _actor(model: OnPolicyAlgorithm) -> list[torch.nn.Parameter]:
    return [param for name, param in model.policy.named_parameters() if "value" not in name]


def _value_loss(model: OnPolicyAlgorithm) -> float:
    buffer = model.rollout_buffer
    observations = torch.as_tensor(buffer.observations.reshape(buffer.buffer_size * buffer.n_envs, -1), dtype=torch.float32)
    with torch.no_grad():
        values = model.policy.predict_values(observations).flatten()
    return float(F.mse_loss(values, torch.as_tensor(buffer.returns.flatten(), dtype=torch.float32)))


def _std(model: OnPolicyAlgorithm) -> float:
    return float(torch.exp(model.policy.log_std.detach()).mean())


def lockstep(env_id: str, seed: int, updates: int) -> list[dict[str, float]]:
    """One record per update of sb3-contrib's run, with ours updated from the same state on the same rollout."""
    theirs, ours = build_pair(env_id, seed)
    _, callback = theirs._setup_learn(updates * theirs.n_steps * theirs.n_envs)
    assert theirs.env is not None
    records = []
    for _ in range(updates):
        theirs.collect_rollouts(theirs.env, callback, theirs.rollout_buffer, theirs.n_steps)
        ours.policy.load_state_dict(theirs.policy.state_dict())
        ours.rollout_buffer = copy.deepcopy(theirs.rollout_buffer)
        start = get_flat_params(_actor(theirs))
        rng_state = np.random.get_state()
        ours.train()
        np.random.set_state(rng_state)  # sb3-contrib's run stays the one it would be without ours
        theirs.train()
        ours_step, theirs_step = get_flat_params(_actor(ours)) - start, get_flat_params(_actor(theirs)) - start
        ours_length, theirs_length = float(ours_step.norm()), float(theirs_step.norm())
        same = abs(ours_length - theirs_length) <= SAME_FRACTION_TOLERANCE * max(theirs_length, MIN_LENGTH)
        records.append(
            {
                "step_difference": float((ours_step - theirs_step).norm()) / max(theirs_length, MIN_LENGTH),
                "same_fraction": float(same),
                "ours_shorter": float(not same and ours_length < theirs_length),
                "ours_rejected": float(ours_length == 0.0),
                "theirs_rejected": float(theirs_length == 0.0),
                "ours_std": _std(ours),
                "theirs_std": _std(theirs),
                "ours_value_loss": _value_loss(ours),
                "theirs_value_loss": _value_loss(theirs),
            }
        )
    return records


def table(records: list[dict[str, float]], block: int) -> str:
    """A markdown table with one row per ``block`` updates (means over the block)."""
    lines = [
        "| updates | actor step rel. diff (median) | same line-search fraction | otherwise ours shorter / longer "
        "| rejected ours / theirs | std ours / theirs (last) | value loss ours / theirs (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for start in range(0, len(records), block):
        rows = records[start : start + block]
        column = {key: np.array([row[key] for row in rows]) for key in rows[0]}
        ours_longer = len(rows) - column["same_fraction"].sum() - column["ours_shorter"].sum()
        lines.append(
            f"| {start + 1}-{start + len(rows)} | {np.median(column['step_difference']):.2e} "
            f"| {column['same_fraction'].mean():.0%} "
            f"| {int(column['ours_shorter'].sum())} / {int(ours_longer)} "
            f"| {int(column['ours_rejected'].sum())} / {int(column['theirs_rejected'].sum())} "
            f"| {column['ours_std'][-1]:.3f} / {column['theirs_std'][-1]:.3f} "
            f"| {column['ours_value_loss'].mean():.4g} / {column['theirs_value_loss'].mean():.4g} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--block", type=int, default=DEFAULT_BLOCK)
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = table(lockstep(args.env, args.seed, args.updates), args.block)
    print(result)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"`{' '.join(['python -m benchmarks.lockstep', *sys.argv[1:]])}`\n\n{result}\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
