"""
Masked natural gradients against sb3-contrib's ``MaskablePPO``, and what the mask is worth (issue 46).

    .venv/bin/python -m benchmarks.masking                 # the matrix (resumable), then the table
    .venv/bin/python -m benchmarks.masking --table         # the table of the runs already there

Each run trains one configuration on one of sb3-contrib's masked test environments (``InvalidActionEnvDiscrete``,
``...MultiDiscrete``, ``...MultiBinary``: an identity task, reward 1 for the action that names the state, with some
actions invalid in every state) with each class's defaults at ``N_STEPS`` steps per update, then evaluates
``EVAL_EPISODES`` deterministic episodes with the masks (sb3-contrib's ``evaluate_policy``, ``use_masking=True``;
the unmasked TRPO is evaluated without them, as it was trained). One process per run, one torch thread, two runs side
by side; each finished run is a line of ``OUT/runs.jsonl`` (a run already there is skipped). The table (``OUT/
results.md``): per task and configuration, each seed's return, the mean, and the interquartile mean with its 95%
stratified bootstrap interval (``benchmarks/reliable.py``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RUNS_FILE, machine_description, read_jsonl
from benchmarks.reliable import iqm_intervals

OUT = Path(__file__).parent / "results" / "masking"
SEEDS = (0, 1, 2, 3, 4)
#: Steps of every run, and per update (one environment).
TIMESTEPS = 10_000
N_STEPS = 512
EVAL_EPISODES = 10
#: Task -> the environment's constructor arguments (sb3-contrib's test settings: half or more of the actions invalid).
TASKS: dict[str, dict[str, Any]] = {
    "InvalidActionEnvDiscrete": {"dim": 20, "n_invalid_actions": 10},
    "InvalidActionEnvMultiDiscrete": {"dims": [10, 10], "n_invalid_actions": 10},
    "InvalidActionEnvMultiBinary": {"dims": 10, "n_invalid_actions": 5},
}
#: Configuration -> (class path, whether it masks).
CONFIGURATIONS: dict[str, tuple[str, bool]] = {
    "MaskablePPO": ("sb3_contrib:MaskablePPO", True),
    "MaskableTRPO": ("sb3_npg:MaskableTRPO", True),
    "MaskableNPG": ("sb3_npg:MaskableNPG", True),
    "MaskableACKTR": ("sb3_npg:MaskableACKTR", True),
    "TRPO (no mask)": ("sb3_npg:TRPO", False),
}


def _class(path: str) -> Any:
    module, name = path.split(":")
    return getattr(__import__(module, fromlist=[name]), name)


def run(job: tuple[str, str, int]) -> dict[str, Any]:
    """Train and evaluate one configuration on one task with one seed (in a fresh process)."""
    import torch
    from sb3_contrib.common import envs
    from sb3_contrib.common.maskable.evaluation import evaluate_policy

    torch.set_num_threads(1)
    configuration, task, seed = job
    path, masks = CONFIGURATIONS[configuration]
    make = getattr(envs, task)
    model = _class(path)("MlpPolicy", make(**TASKS[task]), n_steps=N_STEPS, seed=seed, device="cpu")
    start = time.perf_counter()
    model.learn(TIMESTEPS)
    seconds = time.perf_counter() - start
    mean, std = evaluate_policy(model, make(**TASKS[task]), n_eval_episodes=EVAL_EPISODES, use_masking=masks)
    return {
        "configuration": configuration,
        "task": task,
        "seed": seed,
        "timesteps": TIMESTEPS,
        "return": float(mean),
        "return_std": float(std),
        "train_seconds": seconds,
    }


def _key(row: dict[str, Any]) -> tuple[str, str, int]:
    return row["configuration"], row["task"], row["seed"]


def matrix(out: Path, workers: int) -> None:
    """Every run not yet in ``out/runs.jsonl``, ``workers`` at a time, each appended as it ends."""
    out.mkdir(parents=True, exist_ok=True)
    runs = out / RUNS_FILE
    done = {_key(row) for row in read_jsonl(runs)}
    jobs = [(c, t, s) for t in TASKS for c in CONFIGURATIONS for s in SEEDS if (c, t, s) not in done]
    if not runs.exists():
        runs.write_text(json.dumps({"meta": machine_description()}) + "\n", encoding="utf-8")
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for row in pool.imap_unordered(run, jobs):
            with runs.open("a", encoding="utf-8") as file:
                file.write(json.dumps(row) + "\n")


def table(out: Path) -> str:
    """The markdown table of the recorded runs."""
    rows = read_jsonl(out / RUNS_FILE)
    lines = [
        "| task | configuration | return per seed | mean | IQM [95% interval] | train s/run |",
        "|---|---|---|---|---|---|",
    ]
    for task in TASKS:
        for configuration in CONFIGURATIONS:
            runs = sorted(
                (row for row in rows if row["task"] == task and row["configuration"] == configuration),
                key=lambda row: row["seed"],
            )
            if not runs:
                continue
            returns = np.array([row["return"] for row in runs])
            interval = iqm_intervals({configuration: returns[:, None]})[configuration]
            seeds = " / ".join(f"{row['seed']}: {row['return']:.1f}" for row in runs)
            seconds = np.mean([row["train_seconds"] for row in runs])
            lines.append(
                f"| {task} | {configuration} | {seeds} | {returns.mean():.1f} | {interval.point:.1f} "
                f"[{interval.low:.1f}, {interval.high:.1f}] | {seconds:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--table", action="store_true", help="only write the table of the runs already there")
    arguments = parser.parse_args()
    if not arguments.table:
        matrix(arguments.out, arguments.workers)
    text = table(arguments.out)
    (arguments.out / "results.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
