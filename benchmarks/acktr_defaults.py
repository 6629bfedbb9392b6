"""ACKTR's defaults against OpenAI baselines' Atari settings (its defaults before), on one environment, beside TRPO's.

    .venv/bin/python -m benchmarks.acktr_defaults                 # the matrix: seeds 0,1,2, then the table
    .venv/bin/python -m benchmarks.acktr_defaults --table         # only the table of the runs already there
    .venv/bin/python -m benchmarks.acktr_defaults --screen        # the screened candidates, tuning seeds 100,101,102
    .venv/bin/python -m benchmarks.acktr_defaults --only acktr_new,trpo --tasks CartPole-v1 --seeds 3,4,5,6,7 \
        --out benchmarks/results/acktr_defaults/cartpole_seeds_3-7   # the cost goal again, on a quieter machine

Each run is ``ALGO("MlpPolicy", env, **settings)`` on a single environment without ``VecNormalize`` (what a user who
writes ``ACKTR("MlpPolicy", env)`` gets), trained by ``benchmarks.compare``'s harness (the RL Zoo's ``train`` in a
fresh process, one thread, an ``EvalCallback`` of 10 deterministic episodes every budget/5 steps; the final return is
the last evaluation, at the budget). Configurations: ``acktr_old`` (:data:`~sb3_npg.acktr.BASELINES_ATARI_SETTINGS`),
``acktr_new`` (the constructor's defaults, spelled out so a change of default is a new run), ``trpo`` (our TRPO with
its defaults, whose time per sample is the cost goal). Each configuration's Zoo file is written to
``OUT/confs/NAME.yml``; each finished run is appended to ``OUT/runs.jsonl`` and a run already there is skipped, so an
interrupted matrix resumes. The table (``OUT/results.md``): per task and configuration, each seed's final return, the
mean, the runs that reached the task's goal, and microseconds of collecting plus training per sample (evaluations
excluded; the mean and the fastest over seeds), with their ratios to TRPO's on the same seeds.

The tasks of the matrix are ones no ACKTR setting was tuned on (none has an ``acktr.yml`` entry that was screened),
plus CartPole-v1 at 50k steps (the issue's goal: 475 on most seeds); ``--screen`` runs the candidates on CartPole-v1
and Pendulum-v1, which the defaults were chosen on, with the tuning seeds only.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import RUNS_FILE, read_jsonl
from benchmarks.compare import DEFAULT_EVAL_EPISODES, Job, run_matrix
from sb3_npg import ACKTR
from sb3_npg.acktr import BASELINES_ATARI_SETTINGS

#: The reported seeds of the matrix, and the tuning seeds of the screen (never reported).
SEEDS: tuple[int, ...] = (0, 1, 2)
SCREEN_SEEDS: tuple[int, ...] = (100, 101, 102)
#: Evaluations per run (the last one at the budget).
EVALUATIONS = 5
#: Task -> (budget, the mean return that counts as reaching it: the RL Zoo's or Gymnasium's "solved" levels).
TASKS: dict[str, tuple[int, float]] = {
    "CartPole-v1": (50_000, 475.0),
    "Acrobot-v1": (50_000, -100.0),
    "InvertedPendulum-v5": (50_000, 950.0),
    "Reacher-v5": (50_000, -10.0),
    "LunarLander-v3": (100_000, 200.0),
}
#: The screen's tasks: the classic-control and MuJoCo tasks with screened ``acktr.yml`` entries (Hopper-v5's goal:
#: a hop that lasts, a marker of learning rather than the task's level).
SCREEN_TASKS: dict[str, tuple[int, float]] = {
    "CartPole-v1": (50_000, 475.0),
    "Pendulum-v1": (50_000, -250.0),
    "Hopper-v5": (100_000, 1000.0),
}
#: The Zoo name of each algorithm.
ZOO_NAMES = {"acktr": "acktr", "trpo": "npg_trpo"}
#: The configuration whose time per sample is the cost goal.
COST_REFERENCE = "trpo"


def constructor_defaults() -> dict[str, Any]:
    """ACKTR's constructor defaults of every option that :data:`BASELINES_ATARI_SETTINGS` sets."""
    parameters = inspect.signature(ACKTR.__init__).parameters
    return {name: parameters[name].default for name in BASELINES_ATARI_SETTINGS}


