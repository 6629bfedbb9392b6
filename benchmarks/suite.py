"""The MuJoCo suite's tables and figure, for ``benchmarks.report``: contenders named as a reader names them.

- :func:`summary_table`: the IQM of the final return per task and contender (the README's table);
- :func:`suite_table`: the suite's goals, task by task: our TRPO's IQM against sb3-contrib's with both 95% intervals
  ("ahead" only where the intervals are apart, else "tied"), the seeds that fell below their first evaluation, the
  published TRPO results statistic for statistic (the RL Zoo's single runs against our mean final return; Tianshou's
  maximum of the 10-seed mean curve against ours), and whether the task ran a tuned entry or the default;
- :func:`default_table`: the ``default`` entry alone (what a task without an entry gets) against sb3-contrib's TRPO;
- :func:`plot_normalized`: one figure over every suite task, each contender's IQM of normalized final return with its
  interval, 0 for a uniformly random policy and 1 for sb3-contrib's TRPO's IQM on the same task and budget.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np

from benchmarks import reliable
from benchmarks.common import PUBLISHED_NOTES, PUBLISHED_TRPO, hyperparams_entry
from benchmarks.random_scores import read_random_scores
from sb3_npg.zoo import hyperparams_path

#: Each contender as a reader names it, in the order of the tables' columns.
CONTENDERS = {
    "npg_trpo": "sb3-npg TRPO",
    "npg": "sb3-npg NPG",
    "acktr": "sb3-npg ACKTR",
    "trpo": "sb3-contrib TRPO",
    "ppo": "SB3 PPO",
    "a2c": "SB3 A2C",
}
#: Ours, and the TRPO it is measured against (run with the RL Zoo's settings for it).
OURS, REFERENCE = "npg_trpo", "trpo"
#: The tasks tuned on seeds 100+ (each has an entry of its own) and the tasks that run the ``default`` entry unchanged.
TUNED_TASKS = reliable.TASK_GROUPS["MuJoCo"]
NEW_TASKS = reliable.TASK_GROUPS["new MuJoCo tasks"]
SUITE = (*TUNED_TASKS, *NEW_TASKS)
#: On how many of :data:`NEW_TASKS` the default's IQM must be at or above sb3-contrib's.
DEFAULT_GOAL_TASKS = 4
#: The fewest seeds on each side for a verdict: one or two runs give an interval of no width.
MIN_SEEDS = 3
#: Tianshou's TRPO benchmark at 1M steps: the maximum over training of the mean evaluation curve of 10 seeds.
TIANSHOU_TRPO_MAX = {"Ant-v5": 2867.0, "Humanoid-v5": 810.0, "InvertedDoublePendulum-v5": 8435.0}
#: sb3-contrib's TRPO settings from the RL Zoo, translated to our KL: what "tuned" settings are told against.
SB3_CONTRIB_SETTINGS = hyperparams_path(OURS, sb3_contrib_settings=True)
#: Settings that only record the run, not how it learns.
BOOKKEEPING_SETTINGS = ("n_timesteps",)
FIGURE_DPI = 100
#: Height of a task's row in the figure, in inches, and the vertical spread of its contenders' points.
ROW_HEIGHT, ROW_SPREAD = 0.55, 0.6


def label(algo: str) -> str:
    """``algo`` as a reader names it (a name not in :data:`CONTENDERS` stays as it is)."""
    return CONTENDERS.get(algo, algo)


def contenders(runs: list[dict[str, Any]]) -> list[str]:
    """The algorithms of ``runs`` in the order of :data:`CONTENDERS`, others after them by name."""
    names = {run["algo"] for run in runs}
    return [algo for algo in CONTENDERS if algo in names] + sorted(names - set(CONTENDERS))


def cells(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """``(env_id, algo)`` -> its runs, by seed."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in sorted(runs, key=lambda r: r["seed"]):
        groups.setdefault((run["env_id"], run["algo"]), []).append(run)
    return groups


def iqm_interval(runs: list[dict[str, Any]]) -> reliable.Interval:
    """The IQM of the final returns of ``runs`` with its 95% bootstrap interval."""
    return reliable.iqm_intervals({"runs": np.array([[run["final_return"]] for run in runs])})["runs"]


def interval_text(interval: reliable.Interval, seeds: int) -> str:
    return f"{interval.point:.1f} [{interval.low:.1f}, {interval.high:.1f}] ({seeds})"


