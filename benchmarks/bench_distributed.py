"""Data-parallel scaling on one machine: throughput of NPG on 1, 2 and 4 processes, and the cost of its collectives.

    .venv/bin/python -m benchmarks.bench_distributed --processes 1,2,4 --out benchmarks/results/bench_distributed.json

Each process runs Hopper-v5 (``--n-envs`` environments) behind a simulated per-step delay (``--delay-ms``, a sleep
standing for a slow simulator) and collects ``--n-steps`` steps per update, so the work per process is fixed (weak
scaling): the total samples per update grow with the processes. Measured on rank 0 over ``--updates`` updates after
one warm-up update: samples per second of the whole run, seconds per update in ``collect_rollouts`` and ``train()``,
and the number of collectives per update, their total payload and time. A second table times one all-reduce of
vectors of growing size (the payload grows with the actor's parameter count: the gradient and each Fisher product
are one vector of it). Processes talk through gloo over loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.common import free_port, machine_description

#: Sizes (float32 values) of the all-reduce micro-benchmark.
PAYLOAD_SIZES = (1_000, 10_000, 100_000, 1_000_000)
ALL_REDUCE_REPEATS = 20
#: Warm-up updates excluded from the timings (process-group and first-call costs).
WARM_UP_UPDATES = 1


class _SlowStep(gym.Wrapper):
    """Sleeps ``delay`` seconds in every step: a simulator slower than MuJoCo's Hopper."""

    def __init__(self, env: gym.Env, delay: float):
        super().__init__(env)
        self.delay = delay

    def step(self, action: Any) -> Any:
        time.sleep(self.delay)
        return self.env.step(action)


