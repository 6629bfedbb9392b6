"""Verify the shipped RL Zoo hyperparameters: train with ``sb3-npg-zoo train`` and read the Zoo's own evaluation.

    .venv/bin/python -m benchmarks.zoo_verify --algos npg,npg_trpo,trpo --envs CartPole-v1,Acrobot-v1 --seeds 0,1,2 \\
        --workers 2 --out benchmarks/results/zoo_verify.jsonl
    .venv/bin/python -m benchmarks.zoo_verify --table benchmarks/results/zoo_verify.jsonl
    .venv/bin/python -m benchmarks.zoo_verify --candidates-table benchmarks/results/zoo_candidates/*.jsonl

Each run is a separate process running ``python -m sb3_npg.zoo train --algo A --env E --seed S`` with our shipped
hyperparameters (budget: the file's ``n_timesteps``) and the Zoo's evaluation callback (``--eval-freq
budget/EVALUATIONS --eval-episodes 10``, deterministic; the schedule of ``compare.py`` too, so one run's last
evaluation is the same in both). ``trpo``, in the default ``--algos``, is sb3-contrib's TRPO
with the RL Zoo's own file: the peer behind the published numbers, run in the same harness. The result of a run is
the mean return of its last evaluation; runs already in ``--out`` are skipped. The published reference is the RL
Zoo's sb3-contrib TRPO result at the same budget (the RL Zoo's benchmark table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.common import EVALUATIONS_PER_RUN, PUBLISHED_TRPO, default_hyperparams, read_jsonl

EVALUATIONS = EVALUATIONS_PER_RUN
#: Evaluations per run of the records written before both harnesses shared one schedule (they have no ``eval_freq``).
LEGACY_EVALUATIONS = 4
#: Hyperparameter files tried and not (or not yet) shipped; their runs are ``results/zoo_candidates/<name>.jsonl``.
CANDIDATES_DIR = Path(__file__).parent / "zoo_candidates"
EVAL_EPISODES = 10


def budget(algo: str, env_id: str, conf: Path | None = None) -> int:
    """The ``n_timesteps`` of the environment's entry in ``conf`` (default: the file ``train`` reads)."""
    entries = yaml.safe_load((conf or default_hyperparams(algo)).read_text(encoding="utf-8"))
    return int(float((entries[env_id] if env_id in entries else entries["default"])["n_timesteps"]))


