"""Tables and learning curves of a comparison matrix written by ``benchmarks.compare``.

    .venv/bin/python -m benchmarks.report benchmarks/results/compare

Writes ``DIR/results.md``: the final return (the last evaluation) as mean +- std over seeds, one row per environment
and one column per algorithm, the best mean of each row in bold and the RL Zoo's published sb3-contrib TRPO result
(the RL Zoo's benchmark table) in its own column; the same as interquartile means with 95% bootstrap confidence
intervals, and across each group of tasks the IQM of normalized scores (``benchmarks/reliable.py``, with ``rliable``);
the MuJoCo goals, met or not (:func:`goals_table`, and ACKTR's, :func:`acktr_goals_table`); then the cost of each run
(wall time, steps per second, share of time in ``train()``) and each seed's result. Writes
``DIR/<env id>.png``: the evaluation curves, IQM over seeds with a 95% confidence band, one line per algorithm;
``DIR/curves_<group>.png``: the curves of each group of tasks (``reliable.TASK_GROUPS``) side by side; and
``DIR/profile_<group>.png``: the performance profile of each group of tasks that every algorithm shown ran.

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

from benchmarks import reliable
from benchmarks.common import (
    PUBLISHED_NOTES,
    PUBLISHED_TRPO,
    RESULT_PACKAGES,
    RUNS_FILE,
    hyperparams_entry,
    read_jsonl,
    result_package_versions,
)
from benchmarks.random_scores import read_random_scores
from sb3_npg.zoo import hyperparams_path

RESULTS_FILE = "results.md"
#: The order of the columns; algorithms not listed follow in name order.
ALGO_ORDER = ("npg", "npg_trpo", "acktr", "trpo", "ppo", "a2c")
BAND_ALPHA = 0.2
#: Cycled over the algorithms, so that identical curves (NPG and TRPO when every full step is accepted) stay visible.
LINE_STYLES = ("-", "--", "-.", ":")
FIGURE_SIZE = (6.4, 4.0)
FIGURE_DPI = 100
#: Panels per row of a group's figure of curves.
GRID_COLUMNS = 2


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
    lines = ["| environment | " + " | ".join(algos) + " |", "|---|" + "---|" * len(algos)]
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
            lines.append(f"| {group} ({', '.join(tasks)}) | {algo} | {len(scores[algo])} | {interval.point:.2f} "
                         f"[{interval.low:.2f}, {interval.high:.2f}] |")  # fmt: skip
    return "\n".join(lines)


#: HalfCheetah's goal: a bar above the RL Zoo's published 1785, which our runs and sb3-contrib's already pass.
HALFCHEETAH_GOAL = 4500.0
#: The MuJoCo goals: the mean final return our TRPO must reach per task, the RL Zoo's published TRPO result
#: (``PUBLISHED_TRPO``, measured on v3) but on HalfCheetah.
MEAN_GOALS = {task: PUBLISHED_TRPO[task] for task in reliable.TASK_GROUPS["MuJoCo"]} | {"HalfCheetah-v5": HALFCHEETAH_GOAL}
#: The algorithm held to every goal, the one held to the IQM goal on most tasks, and the one both are measured against.
GOAL_ALGO, SECOND_ALGO, REFERENCE_ALGO = "npg_trpo", "npg", "trpo"
#: On how many of the goal tasks ``SECOND_ALGO`` must reach ``REFERENCE_ALGO``'s IQM.
SECOND_ALGO_TASKS = 3
#: sb3-contrib's TRPO settings from the RL Zoo, translated to our KL: what a goal met with other settings is marked against.
SB3_CONTRIB_SETTINGS = hyperparams_path(GOAL_ALGO, sb3_contrib_settings=True)
#: Settings that only record the run, not how it learns: left out when a run's settings are compared with sb3-contrib's.
BOOKKEEPING_SETTINGS = ("n_timesteps",)


def _iqm(runs: list[dict[str, Any]]) -> float:
    return reliable.iqm([run["final_return"] for run in runs])


def collapsed_seeds(runs: list[dict[str, Any]]) -> list[int]:
    """The seeds whose final return is below their first evaluation (the goal: none collapses below its start)."""
    return [run["seed"] for run in runs if run["curve"] and run["final_return"] < run["curve"][0][1]]


def goal_reach(runs: list[dict[str, Any]], every_run: list[dict[str, Any]], goal: float) -> str:
    """How many final returns of ``runs`` reach ``goal``, against those of ``every_run`` (every algorithm on the task)
    and the best of them: how far a mean goal is from what any seed reached."""
    reaching = sum(run["final_return"] >= goal for run in runs)
    best = max(run["final_return"] for run in every_run)
    reaching_any = sum(run["final_return"] >= goal for run in every_run)
    return f"{reaching} / {len(runs)}; any algorithm: {reaching_any} / {len(every_run)}, best {best:.1f}"


def settings_changes(run: dict[str, Any], reference: Path) -> list[str]:
    """The settings of ``run`` that differ from the entry of its environment in ``reference`` (sorted names)."""
    entry = hyperparams_entry(reference, run["env_id"])
    settings = run.get("hyperparams") or {}
    names = (set(entry) | set(settings)) - set(BOOKKEEPING_SETTINGS)
    return sorted(name for name in names if entry.get(name) != settings.get(name))


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


def goals_table(runs: list[dict[str, Any]], reference: Path = SB3_CONTRIB_SETTINGS) -> str:
    """
    Per MuJoCo goal task with runs of :data:`GOAL_ALGO` and :data:`REFERENCE_ALGO`: its IQM against the reference's,
    its mean against :data:`MEAN_GOALS`, how many of its final returns (and of every algorithm's) reach that goal,
    the seeds that collapsed, the settings that differ from sb3-contrib's
    (``reference``, translated to our KL); :data:`SECOND_ALGO`'s IQM against the reference's, and on how many tasks.
    """
    groups = _by(runs, "env_id", "algo")
    lines = [
        f"| task | {GOAL_ALGO} IQM vs {REFERENCE_ALGO} IQM | {GOAL_ALGO} mean vs goal | {GOAL_ALGO} final returns at "
        f"or above the goal | seeds below their first evaluation | {GOAL_ALGO} settings vs sb3-contrib's | "
        f"{SECOND_ALGO} IQM vs {REFERENCE_ALGO} IQM |",
        "|---|---|---|---|---|---|---|",
    ]
    second_met = 0
    for env_id, goal in MEAN_GOALS.items():
        ours, theirs = groups.get((env_id, GOAL_ALGO)), groups.get((env_id, REFERENCE_ALGO))
        if not ours or not theirs:
            continue
        collapsed = ", ".join(str(seed) for seed in collapsed_seeds(ours)) or "none"
        changes = sorted({name for run in ours for name in settings_changes(run, reference)})
        settings = f"differ: {', '.join(changes)}" if changes else "the same"
        second_cell, second_reaches = (
            _iqm_cell(groups[(env_id, SECOND_ALGO)], theirs) if (env_id, SECOND_ALGO) in groups else ("-", False)
        )
        second_met += second_reaches
        lines.append(
            f"| {env_id} | {_iqm_cell(ours, theirs)[0]} | "
            f"{_verdict(statistics.mean(r['final_return'] for r in ours), goal)} | "
            f"{goal_reach(ours, [run for (env, _), group in groups.items() if env == env_id for run in group], goal)} | "
            f"{collapsed} | {settings} | "
            f"{second_cell} |"
        )
    lines.append(f"\n{SECOND_ALGO} reaches {REFERENCE_ALGO}'s IQM on {second_met} of the tasks above "
                 f"(goal: {SECOND_ALGO_TASKS} of {len(MEAN_GOALS)}).")  # fmt: skip
    return "\n".join(lines)


#: ACKTR's goals (issue 36): its IQM at or above each reference's IQM on at least that many of the MuJoCo goal tasks.
ACKTR_GOALS = {"trpo": 3, "a2c": len(MEAN_GOALS)}


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
    for env_id in MEAN_GOALS:
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
            f"\nacktr reaches {algo}'s IQM on {reached[algo]} of the tasks above (goal: {needed} of {len(MEAN_GOALS)})."
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
            axes.plot(taus, fractions[algo], style, label=f"{algo} ({len(scores[algo])} seeds)")
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
        axes.plot(steps, iqm, LINE_STYLES[index % len(LINE_STYLES)], label=f"{algo} ({len(rows)} seeds)")
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


def write_report(folder: Path) -> Path:
    """``results.md`` and one PNG per environment from ``folder/runs.jsonl``; returns the markdown file."""
    runs = current_runs(read_jsonl(folder / RUNS_FILE))
    if not runs:
        raise ValueError(f"no runs in {folder / RUNS_FILE}: run python -m benchmarks.compare --out {folder} first")
    for env_id, rows in _by(runs, "env_id").items():
        plot_env(env_id[0], rows, folder / f"{env_id[0]}.png")
    plot_group_curves(runs, folder)
    plot_profiles(runs, folder)
    report = folder / RESULTS_FILE
    report.write_text(
        "# Final return (last evaluation), mean +- std over seeds (number of seeds)\n\n"
        f"{returns_table(runs)}\n\n# Final return, IQM over seeds [95% stratified bootstrap CI] (seeds)\n\n"
        f"{iqm_table(runs)}\n\n# Across tasks: normalized final return (0: random policy, 1: RL Zoo TRPO published)\n\n"
        f"{aggregate_table(runs)}\n\n# MuJoCo goals\n\n{goals_table(runs)}\n\n"
        f"# ACKTR's goals\n\n{acktr_goals_table(runs)}\n\n"
        f"# Cost per run (means over seeds)\n\n{cost_table(runs)}\n\n"
        f"# Per seed (seed: final return; best evaluation in the same order)\n\n{seeds_table(runs)}\n\n"
        f"# Package versions the runs used\n\n{versions_table(runs)}\n",
        encoding="utf-8",
    )
    return report


def update_docs(paths: list[Path], folder: Path) -> None:
    """
    Replace the tables between ``<!-- compare:RETURNS -->`` / ``<!-- /compare:RETURNS -->`` (and the same for
    ``IQM``, ``AGGREGATE``, ``GOALS``, ``COST`` and ``SEEDS``) in each markdown file by the tables of ``folder``'s runs; a file
    without a marker pair is left as is.
    """
    runs = current_runs(read_jsonl(folder / RUNS_FILE))
    tables = {
        "RETURNS": returns_table(runs),
        "IQM": iqm_table(runs),
        "AGGREGATE": aggregate_table(runs),
        "GOALS": goals_table(runs),
        "ACKTR_GOALS": acktr_goals_table(runs),
        "COST": cost_table(runs),
        "SEEDS": seeds_table(runs),
    }
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
