"""Tables and learning curves of a comparison matrix written by ``benchmarks.compare``.

    .venv/bin/python -m benchmarks.report benchmarks/results/compare

Writes ``DIR/results.md``: per task, each contender's IQM and which settings our TRPO ran (``benchmarks/suite.py``,
contenders named as a reader names them), the MuJoCo suite's goals (our TRPO against sb3-contrib's, intervals and
verdicts, collapses, published results) and the default entry's; the final return as mean +- std over seeds, with
the RL Zoo's published sb3-contrib TRPO result; the same as interquartile means with 95% bootstrap confidence
intervals, and across each group of tasks the IQM of normalized scores (``benchmarks/reliable.py``, with ``rliable``);
ACKTR's goals (:func:`acktr_goals_table`); then the cost of each run (wall time, steps per second, share of time in
``train()``) and each seed's result. Writes ``DIR/<env id>.png``: the evaluation curves, IQM over seeds with a 95%
confidence band, one line per algorithm; ``DIR/curves_<group>.png``: the curves of each group of tasks
(``reliable.TASK_GROUPS``) side by side; ``DIR/profile_<group>.png``: the performance profile of each group of tasks
that every algorithm shown ran; and ``DIR/normalized_MuJoCo.png``: every MuJoCo suite task's normalized IQMs.

Only the runs of each cell's latest protocol are reported (budget, evaluation schedule and settings of the last run
recorded for that algorithm and environment): runs of a superseded file or schedule stay in ``runs.jsonl`` as history.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np

from benchmarks import reliable, suite
from benchmarks.common import (
    PUBLISHED_NOTES,
    PUBLISHED_TRPO,
    RESULT_PACKAGES,
    RUNS_FILE,
    read_jsonl,
    result_package_versions,
)
from benchmarks.random_scores import read_random_scores
from benchmarks.suite import label

RESULTS_FILE = "results.md"
#: The figure of every MuJoCo suite task's normalized scores (the README's).
NORMALIZED_FIGURE = "normalized_MuJoCo.png"
BAND_ALPHA = 0.2
#: Cycled over the algorithms, so that identical curves (NPG and TRPO when every full step is accepted) stay visible.
LINE_STYLES = ("-", "--", "-.", ":")
FIGURE_SIZE = (6.4, 4.0)
FIGURE_DPI = 100
#: Panels per row of a group's figure of curves.
GRID_COLUMNS = 2


def _algos(runs: list[dict[str, Any]]) -> list[str]:
    return suite.contenders(runs)


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
        "| environment | budget | " + " | ".join(map(label, algos)) + " | RL Zoo TRPO (published) |",
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
                f"| {env_id} | {label(algo)} | {len(rows)} | {statistics.mean(r['wall_time'] for r in rows):.1f} | "
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
                lines.append(f"| {env_id} | {label(algo)} | {finals} | {bests} |")
    return "\n".join(lines)


def versions_table(runs: list[dict[str, Any]]) -> str:
    """The version of each package that can change a result, with its number of runs; a package the runs mix is marked."""
    counts: dict[str, dict[str, int]] = {name: {} for name in RESULT_PACKAGES}
    for run in runs:
        for name, version in result_package_versions(run.get("versions", {})).items():
            counts[name][version] = counts[name].get(version, 0) + 1
    lines = ["| package | version (runs) |", "|---|---|"]
    for name, versions in counts.items():
        if versions:
            cell = ", ".join(f"{version} ({count})" for version, count in sorted(versions.items()))
            lines.append(f"| {name} | {'**mixed**: ' if len(versions) > 1 else ''}{cell} |")
    return "\n".join(lines)


#: What a cell's runs share besides the seed: the budget, the evaluation schedule and the settings.
PROTOCOL_FIELDS = ("timesteps", "eval_freq", "eval_episodes")


def _protocol(run: dict[str, Any]) -> tuple[Any, ...]:
    return (*(run.get(field) for field in PROTOCOL_FIELDS), json.dumps(run.get("hyperparams"), sort_keys=True))


def current_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """
    Per algorithm and environment, the runs of the protocol recorded last (budget, evaluation schedule, settings):
    runs of a superseded file or schedule stay in ``runs.jsonl`` as history but leave the tables.
    """
    latest = {(run["algo"], run["env_id"]): _protocol(run) for run in runs}
    return [run for run in runs if _protocol(run) == latest[(run["algo"], run["env_id"])]]


def _interval(interval: reliable.Interval) -> str:
    return f"{interval.point:.1f} [{interval.low:.1f}, {interval.high:.1f}]"


def iqm_table(runs: list[dict[str, Any]]) -> str:
    """Final return: IQM over seeds with its 95% bootstrap confidence interval, per environment and algorithm."""
    algos = _algos(runs)
    groups = _by(runs, "env_id", "algo")
    lines = ["| environment | " + " | ".join(map(label, algos)) + " |", "|---|" + "---|" * len(algos)]
    for env_id in sorted({run["env_id"] for run in runs}):
        scores = {a: np.array([[r["final_return"]] for r in groups[(env_id, a)]]) for a in algos if (env_id, a) in groups}
        intervals = reliable.iqm_intervals(scores)
        cells = [f"{_interval(intervals[a])} ({len(scores[a])})" if a in intervals else "-" for a in algos]
        lines.append(f"| {env_id} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _group_scores(runs: list[dict[str, Any]], tasks: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Normalized final returns of the algorithms with runs on every task of ``tasks`` (none without the scales)."""
    random = read_random_scores()
    if not all(task in random and task in PUBLISHED_TRPO for task in tasks):
        return {}
    return reliable.group_scores(runs, tasks, random, PUBLISHED_TRPO)