def _join(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    if world_size > 1:
        dist.init_process_group("gloo")


def _throughput_worker(rank: int, world_size: int, port: int, settings: dict[str, Any], out: str) -> None:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import configure

    from sb3_npg import NPG
    from sb3_npg.common.distributed import Collective

    _join(rank, world_size, port)

    def slow(env: gym.Env) -> gym.Env:
        return _SlowStep(env, settings["delay"])

    env = make_vec_env("Hopper-v5", n_envs=settings["n_envs"], seed=rank, wrapper_class=slow)
    model = NPG("MlpPolicy", env, n_steps=settings["n_steps"], seed=0, device="cpu", distributed=world_size > 1)
    model.set_logger(configure(None, []))
    timings = {"collect": 0.0, "train": 0.0, "collectives": 0, "payload": 0, "collective_seconds": 0.0}

    def counted(collective: Collective) -> None:
        timings["collective_seconds"] += collective.seconds
        timings["collectives"] += 1
        timings["payload"] += collective.payload_bytes

    model.reducer.on_collective = counted
    samples_per_update = settings["n_steps"] * settings["n_envs"] * world_size
    model.learn(WARM_UP_UPDATES * samples_per_update)
    timings.update(collect=0.0, train=0.0, collectives=0, payload=0, collective_seconds=0.0)
    collect, train = model.collect_rollouts, model.train

    def timed_collect(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = collect(*args, **kwargs)
        timings["collect"] += time.perf_counter() - start
        return result

    def timed_train() -> None:
        start = time.perf_counter()
        train()
        timings["train"] += time.perf_counter() - start

    model.collect_rollouts, model.train = timed_collect, timed_train  # type: ignore[method-assign]
    start = time.perf_counter()
    model.learn(settings["updates"] * samples_per_update, reset_num_timesteps=False)
    wall = time.perf_counter() - start
    if rank == 0:
        updates = settings["updates"]
        record = {
            "processes": world_size,
            "samples_per_update": samples_per_update,
            "samples_per_second": updates * samples_per_update / wall,
            "collect_seconds_per_update": timings["collect"] / updates,
            "train_seconds_per_update": timings["train"] / updates,
            "collectives_per_update": timings["collectives"] / updates,
            "payload_bytes_per_update": timings["payload"] / updates,
            "collective_seconds_per_update": timings["collective_seconds"] / updates,
            "actor_parameters": sum(param.numel() for param in model.actor_parameters),
        }
        Path(out).write_text(json.dumps(record), encoding="utf-8")
    if world_size > 1:
        dist.destroy_process_group()


def _all_reduce_worker(rank: int, world_size: int, port: int, out: str) -> None:
    _join(rank, world_size, port)
    seconds = {}
    for size in PAYLOAD_SIZES:
        payload = torch.ones(size)
        dist.all_reduce(payload)  # warm-up
        times = []
        for _ in range(ALL_REDUCE_REPEATS):
            start = time.perf_counter()
            dist.all_reduce(payload)
            times.append(time.perf_counter() - start)
        seconds[size] = float(np.median(times))
    if rank == 0:
        Path(out).write_text(json.dumps({"processes": world_size, "seconds": seconds}), encoding="utf-8")
    dist.destroy_process_group()


def _spawn(worker: Any, world_size: int, *args: Any) -> dict[str, Any]:
    out = Path(f"/tmp/bench_distributed_{os.getpid()}_{worker.__name__}_{world_size}.json")
    mp.spawn(worker, args=(world_size, free_port(), *args, str(out)), nprocs=world_size, join=True)
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    out.unlink()
    return result


def estimate(row: dict[str, Any], machines: int, latency: float, bandwidth: float) -> dict[str, float]:
    """
    Throughput on ``machines`` machines (one process each) from one measured process count, on paper.

    Per update each machine collects as measured (weak scaling) and computes as measured without its collectives; each
    collective is a ring all-reduce, ``2 (P - 1)`` messages of latency ``latency`` and ``2 (P - 1) / P`` times the
    payload over ``bandwidth`` bytes per second.

    :param row: a measured row (its per-update collect, train and collective figures)
    :param machines: the number of machines ``P``
    :param latency: seconds per message
    :param bandwidth: bytes per second per link
    :return: the seconds per update, of which communication, and the samples per second
    """
    compute = row["collect_seconds_per_update"] + row["train_seconds_per_update"] - row["collective_seconds_per_update"]
    hops = 2 * (machines - 1)
    communication = (
        row["collectives_per_update"] * hops * latency + hops / machines * row["payload_bytes_per_update"] / bandwidth
    )
    per_machine = row["samples_per_update"] / row["processes"]
    seconds = compute + communication
    return {"seconds": seconds, "communication": communication, "samples_per_second": machines * per_machine / seconds}


def estimate_table(row: dict[str, Any], machine_counts: list[int], latency: float, bandwidth: float) -> str:
    """The on-paper estimate as a markdown table."""
    lines = [
        f"| machines | s / update | of which communication | samples / s (network: {latency * 1e6:.0f} us per message, "
        f"{bandwidth / 1e9:.2f} GB/s) |",
        "|---|---|---|---|",
    ]
    for machines in machine_counts:
        guess = estimate(row, machines, latency, bandwidth)
        lines.append(
            f"| {machines} | {guess['seconds']:.2f} | {guess['communication']:.3f} | {guess['samples_per_second']:.0f} |"
        )
    return "\n".join(lines)


def tables(throughput: list[dict[str, Any]], all_reduce: list[dict[str, Any]]) -> str:
    """The two markdown tables of the docs (docs/guide/scaling_out.md) and benchmarks/README.md."""
    lines = [
        "| processes | samples / update | samples / s | speed-up | collect s / update | train() s / update "
        "| collectives / update | payload KiB / update | collective s / update |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = throughput[0]["samples_per_second"]
    for row in throughput:
        lines.append(
            f"| {row['processes']} | {row['samples_per_update']} | {row['samples_per_second']:.0f} "
            f"| {row['samples_per_second'] / base:.2f}x | {row['collect_seconds_per_update']:.2f} "
            f"| {row['train_seconds_per_update']:.2f} | {row['collectives_per_update']:.0f} "
            f"| {row['payload_bytes_per_update'] / 1024:.0f} | {row['collective_seconds_per_update']:.3f} |"
        )
    lines += ["", "| processes | " + " | ".join(f"{size:,} floats" for size in PAYLOAD_SIZES) + " |"]
    lines.append("|---|" + "---|" * len(PAYLOAD_SIZES))
    for row in all_reduce:
        cells = " | ".join(f"{row['seconds'][str(size)] * 1e3:.3f} ms" for size in PAYLOAD_SIZES)
        lines.append(f"| {row['processes']} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--n-steps", type=int, default=512)
    parser.add_argument("--n-envs", type=int, default=1)
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--latency-us", type=float, default=50.0, help="network latency per message, for the estimate")
    parser.add_argument("--bandwidth-gbps", type=float, default=10.0, help="network bandwidth, for the estimate")
    parser.add_argument("--machines", default="8,64", help="machine counts of the on-paper estimate")
    args = parser.parse_args(argv)
    settings = {"updates": args.updates, "n_steps": args.n_steps, "n_envs": args.n_envs, "delay": args.delay_ms / 1e3}
    counts = [int(count) for count in args.processes.split(",")]
    throughput = [_spawn(_throughput_worker, count, settings) for count in counts]
    all_reduce = [_spawn(_all_reduce_worker, count) for count in counts if count > 1]
    result = tables(throughput, all_reduce)
    distributed_rows = [row for row in throughput if row["processes"] > 1]
    if distributed_rows:
        machine_counts = [int(count) for count in args.machines.split(",")]
        result += "\n\n" + estimate_table(
            distributed_rows[0], machine_counts, args.latency_us / 1e6, args.bandwidth_gbps * 1e9 / 8
        )
    print(result)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"meta": machine_description(), "settings": settings, "throughput": throughput, "all_reduce": all_reduce}
        args.out.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