def configurations() -> dict[str, tuple[str, dict[str, Any]]]:
    """The matrix's configurations: name -> (algorithm, constructor options)."""
    return {
        "acktr_old": ("acktr", dict(BASELINES_ATARI_SETTINGS)),
        "acktr_new": ("acktr", constructor_defaults()),
        "trpo": ("trpo", {}),
    }


#: The screened candidates for the new defaults (constructor options over baselines' settings, one environment):
#: name -> (why it was tried, its options). Their results: benchmarks/README.md, "### Defaults".
_ZOO_CARTPOLE = {
    "n_steps": 1024,
    "gae_lambda": 0.98,
    "ent_coef": 0.0,
    "normalize_advantage": True,
    "kfac_clip": 0.01,
    "kfac_stats_decay": 0.5,
    "critic_fit": "kfac",
    "critic_kfac_clip": 0.5,
    "n_critic_updates": 10,
    "normalize_value_targets": True,
}
CANDIDATES: dict[str, dict[str, Any]] = {
    # acktr.yml's screened CartPole-v1 entry (2 envs x 512 steps) as one env x 1024 steps
    "zoo_cartpole": _ZOO_CARTPOLE,
    # the same with our TRPO's rollouts (2048 steps, GAE 0.95): fewer updates, so less time per sample
    "trpo_rollouts": {**_ZOO_CARTPOLE, "n_steps": 2048, "gae_lambda": 0.95},
    # our TRPO's critic (10 epochs of Adam minibatches of 128) instead of the K-FAC one
    "minibatch_critic": {
        **_ZOO_CARTPOLE,
        "critic_fit": "minibatch",
        "critic_kfac_clip": None,
        "batch_size": 128,
        "normalize_value_targets": False,
    },
    # acktr.yml's CartPole-v1 entry with a wider KL radius (Pendulum-v1's entry's 0.02)
    "kfac_clip_0.02": {**_ZOO_CARTPOLE, "kfac_clip": 0.02},
    # the K-FAC critic on raw returns: a policy saved alone (model.policy.save) then loads into SB3's own class,
    # which has no buffers for the value targets' statistics
    "kfac_critic_raw_targets": {**_ZOO_CARTPOLE, "normalize_value_targets": False},
}


def write_conf(folder: Path, name: str, algo: str, settings: Mapping[str, Any], tasks: Mapping[str, Any]) -> Path:
    """The Zoo file of one configuration: one entry per task, the settings on one environment, no VecNormalize."""
    entries = {env_id: {"policy": "MlpPolicy", "n_timesteps": budget, **settings} for env_id, (budget, _) in tasks.items()}
    path = folder / "confs" / f"{name}.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# {name}: {algo} ({ZOO_NAMES[algo]}), written by benchmarks/acktr_defaults.py\n"
    path.write_text(header + yaml.safe_dump(entries, sort_keys=True), encoding="utf-8")
    return path


def plan(
    folder: Path, configs: Mapping[str, tuple[str, dict[str, Any]]], tasks: Mapping[str, Any], seeds: tuple[int, ...]
) -> list[Job]:
    """Every run, seed-major (every cell gets a first seed before any gets a second), each configuration's file written."""
    confs = {name: write_conf(folder, name, algo, settings, tasks) for name, (algo, settings) in configs.items()}
    jobs = []
    for seed in seeds:
        for env_id, (budget, _) in tasks.items():
            for name, (algo, _) in configs.items():
                eval_freq = budget // EVALUATIONS
                jobs.append(Job(ZOO_NAMES[algo], env_id, seed, budget, eval_freq, DEFAULT_EVAL_EPISODES, str(confs[name])))
    return jobs