def aggregate_table(runs: list[dict[str, Any]]) -> str:
    """Per group of tasks, the IQM of normalized final returns with its 95% confidence interval, per algorithm."""
    lines = ["| tasks | algorithm | seeds on every task | IQM of normalized final return [95% CI] |", "|---|---|---|---|"]
    for group, tasks in reliable.TASK_GROUPS.items():
        scores = _group_scores(runs, tasks)
        for algo, interval in reliable.iqm_intervals(scores).items() if scores else []:
            lines.append(f"| {group} ({', '.join(tasks)}) | {label(algo)} | {len(scores[algo])} | {interval.point:.2f} "
                         f"[{interval.low:.2f}, {interval.high:.2f}] |")  # fmt: skip
    return "\n".join(lines)


#: The algorithm ACKTR is held against besides its references, and the tasks of its goals (the tuned MuJoCo tasks).
GOAL_ALGO, ACKTR_TASKS = suite.OURS, suite.TUNED_TASKS


def _iqm(runs: list[dict[str, Any]]) -> float:
    return reliable.iqm([run["final_return"] for run in runs])


def _verdict(value: float, goal: float) -> str:
    return f"{value:.1f} {'>=' if value >= goal else '<'} {goal:.1f}: {'met' if value >= goal else 'not met'}"