def verdict(ours: reliable.Interval, theirs: reliable.Interval, seeds: int = MIN_SEEDS) -> str:
    """
    The verdict: "ahead" or "behind" where the intervals are apart, else "tied", saying where the IQM falls; with fewer
    than :data:`MIN_SEEDS` seeds on either side (``seeds``: the fewer), only where the IQM falls.
    """
    if seeds < MIN_SEEDS:
        return f"{'at or above' if ours.point >= theirs.point else 'below'} (fewer than {MIN_SEEDS} seeds: no verdict)"
    if ours.low > theirs.high:
        return "ahead"
    if ours.high < theirs.low:
        return "behind"
    return "tied (at or above)" if ours.point >= theirs.point else "tied (below)"


def collapsed_seeds(runs: list[dict[str, Any]]) -> list[int]:
    """The seeds whose final return is below their first evaluation."""
    return [run["seed"] for run in runs if run["curve"] and run["final_return"] < run["curve"][0][1]]


def max_of_mean_curve(runs: list[dict[str, Any]]) -> float:
    """Tianshou's statistic: the mean over seeds at each evaluation common to every seed, then its maximum."""
    curves = [{step: value for step, value, _ in run["curve"]} for run in runs]
    steps = set.intersection(*(set(curve) for curve in curves))
    return max(statistics.mean(curve[step] for curve in curves) for step in steps)


def published_cell(env_id: str, runs: list[dict[str, Any]]) -> str:
    """The published TRPO results of ``env_id`` against ours, each with its own statistic."""
    parts = []
    if env_id in PUBLISHED_TRPO:
        mean = statistics.mean(run["final_return"] for run in runs)
        note = f", {PUBLISHED_NOTES[env_id]}" if env_id in PUBLISHED_NOTES else ""
        side = "above" if mean >= PUBLISHED_TRPO[env_id] else "below"
        parts.append(f"RL Zoo {PUBLISHED_TRPO[env_id]:g} (one run{note}): our mean {mean:.1f}, {side}")
    if env_id in TIANSHOU_TRPO_MAX:
        best = max_of_mean_curve(runs)
        side = "above" if best >= TIANSHOU_TRPO_MAX[env_id] else "below"
        parts.append(f"Tianshou {TIANSHOU_TRPO_MAX[env_id]:g} (max of the mean curve): ours {best:.1f}, {side}")
    return "; ".join(parts) or "-"


