"""Pieces the benchmark scripts share: their common command-line options and reading results back."""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sb3_npg.zoo import ZOO_ALGOS, hyperparams_path

#: The first line of a results file may describe the machine instead of holding a result.
META_KEY = "meta"


def configs_parser(description: str | None, configs: Iterable[str]) -> argparse.ArgumentParser:
    """The options of the per-configuration timing scripts: ``--configs``, ``--reps`` and ``--out``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(configs), help="comma-separated names of CONFIGS")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", type=Path)
    return parser


def read_jsonl(path: Path | None) -> list[dict[str, Any]]:
    """The results of a JSON-lines file (none when it does not exist), without its machine description."""
    if path is None or not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row for row in rows if META_KEY not in row]


#: The RL Zoo's published sb3-contrib TRPO results (mean return; GUIDE.md section 4), by environment. The MuJoCo
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
