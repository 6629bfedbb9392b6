"""How often a two-rank run aborts while its processes exit, by how the process group was created and left.

Each trial is a two-rank ``mp.spawn`` on gloo: both ranks build a distributed NPG on CartPole-v1, rank 1 with twice
the environments, so ``learn()`` refuses the mismatch after its first collectives (the shape of
``tests/test_distributed.py``'s quickest test), then destroy the process group and exit. A trial fails when a rank
dies by a signal (SIGABRT: "terminate called without an active exception"). Ways to create and leave the group:

- ``model``: the model joins the group ``torchrun`` describes (``sb3_npg.common.distributed.init_process_group``),
  normal exit;
- ``user``: ``torch.distributed.init_process_group`` is called before the model is built, normal exit (with torch
  2.13 the group then survives ``destroy_process_group``: the failure this script was written to measure);
- ``user-os-exit``: as ``user``, but the ranks end with ``os._exit`` (what the test suite's ranks do).

Failures depend on timing: run it on a loaded machine (two other busy processes made about one trial in ten fail)::

    python -m benchmarks.distributed_exit --trials 30 --ways model user user-os-exit
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.common import free_port

WAYS = ("model", "user", "user-os-exit")
WORLD_SIZE = 2
#: Steps requested from ``learn()``: the mismatch is refused before the first update.
STEPS = 4 * 64


def _rank_main(rank: int, port: int, way: str) -> None:
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_npg import NPG
    from sb3_npg.common import ConfigurationError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE))
    torch.set_num_threads(1)
    if way != "model":
        dist.init_process_group("gloo")
    env = make_vec_env("CartPole-v1", n_envs=rank + 1, seed=rank)
    model = NPG("MlpPolicy", env, n_steps=64, policy_kwargs={"net_arch": [8]}, device="cpu", distributed=True)
    try:
        model.learn(STEPS)
    except ConfigurationError:
        pass
    dist.destroy_process_group()
    if way == "user-os-exit":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def trial(way: str) -> str | None:
    """Run one two-rank trial; the signal a rank died by, or None."""
    try:
        mp.spawn(_rank_main, args=(free_port(), way), nprocs=WORLD_SIZE, join=True)
    except mp.ProcessExitedException as error:
        return signal.Signals(-error.exit_code).name if error.exit_code < 0 else f"exit code {error.exit_code}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30, help="two-rank runs per way")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    args = parser.parse_args()
    for way in args.ways:
        failures = [outcome for outcome in (trial(way) for _ in range(args.trials)) if outcome is not None]
        print(f"{way}: {len(failures)} of {args.trials} trials failed {sorted(set(failures))}", flush=True)


if __name__ == "__main__":
    main()
