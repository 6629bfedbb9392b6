"""Pieces the benchmark scripts share: configurations, building a model and filling its rollout, results files,
command-line options, the published results we compare with, and portable paths."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import inspect
import json
import platform
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
import yaml
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.vec_env import VecNormalize

from sb3_npg.common.kl_convention import kl_components
from sb3_npg import TRPO
from sb3_npg.zoo import ZOO_ALGOS, hyperparams_path

#: The first line of a results file may describe the machine instead of holding a result.
META_KEY = "meta"
#: The results file of a comparison matrix, in its output folder (one finished run per line).
RUNS_FILE = "runs.jsonl"
#: Evaluations per run in both Zoo harnesses (``compare.py``, ``zoo_verify.py``): every budget/10 steps. The Zoo's
#: evaluation environment is seeded once and runs on, so which 10 episodes the last evaluation sees depends on how many
#: came before; with one schedule, a run gets the same final return in both tables (``benchmarks/eval_schedule.py``).
EVALUATIONS_PER_RUN = 10
#: Untimed rounds before the timed ones of the per-update timing scripts.
TIMING_WARMUP_ROUNDS = 2
#: The repository's root: results record paths relative to it.
REPOSITORY = Path(__file__).resolve().parent.parent
#: Where installed packages live: results record their files relative to it (``rl_zoo3/hyperparams/ppo.yml``).
SITE_PACKAGES = "site-packages"
#: Marks the contenders given sb3-contrib's KL scale (see :func:`contrib_kl_scale`).
CONTRIB_KL = "contrib_kl"

#: The RL Zoo's MuJoCo settings of sb3-contrib's TRPO (``n_envs`` 2 and ``VecNormalize`` in each configuration).
MUJOCO = {"n_steps": 1024, "batch_size": 128, "cg_max_steps": 25, "n_critic_updates": 20}
#: The configurations of the per-update timing scripts (bench_update, bench_fisher): name -> environment, number of
#: envs, VecNormalize, hyperparameters (given unchanged to every model).
UPDATE_CONFIGS: dict[str, dict[str, Any]] = {
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

#: Settings per environment (the RL Zoo's tuned sb3-contrib TRPO settings, shared by NPG and TRPO), the step
#: budget, and the mean evaluation return that counts as "learned".
LEARNING_CONFIGS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {
        "n_envs": 2,
        "budget": 100_000,
        "threshold": 475.0,
        "eval_freq": 8192,
        "hyperparams": {
            "n_steps": 512,
            "batch_size": 512,
            "cg_damping": 1e-3,
            "gae_lambda": 0.98,
            "gamma": 0.99,
            "learning_rate": 1e-3,
            "n_critic_updates": 20,
        },
    },
    "Pendulum-v1": {
        "n_envs": 2,
        "budget": 100_000,
        "threshold": -250.0,
        "eval_freq": 8192,
        "hyperparams": {
            "n_steps": 1024,
            "gamma": 0.9,
            "n_critic_updates": 15,
            "use_sde": True,
            "sde_sample_freq": 4,
        },
    },
}
#: Deterministic evaluation episodes of the learning checks.
N_EVAL_EPISODES = 10


def configs_parser(description: str | None, configs: Iterable[str]) -> argparse.ArgumentParser:
    """The options of the per-configuration timing scripts: ``--configs``, ``--reps`` and ``--out``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(configs), help="comma-separated names of CONFIGS")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", type=Path)
    return parser


def run_configs(
    args: argparse.Namespace,
    configs: Mapping[str, Any],
    bench_config: Callable[[str, Any, int], dict[str, Any]],
    markdown_table: Callable[[list[dict[str, Any]]], str],
) -> None:
    """
    The loop of the per-configuration timing scripts: one torch thread, each configuration of ``--configs`` timed
    and its row printed as it lands, then the whole table, and the results written to ``--out`` when given.
    """
    torch.set_num_threads(1)
    results = []
    for name in args.configs.split(","):
        results.append(bench_config(name, configs[name], args.reps))
        print(markdown_table(results[-1:]), flush=True)
    print(f"\n{markdown_table(results)}")
    if args.out is not None:
        write_results(args.out, results)


