"""Interval estimates of a comparison matrix with ``rliable``: what ``benchmarks.report`` puts next to mean +- std.

A few seeds per cell make means and standard deviations fragile; following Agarwal et al., "Deep Reinforcement
Learning at the Edge of the Statistical Precipice" (NeurIPS 2021, https://arxiv.org/abs/2108.13264), the report also
gives the interquartile mean (IQM: the mean of the middle half of the runs) with a 95% stratified bootstrap confidence
interval, per task, along the learning curves, and across tasks on normalized scores, plus performance profiles. The
statistics are ``rliable``'s (``get_interval_estimates``, ``aggregate_iqm``, ``create_performance_profile``), seeded so
that a report is reproducible.

A normalized score is ``(return - random) / (reference - random)``: 0 for a uniformly random policy
(``benchmarks/random_scores.py``), 1 for the RL Zoo's published sb3-contrib TRPO result (``PUBLISHED_TRPO``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import scipy.stats
from rliable import library as rly
from rliable import metrics

#: Bootstrap resamples per interval (rliable's own default for performance profiles).
BOOTSTRAP_REPS = 2000
#: Resamples per learning curve band: a band is drawn, not tabled, and a report has a curve per algorithm and task.
CURVE_BOOTSTRAP_REPS = 500
CONFIDENCE = 0.95
#: The share of runs cut at each end by the interquartile mean (rliable's ``aggregate_iqm``).
IQM_CUT = 0.25
#: Seeds the bootstrap, so that the same runs give the same report.
BOOTSTRAP_SEED = 0
#: Points of a performance profile, between the lowest and the highest normalized score.
PROFILE_POINTS = 101
#: Tasks aggregated together: an algorithm enters a group's aggregate only with runs on all of its tasks.
TASK_GROUPS: dict[str, tuple[str, ...]] = {
    "MuJoCo": ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Swimmer-v5"),
    "new MuJoCo tasks": ("Ant-v5", "Humanoid-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5", "Reacher-v5"),
    "classic control": ("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCarContinuous-v0"),
}


class Interval(NamedTuple):
    """A point estimate and its confidence interval."""

    point: float
    low: float
    high: float


@contextlib.contextmanager
def _seeded_global_numpy() -> Iterator[None]:
    """
    NumPy's global generator seeded with ``BOOTSTRAP_SEED`` inside the block, and restored after it.

    ``rliable``'s resamplers draw their indices from the global generator (``np.random.choice`` in
    ``StratifiedBootstrap`` and ``create_performance_profile``), not from the ``random_state`` they are given: without
    this, two tables of the same runs in one report get different intervals.
    """
    state = np.random.get_state()
    np.random.seed(BOOTSTRAP_SEED)
    try:
        yield
    finally:
        np.random.set_state(state)


def _interval_estimates(
    scores: Mapping[str, np.ndarray], statistic: Callable[[np.ndarray], np.ndarray], reps: int = BOOTSTRAP_REPS
) -> Any:
    """``rliable``'s stratified bootstrap of ``statistic``, seeded (its ``random_state`` is deprecated by ``arch``,
    which it still passes to: the warning says nothing about the results)."""
    with warnings.catch_warnings(), _seeded_global_numpy():
        warnings.filterwarnings("ignore", "random_state is deprecated", FutureWarning)
        return rly.get_interval_estimates(
            scores,
            statistic,
            reps=reps,
            confidence_interval_size=CONFIDENCE,
            random_state=np.random.RandomState(BOOTSTRAP_SEED),
        )


def iqm_intervals(scores: Mapping[str, np.ndarray]) -> dict[str, Interval]:
    """
    The IQM of each algorithm's scores over runs and tasks, with its confidence interval. Each algorithm's bootstrap
    is seeded on its own, so that its interval depends on its scores only: every table that shows a cell gives it the
    same interval, whichever other algorithms it is computed beside.

    :param scores: algorithm -> ``(runs, tasks)`` scores (the same tasks for every algorithm)
    """
    intervals = {}
    for algo, matrix in scores.items():
        points, bounds = _interval_estimates({algo: matrix}, lambda m: np.array([metrics.aggregate_iqm(m)]))
        intervals[algo] = Interval(float(points[algo][0]), float(bounds[algo][0, 0]), float(bounds[algo][1, 0]))
    return intervals


def iqm(values: Sequence[float]) -> float:
    """The IQM of one algorithm's final returns on one task (the point of :func:`iqm_intervals`)."""
    return float(metrics.aggregate_iqm(np.asarray(values, dtype=float)[:, np.newaxis]))


def iqm_curve(curves: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """
    The IQM over runs at each evaluation, with its confidence band.

    :param curves: ``(runs, evaluations)`` returns of one algorithm on one task
    :return: IQM, lower and upper bound, one value per evaluation
    """
    per_evaluation = curves[:, np.newaxis, :]  # rliable's (runs, tasks, evaluations)
    points, intervals = _interval_estimates(
        {"curve": per_evaluation},
        # aggregate_iqm (the 25% trimmed mean over runs and tasks) of each evaluation, in one call for all of them
        lambda scores: scipy.stats.trim_mean(scores.reshape(-1, scores.shape[-1]), IQM_CUT, axis=0),
        reps=CURVE_BOOTSTRAP_REPS,
    )
    return points["curve"], intervals["curve"][0], intervals["curve"][1]


def normalized(score: float | np.ndarray, random: float, reference: float) -> float | np.ndarray:
    """``(score - random) / (reference - random)``: 0 for the random policy, 1 for the reference."""
    return (score - random) / (reference - random)


def group_scores(
    runs: Sequence[dict[str, Any]], tasks: Sequence[str], random: Mapping[str, float], reference: Mapping[str, float]
) -> dict[str, np.ndarray]:
    """
    Per algorithm with runs on every task of ``tasks``, its ``(runs, tasks)`` normalized final returns, over the seeds
    it ran on every task (rliable needs as many runs per task).

    :param runs: records of ``runs.jsonl``
    :param tasks: the group's environments, each with a random and a reference score
    """
    finals: dict[str, dict[str, dict[int, float]]] = {}
    for run in runs:
        finals.setdefault(run["algo"], {}).setdefault(run["env_id"], {})[run["seed"]] = run["final_return"]
    scores = {}
    for algo, per_task in finals.items():
        if not all(task in per_task for task in tasks):
            continue
        seeds = sorted(set.intersection(*(set(per_task[task]) for task in tasks)))
        if seeds:
            scores[algo] = np.array(
                [[normalized(per_task[task][seed], random[task], reference[task]) for task in tasks] for seed in seeds]
            )
    return scores


def performance_profiles(scores: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """
    The fraction of runs above each normalized score, with its confidence band, per algorithm.

    :param scores: algorithm -> ``(runs, tasks)`` normalized scores
    :return: the scores ``tau``, then per algorithm the fractions and their ``(2, len(tau))`` bands
    """
    values = np.concatenate([matrix.ravel() for matrix in scores.values()])
    taus = np.linspace(values.min(), values.max(), PROFILE_POINTS)
    with _seeded_global_numpy():  # create_performance_profile takes no random state
        fractions, bands = rly.create_performance_profile(
            scores, taus, reps=BOOTSTRAP_REPS, confidence_interval_size=CONFIDENCE
        )
    return taus, fractions, bands