def _schedule(runs: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """The budgets and evaluation schedules of ``runs``."""
    return {tuple(run.get(field) for field in PROTOCOL_FIELDS) for run in runs}


def _iqm_cell(runs: list[dict[str, Any]], reference: list[dict[str, Any]]) -> tuple[str, bool]:
    """The IQM of ``runs`` against the reference's, and whether it reaches it; runs with another budget or evaluation
    schedule than the reference's are not compared (a cell keeps its older runs until new ones land)."""
    if _schedule(runs) != _schedule(reference):
        every = ", ".join(f"{freq:,}" for freq in sorted({run.get("eval_freq") or 0 for run in runs}))
        return f"not compared: another schedule (an evaluation every {every} steps; {len(runs)} seeds)", False
    value, goal = _iqm(runs), _iqm(reference)
    return f"{_verdict(value, goal)} ({len(runs)} / {len(reference)} seeds)", value >= goal


#: ACKTR's goals (issue 36): its IQM at or above each reference's IQM on at least that many of the MuJoCo goal tasks.
ACKTR_GOALS = {"trpo": 3, "a2c": len(ACKTR_TASKS)}


def acktr_goals_table(runs: list[dict[str, Any]]) -> str:
    """Per MuJoCo goal task with ACKTR runs: its IQM against sb3-contrib's TRPO's, A2C's and our TRPO's, and on how many
    tasks it reaches each reference named by :data:`ACKTR_GOALS` (a reference with another schedule is not compared)."""
    groups = _by(runs, "env_id", "algo")
    references = [*ACKTR_GOALS, GOAL_ALGO]
    lines = [
        "| task | " + " | ".join(f"acktr IQM vs {algo} IQM" for algo in references) + " |",
        "|---|" + "---|" * len(references),
    ]
    reached = dict.fromkeys(ACKTR_GOALS, 0)
    for env_id in ACKTR_TASKS:
        ours = groups.get((env_id, "acktr"))
        if not ours:
            continue
        cells = []
        for algo in references:
            cell, reaches = _iqm_cell(ours, groups[(env_id, algo)]) if (env_id, algo) in groups else ("-", False)
            cells.append(cell)
            if algo in reached:
                reached[algo] += reaches
        lines.append(f"| {env_id} | " + " | ".join(cells) + " |")
    for algo, needed in ACKTR_GOALS.items():
        lines.append(
            f"\nacktr reaches {algo}'s IQM on {reached[algo]} of the tasks above (goal: {needed} of {len(ACKTR_TASKS)})."
        )
    return "\n".join(lines)


def plot_profiles(runs: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Per group of tasks with scores, its performance profile: the fraction of runs above each normalized score."""
    paths = []
    for group, tasks in reliable.TASK_GROUPS.items():
        scores = _group_scores(runs, tasks)
        if not scores:
            continue
        taus, fractions, bands = reliable.performance_profiles(scores)
        figure, axes = plt.subplots(figsize=FIGURE_SIZE, dpi=FIGURE_DPI)
        for index, algo in enumerate(scores):
            style = LINE_STYLES[index % len(LINE_STYLES)]
            axes.plot(taus, fractions[algo], style, label=f"{label(algo)} ({len(scores[algo])} seeds)")
            axes.fill_between(taus, bands[algo][0], bands[algo][1], alpha=BAND_ALPHA)
        axes.set_title(f"Performance profile, {group}")
        axes.set_xlabel("normalized final return tau (0: random policy, 1: RL Zoo TRPO published)")
        axes.set_ylabel("fraction of runs with score > tau")
        axes.legend()
        figure.tight_layout()
        paths.append(folder / f"profile_{group.replace(' ', '_')}.png")
        figure.savefig(paths[-1])
        plt.close(figure)
    return paths


def common_curves(rows: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Evaluation steps common to every seed, and each seed's mean evaluation return there (seeds x steps)."""
    curves = [{step: value for step, value, _ in row["curve"]} for row in rows]
    steps = np.array(sorted(set.intersection(*(set(curve) for curve in curves))))
    return steps, np.array([[curve[step] for step in steps] for curve in curves])


def _draw_env(axes: Any, env_id: str, runs: list[dict[str, Any]]) -> None:
    """Each algorithm's evaluation curve on ``env_id``, IQM over seeds with a 95% band, on ``axes``."""
    groups = _by(runs, "algo")
    for index, algo in enumerate(_algos(runs)):
        rows = groups[(algo,)]
        steps, curves = common_curves(rows)
        iqm, low, high = reliable.iqm_curve(curves)
        axes.plot(steps, iqm, LINE_STYLES[index % len(LINE_STYLES)], label=f"{label(algo)} ({len(rows)} seeds)")
        axes.fill_between(steps, low, high, alpha=BAND_ALPHA)
    if env_id in PUBLISHED_TRPO:
        axes.axhline(PUBLISHED_TRPO[env_id], color="gray", linestyle="--", linewidth=1, label="RL Zoo TRPO (published)")
    axes.set_title(env_id)
    axes.set_xlabel("environment steps")
    axes.set_ylabel("evaluation return, IQM over seeds, 95% CI")
    axes.legend()


def plot_env(env_id: str, runs: list[dict[str, Any]], path: Path) -> None:
    """One figure: each algorithm's evaluation curve over seeds, IQM with a 95% confidence band."""
    figure, axes = plt.subplots(figsize=FIGURE_SIZE, dpi=FIGURE_DPI)
    _draw_env(axes, env_id, runs)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def plot_group_curves(runs: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Per group of tasks with runs, one figure of the curves of all its tasks side by side (the README's)."""
    paths = []
    by_env = _by(runs, "env_id")
    for group, tasks in reliable.TASK_GROUPS.items():
        present = [task for task in tasks if (task,) in by_env]
        if not present:
            continue
        rows = -(-len(present) // GRID_COLUMNS)
        width, height = FIGURE_SIZE
        size = (width * GRID_COLUMNS, height * rows)
        figure, grid = plt.subplots(rows, GRID_COLUMNS, figsize=size, dpi=FIGURE_DPI, squeeze=False)
        panels = list(grid.flat)
        for axes, task in zip(panels[: len(present)], present, strict=True):
            _draw_env(axes, task, by_env[(task,)])
        for axes in panels[len(present) :]:
            axes.set_visible(False)
        figure.tight_layout()
        paths.append(folder / f"curves_{group.replace(' ', '_')}.png")
        figure.savefig(paths[-1])
        plt.close(figure)
    return paths


def report_tables(runs: list[dict[str, Any]], every_run: list[dict[str, Any]]) -> dict[str, str]:
    """Each table by its marker name: ``runs`` are each cell's current runs, ``every_run`` all of them (the default's
    runs stay the default's even where a task's cell has moved on to a tuned entry)."""
    return {
        "SUMMARY": suite.summary_table(runs),
        "SUITE": suite.suite_table(runs),
        "DEFAULT": suite.default_table(every_run),
        "TASK_COST": suite.task_cost_table(runs),
        "RETURNS": returns_table(runs),
        "IQM": iqm_table(runs),
        "AGGREGATE": aggregate_table(runs),
        "ACKTR_GOALS": acktr_goals_table(runs),
        "COST": cost_table(runs),
        "SEEDS": seeds_table(runs),
    }


#: The sections of ``results.md``: a title per table of :func:`report_tables`.
SECTIONS = {
    "SUMMARY": "Final return, IQM over seeds (seeds), and which settings our TRPO ran",
    "SUITE": "The MuJoCo suite: our TRPO against sb3-contrib's",
    "DEFAULT": "The default entry alone on the new tasks",
    "TASK_COST": "What a MuJoCo task costs: minutes per 1M-step run",
    "RETURNS": "Final return (last evaluation), mean +- std over seeds (number of seeds)",
    "IQM": "Final return, IQM over seeds [95% stratified bootstrap CI] (seeds)",
    "AGGREGATE": "Across tasks: normalized final return (0: random policy, 1: RL Zoo TRPO published)",
    "ACKTR_GOALS": "ACKTR's goals",
    "COST": "Cost per run (means over seeds)",
    "SEEDS": "Per seed (seed: final return; best evaluation in the same order)",
}


def write_report(folder: Path) -> Path:
    """``results.md`` and the figures from ``folder/runs.jsonl``; returns the markdown file."""
    every_run = read_jsonl(folder / RUNS_FILE)
    runs = current_runs(every_run)
    if not runs:
        raise ValueError(f"no runs in {folder / RUNS_FILE}: run python -m benchmarks.compare --out {folder} first")
    for env_id, rows in _by(runs, "env_id").items():
        plot_env(env_id[0], rows, folder / f"{env_id[0]}.png")
    plot_group_curves(runs, folder)
    plot_profiles(runs, folder)
    suite.plot_normalized(runs, folder / NORMALIZED_FIGURE)
    tables = report_tables(runs, every_run)
    sections = [f"# {title}\n\n{tables[name]}\n" for name, title in SECTIONS.items()]
    sections.append(f"# Package versions the runs used\n\n{versions_table(runs)}\n")
    report = folder / RESULTS_FILE
    report.write_text("\n".join(sections), encoding="utf-8")
    return report


def update_docs(paths: list[Path], folder: Path) -> None:
    """
    Replace the table between ``<!-- compare:NAME -->`` and ``<!-- /compare:NAME -->`` for each name of
    :func:`report_tables` in each markdown file by the table of ``folder``'s runs; a file without a marker pair is left
    as is.
    """
    every_run = read_jsonl(folder / RUNS_FILE)
    tables = report_tables(current_runs(every_run), every_run)
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for name, table in tables.items():
            start, end = f"<!-- compare:{name} -->", f"<!-- /compare:{name} -->"
            if start in text and end in text:
                head, rest = text.split(start, 1)
                text = f"{head}{start}\n{table}\n{end}{rest.split(end, 1)[1]}"
        path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the --out folder of benchmarks.compare")
    parser.add_argument(
        "--update-docs", nargs="*", type=Path, default=[], metavar="FILE", help="markdown files whose marked tables to refresh"
    )
    parser.add_argument(
        "--figures", type=Path, metavar="DIR", help="copy the figures there too (docs/_static: the README's and the docs')"
    )
    args = parser.parse_args(argv)
    print(write_report(args.folder).read_text(encoding="utf-8"))
    update_docs(args.update_docs, args.folder)
    if args.figures:
        for figure in args.folder.glob("*.png"):
            shutil.copy2(figure, args.figures / figure.name)


if __name__ == "__main__":
    main()
