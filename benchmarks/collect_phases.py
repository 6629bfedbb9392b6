"""Where our rollout loop's time goes, per environment step, next to SB3's whole loop.

    .venv/bin/python -m benchmarks.collect_phases [--reps 5] [--configs HalfCheetah-v5] [--out FILE]

For each configuration of ``bench_collect`` one TRPO model collects rollouts with our loop, its phases timed by
wrappers (the action sampler, ``env.step``, the callbacks, the batched pass after the rollout; the rest of the loop is
the remainder), alternated with SB3's ``collect_rollouts`` on the same model. The table gives microseconds per
environment step (all environments of a step together), medians over the repetitions, and two ratios to SB3's loop:
ours, and ours without the time spent sampling actions, the best ratio any action sampler could reach while the rest
of the loop stays as it is. The wrappers add a little time to the phases they time (one clock read each side).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from stable_baselines3.common.logger import configure
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from benchmarks.bench_collect import COLLECT_CONFIGS, _vec_env, timing_table
from benchmarks.common import TIMING_WARMUP_ROUNDS, configs_parser, run_configs
from sb3_npg import TRPO
from sb3_npg.common import rollouts

PHASES = ("sampling actions", "env.step", "callbacks", "after the rollout", "rest of the loop")
CALLBACK_METHODS = ("update_locals", "on_step", "on_rollout_start", "on_rollout_end")


class PhaseClock:
    """Seconds spent in each phase since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def timed(self, phase: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function``, its time added to ``phase``."""

        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start

        return run


def _instrumented(model: TRPO, clock: PhaseClock) -> Callable[[], None]:
    """One rollout of our loop with its phases timed (the wrappers are installed on this model and its env only)."""
    _, callback = model._setup_learn(10**9)
    env = model.env
    for method in CALLBACK_METHODS:
        setattr(callback, method, clock.timed("callbacks", getattr(callback, method)))
    model._complete_rollout = clock.timed("after the rollout", model._complete_rollout)  # type: ignore[method-assign]
    timed_env = clock.timed("env.step", env.step)
    make_sampler = rollouts.action_sampler

    def collect() -> None:
        env.step = timed_env  # type: ignore[method-assign]
        rollouts.action_sampler = lambda policy: clock.timed("sampling actions", make_sampler(policy))
        try:
            model.collect_rollouts(env, callback, model.rollout_buffer, model.n_steps)
        finally:
            rollouts.action_sampler = make_sampler
            del env.step  # back to the class's method for SB3's loop

    return collect


def bench_config(name: str, config: dict[str, Any], reps: int, seed: int = 0) -> dict[str, Any]:
    """Median microseconds per step of each phase of ours, and of SB3's whole loop, alternated."""
    model = TRPO("MlpPolicy", _vec_env(config, seed), n_steps=config["n_steps"], seed=seed, device="cpu")
    model.set_logger(configure(None, []))
    clock = PhaseClock()
    ours = _instrumented(model, clock)
    _, sb3_callback = model._setup_learn(10**9)
    per_step: dict[str, list[float]] = {phase: [] for phase in (*PHASES, "ours", "SB3 collect_rollouts")}
    for rep in range(TIMING_WARMUP_ROUNDS + reps):
        clock.reset()
        start = time.perf_counter()
        ours()
        total = time.perf_counter() - start
        start = time.perf_counter()
        OnPolicyAlgorithm.collect_rollouts(model, model.env, sb3_callback, model.rollout_buffer, model.n_steps)
        sb3 = time.perf_counter() - start
        if rep < TIMING_WARMUP_ROUNDS:
            continue
        clock.seconds["rest of the loop"] = total - sum(clock.seconds.values())
        for phase, seconds in {**clock.seconds, "ours": total, "SB3 collect_rollouts": sb3}.items():
            per_step[phase].append(1e6 * seconds / model.n_steps)
    medians = {phase: statistics.median(values) for phase, values in per_step.items()}
    without_sampling = [
        (total - sampling) / sb3
        for total, sampling, sb3 in zip(
            per_step["ours"], per_step["sampling actions"], per_step["SB3 collect_rollouts"], strict=True
        )
    ]
    ratios = [ours / sb3 for ours, sb3 in zip(per_step["ours"], per_step["SB3 collect_rollouts"], strict=True)]
    return {
        "config": name,
        "n_envs": config["n_envs"],
        "us_per_step": medians,
        "ours_over_sb3": statistics.median(ratios),
        "ours_without_sampling_over_sb3": statistics.median(without_sampling),
    }


def markdown_table(results: list[dict[str, Any]]) -> str:
    """One row per configuration."""
    ratios = {"ours / SB3's": "ours_over_sb3", "ours without sampling / SB3's": "ours_without_sampling_over_sb3"}
    return timing_table(results, "us_per_step", (*PHASES, "ours", "SB3 collect_rollouts"), "us / step", ratios)


def main() -> None:
    parser = configs_parser(__doc__, COLLECT_CONFIGS)
    parser.set_defaults(reps=5)
    run_configs(parser.parse_args(), COLLECT_CONFIGS, bench_config, markdown_table)


if __name__ == "__main__":
    main()
