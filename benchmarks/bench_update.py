"""Time one ``train()`` of sb3-contrib's TRPO, our TRPO and our NPG on identical rollout data, side by side.

    .venv/bin/python -m benchmarks.bench_update [--reps 15] [--configs CartPole-v1,Pendulum-v1]
        [--out benchmarks/results/bench_update.json]

For each configuration one rollout is collected once and shared by every model; every model starts each timed
``train()`` from the same parameters and optimizer state. Models are timed in alternation (A B C A B C ...) after a
warm-up, with one torch thread; the table reports the median milliseconds per update and the median of the
per-repetition ratios ours / sb3-contrib. Peak memory is the growth of the resident set size during one update,
measured in a forked child before any timing.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import multiprocessing
import platform
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import sb3_contrib
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.vec_env import VecNormalize

from sb3_npg import NPG, TRPO

MUJOCO = {"n_steps": 1024, "batch_size": 128, "cg_max_steps": 25, "n_critic_updates": 20}
#: name -> environment, number of envs, VecNormalize, hyperparameters (given unchanged to every model)
CONFIGS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"env_id": "CartPole-v1", "n_envs": 1, "normalize": False, "hyperparams": {}},
    "Pendulum-v1": {
        "env_id": "Pendulum-v1",
        "n_envs": 2,
        "normalize": False,
        "hyperparams": {"n_steps": 1024, "gamma": 0.9, "n_critic_updates": 15, "use_sde": True, "sde_sample_freq": 4},
    },
    "HalfCheetah-v5": {"env_id": "HalfCheetah-v5", "n_envs": 2, "normalize": True, "hyperparams": MUJOCO},
    "Humanoid-v5 (n_steps 8192)": {
        "env_id": "Humanoid-v5",
        "n_envs": 1,
        "normalize": True,
        "hyperparams": {**MUJOCO, "n_steps": 8192},
    },
}
WARMUP = 2
KIB_PER_PAGE = resource.getpagesize() // 1024


def _build(algo: type[OnPolicyAlgorithm], config: dict[str, Any], seed: int) -> OnPolicyAlgorithm:
    env = make_vec_env(config["env_id"], n_envs=config["n_envs"], seed=seed)
    if config["normalize"]:
        env = VecNormalize(env)
    model = algo("MlpPolicy", env, seed=seed, device="cpu", **config["hyperparams"])
    model.set_logger(configure(None, []))
    return model


def _fill(model: OnPolicyAlgorithm) -> None:
    _, callback = model._setup_learn(model.n_steps * model.n_envs)
    assert model.env is not None
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)


def _rss_kib() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * KIB_PER_PAGE


def _peak_growth_child(model: OnPolicyAlgorithm, queue: Any) -> None:
    before = _rss_kib()
    model.train()
    queue.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)


def _peak_memory_mib(model: OnPolicyAlgorithm) -> float:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_peak_growth_child, args=(model, queue))
    child.start()
    growth = queue.get()
    child.join()
    return max(growth, 0) / 1024


class _Contender:
    """A model and the state it is reset to before every timed update."""

    def __init__(self, name: str, model: OnPolicyAlgorithm):
        self.name, self.model = name, model
        self.policy_state = copy.deepcopy(model.policy.state_dict())
        self.optimizer_state = copy.deepcopy(model.policy.optimizer.state_dict())
        self.times: list[float] = []

    def timed_update(self) -> float:
        self.model.policy.load_state_dict(self.policy_state)
        self.model.policy.optimizer.load_state_dict(self.optimizer_state)
        start = time.perf_counter()
        self.model.train()
        return time.perf_counter() - start


def bench_config(name: str, config: dict[str, Any], reps: int, seed: int = 0) -> dict[str, Any]:
    """Time the three contenders on one shared rollout; return medians, ratios and peak memory."""
    contrib = _build(sb3_contrib.TRPO, config, seed)
    _fill(contrib)
    contenders = [_Contender("sb3_contrib.TRPO", contrib)]
    for algo in (TRPO, NPG):
        model = _build(algo, config, seed)
        model.rollout_buffer = contrib.rollout_buffer
        contenders.append(_Contender(f"sb3_npg.{algo.__name__}", model))
    memory = {c.name: _peak_memory_mib(c.model) for c in contenders}
    for _ in range(WARMUP):
        for contender in contenders:
            contender.timed_update()
    for _ in range(reps):
        for contender in contenders:
            contender.times.append(contender.timed_update())
    reference = contenders[0].times
    result: dict[str, Any] = {"config": name, "samples": contrib.n_steps * contrib.n_envs, "models": {}}
    for contender in contenders:
        ratios = [t / r for t, r in zip(contender.times, reference, strict=True)]
        result["models"][contender.name] = {
            "median_ms": 1000 * statistics.median(contender.times),
            "median_ratio": statistics.median(ratios),
            "peak_memory_mib": memory[contender.name],
        }
    return result


def markdown_table(results: list[dict[str, Any]]) -> str:
    """One row per configuration and model."""
    lines = [
        "| configuration | samples | model | ms / update (median) | ratio to sb3-contrib (median) | peak memory (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        for model, row in result["models"].items():
            lines.append(
                f"| {result['config']} | {result['samples']} | {model} | {row['median_ms']:.1f} | "
                f"{row['median_ratio']:.2f} | {row['peak_memory_mib']:.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names of CONFIGS")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    for name in args.configs.split(","):
        results.append(bench_config(name, CONFIGS[name], args.reps))
        print(markdown_table(results[-1:]), flush=True)
    table = markdown_table(results)
    print(f"\n{table}")
    if args.out is not None:
        meta = {"date": datetime.date.today().isoformat(), "machine": platform.platform(), "cpu": platform.processor()}
        meta["torch"] = torch.__version__
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
