"""Tuning candidates side by side: the final return of each seed under each candidate, and means over shared seeds.

    .venv/bin/python -m benchmarks.screen benchmarks/results/compare_candidates/mujoco_sb3_contrib_settings \\
        benchmarks/results/compare_candidates/mujoco_fast_settings

Each folder is the ``--out`` of one ``benchmarks.compare`` matrix (one candidate file, the tuning seeds). One row per
environment and seed: each candidate's final return with its best evaluation in brackets (``-`` where that run has
not finished); then per environment the mean final return of each candidate over the seeds that every candidate has
finished, so that a comparison is always over the same seeds; and each candidate's mean over all the seeds it has
finished. ``--seeds 100,101,...`` keeps only those seeds: a comparison made before seeds were added, repeated.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common import RUNS_FILE, read_jsonl

#: A seed's result under each candidate: (final return, best evaluation).
Result = tuple[float, float]


def results(folders: list[Path], seeds: set[int] | None = None) -> dict[str, dict[tuple[str, int], Result]]:
    """
    Candidate (folder name) -> (environment, seed) -> its run's final return and best evaluation.

    :param folders: the candidates' ``--out`` folders
    :param seeds: only these seeds (``None``: every seed), to repeat a comparison made before more seeds were added
    """
    table: dict[str, dict[tuple[str, int], Result]] = {}
    for folder in folders:
        runs: list[dict[str, Any]] = read_jsonl(folder / RUNS_FILE)
        table[folder.name] = {
            (run["env_id"], run["seed"]): (run["final_return"], max(value for _, value, _ in run["curve"]))
            for run in runs
            if seeds is None or run["seed"] in seeds
        }
    return table


def _cell(result: Result | None) -> str:
    return "-" if result is None else f"{result[0]:.1f} ({result[1]:.1f})"


def seeds_table(table: dict[str, dict[tuple[str, int], Result]]) -> str:
    """One row per environment and seed, one column per candidate."""
    names = list(table)
    cells = sorted({cell for runs in table.values() for cell in runs})
    lines = ["| environment | seed | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for env_id, seed in cells:
        shown = [_cell(table[name].get((env_id, seed))) for name in names]
        lines.append(f"| {env_id} | {seed} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def shared_means_table(table: dict[str, dict[tuple[str, int], Result]]) -> str:
    """Per environment, each candidate's mean final return over the seeds every candidate has finished."""
    names = list(table)
    lines = ["| environment | shared seeds | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for env_id in sorted({env for runs in table.values() for env, _ in runs}):
        seeds = sorted(set.intersection(*({seed for env, seed in table[name] if env == env_id} for name in names)))
        if seeds:
            means = [statistics.mean(table[name][(env_id, seed)][0] for seed in seeds) for name in names]
            lines.append(f"| {env_id} | {', '.join(map(str, seeds))} | " + " | ".join(f"{mean:.1f}" for mean in means) + " |")
    return "\n".join(lines)


def own_means_table(table: dict[str, dict[tuple[str, int], Result]]) -> str:
    """Per environment, each candidate's mean final return over all the seeds it has finished (how many in brackets):
    what a shipped entry's comment quotes, where the candidates did not all run the same seeds."""
    names = list(table)
    lines = ["| environment | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for env_id in sorted({env for runs in table.values() for env, _ in runs}):
        cells = []
        for name in names:
            finals = [final for (env, _), (final, _) in table[name].items() if env == env_id]
            cells.append(f"{statistics.mean(finals):.1f} ({len(finals)})" if finals else "-")
        lines.append(f"| {env_id} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="the --out folders of the candidates' matrices")
    parser.add_argument("--seeds", help="only these seeds, comma-separated (as benchmarks.compare takes them)")
    args = parser.parse_args()
    table = results(args.folders, None if args.seeds is None else {int(seed) for seed in args.seeds.split(",")})
    print("Final return (best evaluation) per seed\n")
    print(seeds_table(table))
    print("\nMean final return over the seeds every candidate has finished\n")
    print(shared_means_table(table))
    print("\nMean final return over each candidate's own finished seeds (how many)\n")
    print(own_means_table(table))


if __name__ == "__main__":
    main()