def read_jsonl(path: Path | None) -> list[dict[str, Any]]:
    """The results of a JSON-lines file (none when it does not exist), without its machine description."""
    if path is None or not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row for row in rows if META_KEY not in row]


#: The RL Zoo's published sb3-contrib TRPO results (mean return; rl_zoo3's benchmark table), by environment. The MuJoCo
#: numbers were measured on v3 and are quoted for our v5 runs: comparable, not equal (see :data:`PUBLISHED_NOTES`).
PUBLISHED_TRPO = {
    "CartPole-v1": 500.0,
    "Acrobot-v1": -83.1,
    "Pendulum-v1": -175.0,
    "MountainCar-v0": -107.0,
    "MountainCarContinuous-v0": 92.5,
    "LunarLander-v3": 133.0,
    "LunarLanderContinuous-v3": 262.0,
    "BipedalWalker-v3": 182.0,
    "Hopper-v5": 3618.0,
    "Walker2d-v5": 4933.0,
    "HalfCheetah-v5": 1785.0,
    "Ant-v5": 4982.0,
    "Swimmer-v5": 366.0,
}
#: Where a published number was measured on another version of the environment than ours.
PUBLISHED_NOTES = {env_id: "v3" for env_id in ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5", "Swimmer-v5")}


def default_hyperparams(algo: str) -> Path:
    """The file ``train`` reads without ``-conf``: ours for our names, the installed RL Zoo's for the others (so
    sb3-contrib's ``trpo`` runs with the settings behind its published results, in the same harness)."""
    if algo in ZOO_ALGOS:
        return hyperparams_path(algo)
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or spec.origin is None:
        raise ValueError(f"the RL Zoo's hyperparameters for {algo!r} need rl_zoo3 installed (the zoo extra)")
    return Path(spec.origin).parent / "hyperparams" / f"{algo}.yml"


#: The YAML anchor of the RL Zoo's MuJoCo settings (``Ant-v4: &mujoco-defaults`` in its ``trpo.yml`` and ``ppo.yml``):
#: the settings the Zoo means for a MuJoCo task it has no entry for.
MUJOCO_DEFAULTS_ANCHOR = re.compile(r"^([\w.-]+):\s*&mujoco-defaults\b", re.MULTILINE)


def hyperparams_entry(conf: Path, env_id: str) -> dict[str, Any]:
    """
    The entry of ``env_id`` in a Zoo hyperparameter file: a ``-v5`` id falls back to its ``-v4`` entry, and a MuJoCo
    task the file does not list to the entry that defines the file's ``&mujoco-defaults`` anchor (the RL Zoo's files
    have one; its n_timesteps is the task's budget only when ``--timesteps`` is not given), or, in a file without that
    anchor (ours), to its ``default`` entry, as ``rl_zoo3`` itself does for a task without an entry.

    :raises ValueError: when the file has no entry for the environment
    """
    text = conf.read_text(encoding="utf-8")
    entries = yaml.safe_load(text)
    candidates = [env_id, env_id.replace("-v5", "-v4")]
    anchor = MUJOCO_DEFAULTS_ANCHOR.search(text)
    if is_mujoco(env_id):
        candidates.append("default" if anchor is None else anchor.group(1))
    for candidate in candidates:
        if candidate in entries:
            return dict(entries[candidate])
    raise ValueError(f"{conf} has no hyperparameters for {env_id}: give the algorithm a file with --conf ALGO=FILE")


def is_mujoco(env_id: str) -> bool:
    """Whether Gymnasium registers ``env_id`` as one of its MuJoCo tasks (by its entry point; nothing is imported)."""
    spec = gym.registry.get(env_id)
    return spec is not None and "mujoco" in str(spec.entry_point)


def contrib_kl_scale(hyperparams: dict[str, Any], action_dims: int) -> dict[str, Any]:
    """
    Our options that pose sb3-contrib's problem on a Box of ``action_dims`` dimensions.

    sb3-contrib's KL is our (summed) KL divided by the number of action dimensions ``d``: its Fisher is ``F / d``,
    so with the same ``cg_damping`` it solves a better-conditioned system (fewer CG iterations) and its ``target_kl``
    is ``d`` times looser. Multiplying ``cg_damping`` and ``target_kl`` by ``d`` gives our update the same CG
    iterations and the same step (up to the KL direction of the line search), i.e. the same work.
    """
    defaults = inspect.signature(TRPO.__init__).parameters
    scaled = dict(hyperparams)
    for name in ("cg_damping", "target_kl"):
        scaled[name] = action_dims * hyperparams.get(name, defaults[name].default)
    return scaled


def build_model(algo: type[OnPolicyAlgorithm], config: dict[str, Any], seed: int, **extra: Any) -> OnPolicyAlgorithm:
    """A model of one of :data:`UPDATE_CONFIGS` on fresh seeded environments, logging nothing (``extra`` adds options;
    ``CONTRIB_KL=True`` poses sb3-contrib's KL scale, :func:`contrib_kl_scale`)."""
    env = make_vec_env(config["env_id"], n_envs=config["n_envs"], seed=seed)
    if config["normalize"]:
        env = VecNormalize(env)
    if extra.pop(CONTRIB_KL, False):
        config = {**config, "hyperparams": contrib_kl_scale(config["hyperparams"], kl_components(env.action_space))}
    model = algo("MlpPolicy", env, seed=seed, device="cpu", **{**config["hyperparams"], **extra})
    model.set_logger(configure(None, []))
    return model


def fill_rollout(model: OnPolicyAlgorithm) -> None:
    """Collect one rollout into the model's buffer, ready for ``train()`` (what ``learn()`` does before an update)."""
    _, callback = model._setup_learn(model.n_steps * model.n_envs)
    if model.env is None:
        raise ValueError("the model has no environment to collect a rollout from")
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)


