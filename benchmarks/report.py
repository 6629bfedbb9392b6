"""Tables and learning curves of a comparison matrix written by ``benchmarks.compare``.

    .venv/bin/python -m benchmarks.report benchmarks/results/compare

Writes ``DIR/results.md``: the final return (the last evaluation) as mean +- std over seeds, one row per environment
and one column per algorithm, the best mean of each row in bold and the RL Zoo's published sb3-contrib TRPO result
(the RL Zoo's benchmark table) in its own column; then the cost of each run (wall time, steps per second, share of time in
``train()``). Writes ``DIR/<env id>.png``: the evaluation curves, mean over seeds with a +-1 std band, one line per
algorithm.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np

from benchmarks.common import PUBLISHED_NOTES, PUBLISHED_TRPO, RUNS_FILE, read_jsonl

RESULTS_FILE = "results.md"
#: The order of the columns; algorithms not listed follow in name order.
ALGO_ORDER = ("npg", "npg_trpo", "trpo", "ppo", "a2c")
BAND_ALPHA = 0.2
#: Cycled over the algorithms, so that identical curves (NPG and TRPO when every full step is accepted) stay visible.
LINE_STYLES = ("-", "--", "-.", ":")
FIGURE_SIZE = (6.4, 4.0)
FIGURE_DPI = 100


def _algos(runs: list[dict[str, Any]]) -> list[str]:
    names = {run["algo"] for run in runs}
    return [a for a in ALGO_ORDER if a in names] + sorted(names - set(ALGO_ORDER))


def _by(runs: list[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for run in sorted(runs, key=lambda r: r["seed"]):
        groups.setdefault(tuple(run[key] for key in keys), []).append(run)
    return groups


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _published(env_id: str) -> str:
    if env_id not in PUBLISHED_TRPO:
        return "-"
    note = PUBLISHED_NOTES.get(env_id)
    return f"{PUBLISHED_TRPO[env_id]:g}" + (f" ({note})" if note else "")


def returns_table(runs: list[dict[str, Any]]) -> str:
    """Final return, mean +- std over seeds (and how many), per environment and algorithm; the best mean in bold."""
    algos = _algos(runs)
    groups = _by(runs, "env_id", "algo")
    lines = [
        "| environment | budget | " + " | ".join(algos) + " | RL Zoo TRPO (published) |",
        "|---|---|" + "---|" * len(algos) + "---|",
    ]
    for env_id in sorted({run["env_id"] for run in runs}):
        stats = {a: _mean_std([r["final_return"] for r in groups[(env_id, a)]]) for a in algos if (env_id, a) in groups}
        best = max(mean for mean, _ in stats.values())
        cells = []
        for algo in algos:
            if algo not in stats:
                cells.append("-")
                continue
            mean, std = stats[algo]
            cell = f"{mean:.1f} +- {std:.1f} ({len(groups[(env_id, algo)])})"
            cells.append(f"**{cell}**" if mean == best else cell)
        budgets = sorted({run["timesteps"] for run in runs if run["env_id"] == env_id})
        budget = " / ".join(f"{b:,}" for b in budgets)
        lines.append(f"| {env_id} | {budget} | " + " | ".join(cells) + f" | {_published(env_id)} |")
    return "\n".join(lines)


def cost_table(runs: list[dict[str, Any]]) -> str:
    """Per environment and algorithm, means over seeds: wall time, steps per second and where the time went."""
    lines = [
        "| environment | algorithm | runs | wall time (s) | steps per second | collect_rollouts (s) | train() (s) | "
        "evaluation (s) | train() share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups = _by(runs, "env_id", "algo")
    for env_id in sorted({run["env_id"] for run in runs}):
        for algo in _algos(runs):
            rows = groups.get((env_id, algo))
            if not rows:
                continue
            collect = statistics.mean(r["time_collect_rollouts"] for r in rows)
            train = statistics.mean(r["time_train"] for r in rows)
            lines.append(
                f"| {env_id} | {algo} | {len(rows)} | {statistics.mean(r['wall_time'] for r in rows):.1f} | "
                f"{statistics.mean(r['steps_per_second'] for r in rows):,.0f} | {collect:.1f} | {train:.1f} | "
                f"{statistics.mean(r['time_evaluation'] for r in rows):.1f} | {train / (collect + train):.0%} |"
            )
    return "\n".join(lines)


def seeds_table(runs: list[dict[str, Any]]) -> str:
    """Per environment and algorithm, each seed's final return and best evaluation (the spread behind the means)."""
    lines = ["| environment | algorithm | final return per seed | best evaluation per seed |", "|---|---|---|---|"]
    groups = _by(runs, "env_id", "algo")
    for env_id in sorted({run["env_id"] for run in runs}):
        for algo in _algos(runs):
            rows = sorted(groups.get((env_id, algo), []), key=lambda row: row["seed"])
            if rows:
                finals = ", ".join(f"{row['seed']}: {row['final_return']:.1f}" for row in rows)
                bests = ", ".join(f"{max(value for _, value, _ in row['curve']):.1f}" for row in rows)
                lines.append(f"| {env_id} | {algo} | {finals} | {bests} |")
    return "\n".join(lines)