def configuration_of(run: Mapping[str, Any]) -> str:
    """The configuration a run belongs to: the name of its Zoo file."""
    return Path(run["conf"]).stem


def microseconds_per_sample(run: Mapping[str, Any]) -> float:
    """Collecting plus training time per collected sample (evaluations excluded), in microseconds."""
    return 1e6 / run["steps_per_second"]


def _ratio(mine: list[float], theirs: list[float]) -> str:
    return f"{statistics.mean(mine) / statistics.mean(theirs):.2f}x / {min(mine) / min(theirs):.2f}x"


def markdown_table(runs: list[dict[str, Any]], tasks: Mapping[str, tuple[int, float]]) -> str:
    """
    Per task and configuration: the seeds' final returns, their mean, goals reached, time per sample (mean and
    fastest over seeds: other processes on the machine only ever add time) and their ratios to
    :data:`COST_REFERENCE`'s over the same seeds.
    """
    lines = [
        "| task (budget, goal) | configuration | final return per seed | mean | reached | us/sample (mean / min) "
        "| vs trpo (mean / min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for env_id, (budget, goal) in tasks.items():
        cells: dict[str, dict[int, dict[str, Any]]] = {}
        for run in runs:
            if run["env_id"] == env_id and run["timesteps"] == budget:
                cells.setdefault(configuration_of(run), {})[run["seed"]] = run
        reference = cells.get(COST_REFERENCE, {})
        for name, by_seed in cells.items():
            seeds = sorted(by_seed)
            finals = [by_seed[seed]["final_return"] for seed in seeds]
            costs = [microseconds_per_sample(by_seed[seed]) for seed in seeds]
            shared = [seed for seed in seeds if seed in reference]
            ratio = "-"
            if shared:
                mine = [microseconds_per_sample(by_seed[seed]) for seed in shared]
                ratio = _ratio(mine, [microseconds_per_sample(reference[seed]) for seed in shared])
            per_seed = " / ".join(f"{seed}: {final:.1f}" for seed, final in zip(seeds, finals, strict=True))
            reached = sum(final >= goal for final in finals)
            lines.append(
                f"| {env_id} ({budget:,}, {goal:g}) | {name} | {per_seed} | {statistics.mean(finals):.1f} | "
                f"{reached} of {len(finals)} | {statistics.mean(costs):.0f} / {min(costs):.0f} | {ratio} |"
            )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line."""
    result = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--screen", action="store_true", help="run the candidates on the tuning seeds instead")
    result.add_argument("--table", action="store_true", help="only write the table of the runs already there")
    result.add_argument("--only", help="comma-separated configurations (or candidates) to run, default all")
    result.add_argument("--tasks", help="comma-separated tasks of the matrix (or the screen) to run, default all")
    result.add_argument("--seeds", help="comma-separated seeds, default 0,1,2 (the screen: 100,101,102)")
    result.add_argument("--out", type=Path, help="default benchmarks/results/acktr_defaults[/screen]")
    return result


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    default_out = Path("benchmarks/results/acktr_defaults")
    if args.screen:
        out = args.out or default_out / "screen"
        configs = {name: ("acktr", {**BASELINES_ATARI_SETTINGS, **options}) for name, options in CANDIDATES.items()}
        configs[COST_REFERENCE] = configurations()[COST_REFERENCE]
        tasks, seeds = SCREEN_TASKS, SCREEN_SEEDS
    else:
        out, configs, tasks, seeds = args.out or default_out, configurations(), TASKS, SEEDS
    if args.only:
        configs = {name: configs[name] for name in args.only.split(",")}
    if args.tasks:
        tasks = {env_id: tasks[env_id] for env_id in args.tasks.split(",")}
    if args.seeds:
        seeds = tuple(int(seed) for seed in args.seeds.split(","))
    if not args.table:
        run_matrix(plan(out, configs, tasks, seeds), out, workers=1)
    table = markdown_table(read_jsonl(out / RUNS_FILE), tasks)
    (out / "results.md").write_text(table + "\n", encoding="utf-8")
    print(table)


if __name__ == "__main__":
    main()