def run(algo: str, env_id: str, seed: int, conf: Path | None = None) -> dict[str, Any]:
    """Train one seed in a fresh process (with the hyperparameters of ``conf``, default ours) and return the Zoo's
    last evaluation."""
    steps = budget(algo, env_id, conf)
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "sb3_npg.zoo", "train", "--algo", algo, "--env", env_id, "--seed", str(seed)]
        command += ["-f", folder, "--eval-freq", str(steps // EVALUATIONS), "--eval-episodes", str(EVAL_EPISODES)]
        command += ["--num-threads", "1", "--log-interval", "-2", *(["-conf", str(conf)] if conf else [])]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        evaluations = np.load(next(Path(folder).glob(f"{algo}/{env_id}_*/evaluations.npz")))
    returns = evaluations["results"][-1]
    return {
        "algo": algo,
        "env_id": env_id,
        "seed": seed,
        "budget": steps,
        "eval_freq": steps // EVALUATIONS,
        "evaluated_at": int(evaluations["timesteps"][-1]),
        "final_return_mean": float(np.mean(returns)),
        "final_return_std": float(np.std(returns)),
    }


def evaluation_freq(record: dict[str, Any]) -> int:
    """Steps between the evaluations of a recorded run (records without the field: every budget/4 steps)."""
    return int(record.get("eval_freq", record["budget"] // LEGACY_EVALUATIONS))


def latest_runs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (algorithm, environment, seed): the last one written (a re-run supersedes the older schedule)."""
    return list({(r["algo"], r["env_id"], r["seed"]): r for r in results}.values())


def _groups(results: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The latest runs grouped by (algorithm, environment), each group in seed order."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in sorted(latest_runs(results), key=lambda r: r["seed"]):
        groups.setdefault((row["algo"], row["env_id"]), []).append(row)
    return groups


def _cells(env_id: str, rows: list[dict[str, Any]]) -> str:
    """The per-seed returns, their mean, the published reference and whether the mean reaches it."""
    mean = statistics.mean(r["final_return_mean"] for r in rows)
    published = PUBLISHED_TRPO.get(env_id)
    reached = "-" if published is None else ("yes" if mean >= published else "no")
    per_seed = " / ".join(f"{r['final_return_mean']:.1f}" for r in rows)
    reference = "-" if published is None else f"{published:g}"
    return f"{per_seed} | {mean:.1f} | {reference} | {reached} |"


def markdown_table(results: list[dict[str, Any]]) -> str:
    """Per algorithm and environment: the last evaluation of each seed, their mean, and the published reference."""
    lines = [
        "| algorithm | environment | budget | evaluations | last evaluation per seed | mean | RL Zoo TRPO (published) "
        "| reached |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (algo, env_id), rows in sorted(_groups(results).items()):
        schedules = "/".join(sorted({str(row["budget"] // evaluation_freq(row)) for row in rows}))
        lines.append(f"| {algo} | {env_id} | {rows[0]['budget']:,} | {schedules} | {_cells(env_id, rows)}")
    return "\n".join(lines)


def candidates_table(files: list[Path], candidates_dir: Path = CANDIDATES_DIR) -> str:
    """One row per results file and algorithm, as in :func:`markdown_table`, with the candidate's name and what it
    changes (the first comment line of ``candidates_dir/<name>.yml``, after the colon)."""
    lines = [
        "| candidate | what it changes | algorithm | environment | last evaluation per seed | mean | RL Zoo TRPO "
        "(published) | reached |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for results_file in sorted(files):
        candidate = candidates_dir / f"{results_file.stem}.yml"
        first_line = candidate.read_text(encoding="utf-8").splitlines()[0] if candidate.exists() else ""
        change = first_line.lstrip("# ").split(": ", 1)[-1]
        for (algo, env_id), rows in sorted(_groups(read_jsonl(results_file)).items()):
            lines.append(f"| `{results_file.stem}` | {change} | {algo} | {env_id} | {_cells(env_id, rows)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="npg,npg_trpo,trpo")
    parser.add_argument("--envs", default="CartPole-v1,Acrobot-v1,Pendulum-v1,MountainCarContinuous-v0,LunarLander-v3")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel (one process each)")
    parser.add_argument("--conf", type=Path, help="a hyperparameter file to try instead of the shipped one")
    parser.add_argument("--out", type=Path, help="JSON lines, appended run by run (and read back to resume)")
    parser.add_argument("--table", type=Path, help="only print the table of an existing results file")
    parser.add_argument(
        "--candidates-table", type=Path, nargs="+", help="only print one table of the results files of several candidates"
    )
    args = parser.parse_args()
    if args.table is not None:
        print(markdown_table(read_jsonl(args.table)))
        return
    if args.candidates_table is not None:
        print(candidates_table(args.candidates_table))
        return
    results = read_jsonl(args.out)
    done = {(r["algo"], r["env_id"], r["seed"]) for r in results if evaluation_freq(r) == r["budget"] // EVALUATIONS}
    jobs = [
        (algo, env_id, int(seed))
        for seed in args.seeds.split(",")
        for env_id in args.envs.split(",")
        for algo in args.algos.split(",")
        if (algo, env_id, int(seed)) not in done
    ]
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        for result in pool.map(lambda job: run(job[0], job[1], job[2], args.conf), jobs):
            results.append(result)
            print(json.dumps(result), flush=True)
            if args.out is not None:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                with args.out.open("a", encoding="utf-8") as stream:
                    stream.write(json.dumps(result) + "\n")
    print(markdown_table(results))


if __name__ == "__main__":
    main()