def machine_description() -> dict[str, str]:
    """The date, platform, CPU model and torch version, to store beside every result."""
    cpu = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        cpu = f"{len(names)} x {names[0]}" if names else cpu
    return {
        "date": datetime.date.today().isoformat(),
        "machine": platform.platform(),
        "cpu": cpu,
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
    }


def write_results(path: Path, results: list[dict[str, Any]]) -> None:
    """Write results as JSON beside a description of the machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": machine_description(), "results": results}, indent=2), encoding="utf-8")


def free_port() -> int:
    """A TCP port free on the loopback interface now (for a gloo rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def portable_path(path: str | Path) -> str:
    """
    ``path`` as a results file records it: relative to the repository, or for a file of an installed package
    relative to ``site-packages`` (``rl_zoo3/hyperparams/ppo.yml``); any other file by its name alone. Never a path
    of the machine that ran it.
    """
    resolved = Path(path).resolve()
    if resolved.is_relative_to(REPOSITORY) and SITE_PACKAGES not in resolved.parts:
        return resolved.relative_to(REPOSITORY).as_posix()
    if SITE_PACKAGES in resolved.parts:
        parts = resolved.parts
        return Path(*parts[len(parts) - parts[::-1].index(SITE_PACKAGES) :]).as_posix()
    return resolved.name


#: The packages whose version can change a run's numbers. A matrix spans sessions and fresh environments, so the
#: harness warns when the installed versions differ from its folder's runs, and the report lists the versions it mixes.
RESULT_PACKAGES = ("sb3-npg", "stable-baselines3", "sb3-contrib", "rl-zoo3", "torch", "gymnasium", "mujoco", "numpy")


def _normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares names (``stable_baselines3`` and ``stable-baselines3`` are one)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def result_package_versions(versions: Mapping[str, str]) -> dict[str, str]:
    """The versions of :data:`RESULT_PACKAGES` among ``versions`` (all installed distributions), by normalized name."""
    by_name = {_normalized(name): version for name, version in versions.items()}
    return {name: by_name[name] for name in RESULT_PACKAGES if name in by_name}