def mean_curve(rows: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Evaluation steps common to every seed, and the mean and std over seeds of the mean return there."""
    curves = [{step: value for step, value, _ in row["curve"]} for row in rows]
    steps = np.array(sorted(set.intersection(*(set(curve) for curve in curves))))
    values = np.array([[curve[step] for step in steps] for curve in curves])
    return steps, values.mean(axis=0), values.std(axis=0)


def plot_env(env_id: str, runs: list[dict[str, Any]], path: Path) -> None:
    """One figure: each algorithm's mean evaluation curve over seeds with a +-1 std band."""
    figure, axes = plt.subplots(figsize=FIGURE_SIZE, dpi=FIGURE_DPI)
    groups = _by(runs, "algo")
    for index, algo in enumerate(_algos(runs)):
        rows = groups[(algo,)]
        steps, mean, std = mean_curve(rows)
        axes.plot(steps, mean, LINE_STYLES[index % len(LINE_STYLES)], label=f"{algo} ({len(rows)} seeds)")
        axes.fill_between(steps, mean - std, mean + std, alpha=BAND_ALPHA)
    if env_id in PUBLISHED_TRPO:
        axes.axhline(PUBLISHED_TRPO[env_id], color="gray", linestyle="--", linewidth=1, label="RL Zoo TRPO (published)")
    axes.set_title(env_id)
    axes.set_xlabel("environment steps")
    axes.set_ylabel("mean evaluation return (deterministic)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def write_report(folder: Path) -> Path:
    """``results.md`` and one PNG per environment from ``folder/runs.jsonl``; returns the markdown file."""
    runs = read_jsonl(folder / RUNS_FILE)
    if not runs:
        raise ValueError(f"no runs in {folder / RUNS_FILE}: run python -m benchmarks.compare --out {folder} first")
    for env_id, rows in _by(runs, "env_id").items():
        plot_env(env_id[0], rows, folder / f"{env_id[0]}.png")
    report = folder / RESULTS_FILE
    report.write_text(
        "# Final return (last evaluation), mean +- std over seeds (number of seeds)\n\n"
        f"{returns_table(runs)}\n\n# Cost per run (means over seeds)\n\n{cost_table(runs)}\n\n"
        f"# Per seed (seed: final return; best evaluation in the same order)\n\n{seeds_table(runs)}\n",
        encoding="utf-8",
    )
    return report


def update_docs(paths: list[Path], folder: Path) -> None:
    """
    Replace the tables between ``<!-- compare:RETURNS -->`` / ``<!-- /compare:RETURNS -->`` (and the same for
    ``COST`` and ``SEEDS``) in each markdown file by the tables of ``folder``'s runs; a file without a marker pair
    is left as is.
    """
    runs = read_jsonl(folder / RUNS_FILE)
    tables = {"RETURNS": returns_table(runs), "COST": cost_table(runs), "SEEDS": seeds_table(runs)}
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for name, table in tables.items():
            start, end = f"<!-- compare:{name} -->", f"<!-- /compare:{name} -->"
            if start in text and end in text:
                head, rest = text.split(start, 1)
                text = f"{head}{start}\n{table}\n{end}{rest.split(end, 1)[1]}"
        path.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the --out folder of benchmarks.compare")
    parser.add_argument(
        "--update-docs", nargs="*", type=Path, default=[], metavar="FILE", help="markdown files whose marked tables to refresh"
    )
    args = parser.parse_args()
    print(write_report(args.folder).read_text(encoding="utf-8"))
    update_docs(args.update_docs, args.folder)


if __name__ == "__main__":
    main()