def changed_settings(settings: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    """The names of the settings that differ between a run's ``settings`` and an ``entry`` (sorted; the budget apart)."""
    names = (set(entry) | set(settings)) - set(BOOKKEEPING_SETTINGS)
    return sorted(name for name in names if entry.get(name) != settings.get(name))


def settings_changes(run: dict[str, Any], reference: Path = SB3_CONTRIB_SETTINGS) -> list[str]:
    """The settings of ``run`` that differ from its environment's entry in ``reference`` (sorted names)."""
    return changed_settings(run.get("hyperparams") or {}, hyperparams_entry(reference, run["env_id"]))


def is_default(run: dict[str, Any], conf: Path) -> bool:
    """Whether ``run`` ran the ``default`` entry of ``conf``, unchanged."""
    return run.get("hyperparams") == hyperparams_entry(conf, "default")


def settings_cell(runs: list[dict[str, Any]], reference: Path, conf: Path) -> str:
    """Our runs' settings: the default, the default with a few changes (an entry built on it), or what differs from
    sb3-contrib's settings (``reference``), whichever takes fewer names."""
    default = hyperparams_entry(conf, "default")
    from_default = sorted({name for run in runs for name in changed_settings(run.get("hyperparams") or {}, default)})
    if not from_default:
        return "the default"
    changes = sorted({name for run in runs for name in settings_changes(run, reference)})
    if len(from_default) < len(changes):
        return f"the default with: {', '.join(from_default)}"
    return f"tuned: {', '.join(changes)}" if changes else "sb3-contrib's"


def settings_kind(runs: list[dict[str, Any]], reference: Path = SB3_CONTRIB_SETTINGS) -> str:
    """One word for our runs' settings: "default", "sb3-contrib's" (translated to our KL) or "tuned"."""
    if all(is_default(run, hyperparams_path(OURS)) for run in runs):
        return "default"
    return "tuned" if any(settings_changes(run, reference) for run in runs) else "sb3-contrib's"


def ordered_tasks(runs: list[dict[str, Any]]) -> list[str]:
    """The suite's tasks first, in :data:`SUITE` order, then the others by name."""
    names = {run["env_id"] for run in runs}
    return [task for task in SUITE if task in names] + sorted(names - set(SUITE))


def summary_table(runs: list[dict[str, Any]]) -> str:
    """Per task, each contender's IQM of the final return (seeds), the best in bold, and which settings ours ran."""
    algos, groups = contenders(runs), cells(runs)
    lines = [
        "| task | " + " | ".join(label(algo) for algo in algos) + f" | {label(OURS)} settings |",
        "|---|" + "---|" * (len(algos) + 1),
    ]
    for env_id in ordered_tasks(runs):
        iqms = {algo: reliable.iqm([run["final_return"] for run in groups[(env_id, algo)]])
                for algo in algos if (env_id, algo) in groups}  # fmt: skip
        best = max(iqms.values())
        row = [f"**{iqms[a]:.1f}**" if iqms.get(a) == best else f"{iqms[a]:.1f}" if a in iqms else "-" for a in algos]
        row = [f"{cell} ({len(groups[(env_id, a)])})" if a in iqms else cell for cell, a in zip(row, algos, strict=True)]
        kind = settings_kind(groups[(env_id, OURS)]) if (env_id, OURS) in groups else "-"
        lines.append(f"| {env_id} | " + " | ".join(row) + f" | {kind} |")
    return "\n".join(lines)


def suite_table(runs: list[dict[str, Any]], reference: Path = SB3_CONTRIB_SETTINGS) -> str:
    """
    Per suite task with runs of ours and of sb3-contrib's TRPO: both IQMs with their intervals and the verdict, the
    seeds below their first evaluation, the published results against ours, our settings, and our NPG's IQM; then how
    many tasks meet each goal.
    """
    groups, conf = cells(runs), hyperparams_path(OURS)
    lines = [
        f"| task | {label(OURS)} IQM [95% CI] (seeds) | {label(REFERENCE)} IQM [95% CI] (seeds) | {label(OURS)} against "
        f"{label(REFERENCE)} | seeds below their first evaluation | published TRPO against ours | {label(OURS)} "
        f"settings | {label('npg')} IQM [95% CI] (seeds) against {label(REFERENCE)} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts, collapsed = [], []
    for env_id in SUITE:
        ours, theirs = groups.get((env_id, OURS)), groups.get((env_id, REFERENCE))
        if not ours or not theirs:
            continue
        mine, other = iqm_interval(ours), iqm_interval(theirs)
        verdicts.append(verdict(mine, other, min(len(ours), len(theirs))))
        collapsed += [f"{env_id} {seed}" for seed in collapsed_seeds(ours)]
        npg = groups.get((env_id, "npg"))
        npg_verdict = verdict(iqm_interval(npg), other, min(len(npg), len(theirs))) if npg else ""
        npg_cell = f"{interval_text(iqm_interval(npg), len(npg))}: {npg_verdict}" if npg else "-"
        lines.append(
            f"| {env_id} | {interval_text(mine, len(ours))} | {interval_text(other, len(theirs))} | {verdicts[-1]} | "
            f"{', '.join(str(seed) for seed in collapsed_seeds(ours)) or 'none'} | {published_cell(env_id, ours)} | "
            f"{settings_cell(ours, reference, conf)} | {npg_cell} |"
        )
    at_or_above = sum(v == "ahead" or "at or above" in v for v in verdicts)
    lines.append(
        f"\n{label(OURS)}'s IQM is at or above {label(REFERENCE)}'s on {at_or_above} of {len(verdicts)} tasks "
        f"(ahead, the intervals apart, on {verdicts.count('ahead')}; goal: every task of the suite). Seeds below their "
        f"first evaluation: {', '.join(collapsed) or 'none'} (goal: none)."
    )
    return "\n".join(lines)


def default_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our TRPO's runs of the shipped ``default`` entry, unchanged."""
    conf = hyperparams_path(OURS)
    return [run for run in runs if run["algo"] == OURS and is_default(run, conf)]


def default_table(runs: list[dict[str, Any]]) -> str:
    """Per new task with runs of the default and of sb3-contrib's TRPO: both IQMs and the verdict; then the count."""
    groups = cells(runs)
    defaults = cells(default_runs(runs))
    lines = [
        f"| task | the default's IQM [95% CI] (seeds) | {label(REFERENCE)} IQM [95% CI] (seeds) | the default against "
        f"{label(REFERENCE)} |",
        "|---|---|---|---|",
    ]
    met = 0
    for env_id in NEW_TASKS:
        ours, theirs = defaults.get((env_id, OURS)), groups.get((env_id, REFERENCE))
        if not ours or not theirs:
            continue
        mine, other = iqm_interval(ours), iqm_interval(theirs)
        met += mine.point >= other.point
        lines.append(f"| {env_id} | {interval_text(mine, len(ours))} | {interval_text(other, len(theirs))} | "
                     f"{verdict(mine, other, min(len(ours), len(theirs)))} |")  # fmt: skip
    lines.append(
        f"\nThe default's IQM is at or above {label(REFERENCE)}'s on {met} of the {len(NEW_TASKS)} new tasks "
        f"(goal: {DEFAULT_GOAL_TASKS} of {len(NEW_TASKS)})."
    )
    return "\n".join(lines)


def normalized_scores(runs: list[dict[str, Any]]) -> tuple[list[str], dict[str, dict[str, reliable.Interval]]]:
    """
    The suite tasks with a random score and sb3-contrib's runs, and per row (each task, then "all tasks") each
    contender's IQM of normalized final return with its interval; "all tasks" holds the contenders with runs on every
    task, over the seeds they ran on every task.
    """
    random, groups = read_random_scores(), cells(runs)
    tasks = [task for task in SUITE if task in random and (task, REFERENCE) in groups]
    scale = {task: reliable.iqm([run["final_return"] for run in groups[(task, REFERENCE)]]) for task in tasks}
    rows: dict[str, dict[str, reliable.Interval]] = {}
    for task in tasks:
        scores = {
            algo: np.array([[reliable.normalized(run["final_return"], random[task], scale[task])]
                            for run in groups[(task, algo)]])
            for algo in contenders(runs) if (task, algo) in groups
        }  # fmt: skip
        rows[task] = reliable.iqm_intervals(scores)
    suite_runs = [run for run in runs if run["env_id"] in tasks]
    rows["all tasks"] = reliable.iqm_intervals(reliable.group_scores(suite_runs, tasks, random, scale)) if tasks else {}
    return tasks, rows


def plot_normalized(runs: list[dict[str, Any]], path: Path) -> Path | None:
    """One figure: per suite task and over all of them, each contender's normalized IQM with its 95% interval."""
    tasks, rows = normalized_scores(runs)
    if not tasks:
        return None
    algos = contenders(runs)
    names = [*tasks, "all tasks"]
    figure, axes = plt.subplots(figsize=(8.0, 1.0 + ROW_HEIGHT * len(names)), dpi=FIGURE_DPI)
    offsets = np.linspace(-ROW_SPREAD / 2, ROW_SPREAD / 2, len(algos))
    for offset, algo in zip(offsets, algos, strict=True):
        shown = [(index, rows[name][algo]) for index, name in enumerate(names) if algo in rows[name]]
        if not shown:
            continue
        y = np.array([index for index, _ in shown]) + offset
        points = np.array([interval.point for _, interval in shown])
        errors = np.array([[i.point - i.low for _, i in shown], [i.high - i.point for _, i in shown]])
        axes.errorbar(points, y, xerr=errors, fmt="o", capsize=2, label=label(algo))
    axes.axvline(0.0, color="gray", linewidth=1)
    axes.axvline(1.0, color="gray", linestyle="--", linewidth=1)
    axes.set_yticks(range(len(names)), names)
    axes.invert_yaxis()
    axes.set_xlabel(f"IQM of normalized final return, 95% CI\n(0: a random policy, 1: {label(REFERENCE)}'s IQM on the task)")
    axes.set_title("MuJoCo at 1M steps")
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


#: The task every other task's cost is told against (the one the protocol's other budgets are known by).
COST_UNIT_TASK = "HalfCheetah-v5"
SECONDS_PER_MINUTE = 60.0


def task_cost_table(runs: list[dict[str, Any]]) -> str:
    """Per suite task, the mean wall time of a 1M-step run of each TRPO in minutes (evaluations included; two runs
    shared the two cores) and sb3-contrib's against its :data:`COST_UNIT_TASK` run: what a task costs in the protocol."""
    groups = cells(runs)

    def minutes(env_id: str, algo: str) -> float | None:
        rows = groups.get((env_id, algo))
        return statistics.mean(run["wall_time"] for run in rows) / SECONDS_PER_MINUTE if rows else None

    unit = minutes(COST_UNIT_TASK, REFERENCE)
    lines = [
        f"| task | {label(OURS)}: minutes per run (runs) | {label(REFERENCE)}: minutes per run (runs) | "
        f"{label(REFERENCE)}'s against {COST_UNIT_TASK} |",
        "|---|---|---|---|",
    ]
    for env_id in SUITE:
        ours, theirs = minutes(env_id, OURS), minutes(env_id, REFERENCE)
        if ours is None and theirs is None:
            continue
        cells_ = [f"{value:.1f} ({len(groups[(env_id, algo)])})" if value is not None else "-"
                  for value, algo in ((ours, OURS), (theirs, REFERENCE))]  # fmt: skip
        ratio = f"{theirs / unit:.1f}x" if theirs is not None and unit else "-"
        lines.append(f"| {env_id} | {cells_[0]} | {cells_[1]} | {ratio} |")
    return "\n".join(lines)
