"""Drop-in comparison: a matrix of algorithms x environments x seeds, trained by the RL Zoo with tuned hyperparameters.

    .venv/bin/python -m benchmarks.compare --algos npg,npg_trpo,trpo --envs CartPole-v1,Pendulum-v1 --seeds 0,1,2 \\
        --timesteps 100000 --eval-freq 10000 --workers 2 --out benchmarks/results/compare
    .venv/bin/python -m benchmarks.report benchmarks/results/compare     # results.md and one PNG per environment

Algorithms: ``npg``, ``npg_trpo`` and ``acktr`` (ours, with our shipped Zoo files), ``trpo`` (sb3-contrib), ``ppo`` and ``a2c``
(SB3), the others with the installed ``rl_zoo3``'s files; ``--conf ALGO=FILE`` gives an algorithm a file of your own
(the Zoo's format). A MuJoCo ``-v5`` environment without an entry uses the file's ``-v4`` entry. Every algorithm trains
for the same budget: ``--timesteps``, or else the environment's budget in our ``npg_trpo.yml`` (the RL Zoo's TRPO
budget). Each run is ``rl_zoo3.train`` in a fresh worker process, with the Zoo's ``EvalCallback`` on a separate
environment (``--eval-episodes`` deterministic episodes every ``--eval-freq`` steps).

Each finished run is appended to ``OUT/runs.jsonl`` at once; a run already there (same algorithm, environment, seed,
budget, evaluation schedule and hyperparameters) is skipped, so an interrupted matrix resumes where it stopped. A run
records its evaluation curve, final return (the last evaluation), wall time, the time spent in ``collect_rollouts``
(evaluations excluded), in ``train()`` and in evaluations, the samples collected, steps per second (of collecting plus
training) and the version of every installed package.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm import tqdm

from benchmarks.common import (
    EVALUATIONS_PER_RUN,
    RUNS_FILE,
    default_hyperparams,
    hyperparams_entry,
    portable_path,
    read_jsonl,
    result_package_versions,
)
from sb3_npg.zoo import hyperparams_path

DEFAULT_ALGOS = "npg,npg_trpo,acktr,trpo,ppo,a2c"
DEFAULT_EVAL_EPISODES = 10
#: Evaluations per run when ``--eval-freq`` is not given.
DEFAULT_EVALUATIONS = EVALUATIONS_PER_RUN
#: The file whose budgets are every algorithm's default: the RL Zoo's TRPO budgets, with MuJoCo v5 entries.
BUDGET_FILE_ALGO = "npg_trpo"


@dataclass(frozen=True)
class Job:
    """One cell of the matrix: an algorithm trained on an environment with a seed, for a budget."""

    algo: str
    env_id: str
    seed: int
    timesteps: int
    eval_freq: int
    eval_episodes: int
    conf: str

    @property
    def hyperparams(self) -> dict[str, Any]:
        """The Zoo entry the run trains with (its file's entry for the environment, with the run's budget)."""
        return hyperparams_entry(Path(self.conf), self.env_id) | {"n_timesteps": self.timesteps}

    @property
    def key(self) -> RunKey:
        """What identifies a finished run in the results file."""
        return run_key({**asdict(self), "hyperparams": self.hyperparams})


#: Algorithm, environment, seed, budget, evaluation schedule and the hyperparameters' JSON.
RunKey = tuple[str, str, int, int, int, int, str]


def run_key(record: dict[str, Any]) -> RunKey:
    """
    What makes two runs the same run: a run with other settings or another evaluation schedule is another run (the
    final evaluation's episodes depend on the evaluations before it), so changing a shipped file or ``--eval-freq``
    runs the matrix again instead of skipping it.

    :param record: a line of the results file (or a job's fields with its ``hyperparams``)
    """
    settings = json.dumps(record["hyperparams"], sort_keys=True)
    fields = ("algo", "env_id", "seed", "timesteps", "eval_freq", "eval_episodes")
    return (*(record[field] for field in fields), settings)  # type: ignore[return-value]


def default_budget(env_id: str) -> int:
    """The environment's budget in our ``npg_trpo.yml`` (its ``default`` entry for an environment it does not list)."""
    entries = yaml.safe_load(hyperparams_path(BUDGET_FILE_ALGO).read_text(encoding="utf-8"))
    return int(float(entries.get(env_id, entries["default"])["n_timesteps"]))


def plan(args: argparse.Namespace) -> list[Job]:
    """Every job of the matrix, in seed-major order (all cells get a first seed before any gets a second)."""
    confs = dict(item.split("=", 1) for item in args.conf)
    jobs = []
    for seed in _split(args.seeds):
        for env_id in _split(args.envs):
            timesteps = args.timesteps or default_budget(env_id)
            eval_freq = args.eval_freq or max(timesteps // DEFAULT_EVALUATIONS, 1)
            for algo in _split(args.algos):
                conf = Path(confs.get(algo, default_hyperparams(algo)))
                hyperparams_entry(conf, env_id)  # fail before any run starts
                jobs.append(Job(algo, env_id, int(seed), timesteps, eval_freq, args.eval_episodes, str(conf)))
    return jobs


def _split(value: str) -> list[str]:
    return [item for item in value.split(",") if item]


@dataclass
class _Timings:
    collect_rollouts: float = 0.0
    train: float = 0.0
    evaluation: float = 0.0
    #: The samples the model collected (at least the budget: the Zoo stops after the rollout that crosses it).
    steps: int = 0


@contextlib.contextmanager
def _clock(timings: _Timings, field: str) -> Iterator[None]:
    """Add the time the block takes to ``timings.<field>``, even when it raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        setattr(timings, field, getattr(timings, field) + time.perf_counter() - start)


def _timed(algo_class: type, timings: _Timings) -> type:
    """A subclass of ``algo_class`` (same name) that adds the time of each ``collect_rollouts`` and ``train`` call, and
    the samples collected, to ``timings``."""

    class Timed(algo_class):
        def collect_rollouts(self, *args: Any, **kwargs: Any) -> Any:
            with _clock(timings, "collect_rollouts"):
                return super().collect_rollouts(*args, **kwargs)

        def train(self, *args: Any, **kwargs: Any) -> Any:
            with _clock(timings, "train"):
                result = super().train(*args, **kwargs)
            timings.steps = self.num_timesteps
            return result

    Timed.__name__ = Timed.__qualname__ = algo_class.__name__
    return Timed


def _timed_evaluation(evaluate: Callable[..., Any], timings: _Timings) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with _clock(timings, "evaluation"):
            return evaluate(*args, **kwargs)

    return run


def package_versions() -> dict[str, str]:
    """Every installed distribution and its version."""
    return {dist.metadata["Name"]: dist.version for dist in importlib.metadata.distributions()}


def run_job(job: Job) -> dict[str, Any]:
    """Train one cell with the RL Zoo (call it in a fresh process: it edits the Zoo's registry) and return its record."""
    from rl_zoo3 import train as zoo_train
    from rl_zoo3.utils import ALGOS
    from stable_baselines3.common import callbacks

    from sb3_npg.zoo import register

    register()
    timings = _Timings()
    callbacks.evaluate_policy = _timed_evaluation(callbacks.evaluate_policy, timings)
    ALGOS[job.algo] = _timed(ALGOS[job.algo], timings)
    with tempfile.TemporaryDirectory() as folder:
        entry = job.hyperparams
        conf = Path(folder) / "hyperparams.yml"
        conf.write_text(yaml.safe_dump({job.env_id: entry}), encoding="utf-8")
        sys.argv = ["train", "--algo", job.algo, "--env", job.env_id, "--seed", str(job.seed), "-f", folder]
        sys.argv += ["-conf", str(conf), "--eval-freq", str(job.eval_freq), "--eval-episodes", str(job.eval_episodes)]
        sys.argv += ["--num-threads", "1", "--log-interval", "-1", "--verbose", "0"]
        start = time.perf_counter()
        with open(os.devnull, "w", encoding="utf-8") as devnull, contextlib.redirect_stdout(devnull):
            zoo_train.train()
        wall_time = time.perf_counter() - start
        evaluations = np.load(next(Path(folder).glob(f"{job.algo}/{job.env_id}_*/evaluations.npz")))
    results = evaluations["results"]
    collect_time = timings.collect_rollouts - timings.evaluation  # evaluations run inside collect_rollouts' callbacks
    return {
        **asdict(job),
        "conf": portable_path(job.conf),
        "curve": [
            [int(step), float(np.mean(returns)), float(np.std(returns))]
            for step, returns in zip(evaluations["timesteps"], results, strict=True)
        ],
        "final_return": float(np.mean(results[-1])),
        "final_return_std": float(np.std(results[-1])),
        "wall_time": wall_time,
        "time_collect_rollouts": collect_time,
        "time_train": timings.train,
        "time_evaluation": timings.evaluation,
        "steps": timings.steps,
        "steps_per_second": timings.steps / (collect_time + timings.train),
        "hyperparams": entry,
        "python": platform.python_version(),
        "machine": platform.platform(),
        "versions": package_versions(),
    }


def append_line(path: Path, line: str) -> None:
    """Append one line with a single ``write`` on an ``O_APPEND`` descriptor, so that two matrices writing to one
    folder at once never interleave their records."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        data = (line + "\n").encode("utf-8")
        written = os.write(descriptor, data)
        if written != len(data):
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
    finally:
        os.close(descriptor)


def version_mismatches(records: list[dict[str, Any]], installed: dict[str, str]) -> list[str]:
    """
    Each result package whose installed version differs from one its ``records`` ran with, as
    ``"name recorded -> installed"``.
    """
    mine = result_package_versions(installed)
    recorded: dict[str, set[str]] = {}
    for record in records:
        for name, version in result_package_versions(record.get("versions", {})).items():
            recorded.setdefault(name, set()).add(version)
    return [
        f"{name} {', '.join(sorted(versions))} -> {mine.get(name, 'not installed')}"
        for name, versions in recorded.items()
        if versions != {mine.get(name)}
    ]


def run_matrix(jobs: list[Job], out: Path, workers: int) -> list[dict[str, Any]]:
    """Run the jobs not already in ``out/runs.jsonl``, appending each record as soon as its run finishes."""
    out.mkdir(parents=True, exist_ok=True)
    results_file = out / RUNS_FILE
    results = read_jsonl(results_file)
    done = {run_key(record) for record in results}
    todo = [job for job in jobs if job.key not in done]
    mismatches = version_mismatches(results, package_versions()) if todo else []
    if mismatches:
        warnings.warn(
            f"{results_file} holds runs made with other package versions ({'; '.join(mismatches)}): install the recorded "
            "ones to keep the matrix on one set, or the report will list the mix",
            stacklevel=2,
        )
    # A fresh spawned process per run (maxtasksperchild=1): each run edits the Zoo's registry and patches SB3.
    with (
        multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=1) as pool,
        tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc="runs", unit="run") as progress,
    ):
        for record in pool.imap_unordered(run_job, todo):
            append_line(results_file, json.dumps(record))
            results.append(record)
            progress.set_postfix_str(f"{record['algo']} {record['env_id']} seed {record['seed']}")
            progress.update()
    return results


def parser() -> argparse.ArgumentParser:
    """The command line of the matrix."""
    result = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--algos", default=DEFAULT_ALGOS, help="comma-separated Zoo names")
    result.add_argument("--envs", default="CartPole-v1,Pendulum-v1", help="comma-separated environment ids")
    result.add_argument("--seeds", default="0,1,2")
    result.add_argument("--timesteps", type=int, help="budget of every run (default: each environment's Zoo budget)")
    result.add_argument("--eval-freq", type=int, help=f"steps between evaluations (default: budget/{DEFAULT_EVALUATIONS})")
    result.add_argument("--eval-episodes", type=int, default=DEFAULT_EVAL_EPISODES)
    result.add_argument("--workers", type=int, default=2, help="runs in parallel, one process each")
    result.add_argument("--conf", action="append", default=[], metavar="ALGO=FILE", help="a hyperparameter file of yours")
    result.add_argument("--out", type=Path, default=Path("benchmarks/results/compare"))
    return result


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    run_matrix(plan(args), args.out, args.workers)
    print(f"results in {args.out / RUNS_FILE}; tables and plots: python -m benchmarks.report {args.out}")


if __name__ == "__main__":
    main()
