"""How often a two-rank run aborts while its processes exit, by how the process group was created and how the script
ends.

A trial fails when a rank dies by a signal at exit (SIGABRT: "terminate called without an active exception", a gloo
thread still running while the interpreter finalizes) or ends with another exit status than the script's own.

Launched by ``torchrun`` (two ranks on gloo, ``NPG(..., distributed=True)`` on CartPole-v1, the model joins the group
torchrun describes; issue 35), by how the user's script ends:

- ``destroy``: ``learn(512)``, then the script calls ``torch.distributed.destroy_process_group()`` itself (exit 0);
- ``end``: ``learn(512)``, then the script just ends, as user scripts do (exit 0);
- ``raise``: ``learn(512)``, then an uncaught exception (exit 1 on each rank, so torchrun exits 1: no signal allowed);
- ``refused``: the constructor refuses an option (``cg_damping=-1``) after joining the group; the script catches the
  ``ConfigurationError`` and ends (exit 0).

Started by ``mp.spawn`` (the first measurement, 2026-12-04): both ranks build the model, ``learn()`` refuses unequal
rollouts after its first collectives, the rank destroys the group itself and exits:

- ``model``: the model joins the group from torchrun's environment variables, normal exit;
- ``user``: ``torch.distributed.init_process_group`` is called before the model is built, normal exit (with torch
  2.13 the group then survives ``destroy_process_group``);
- ``user-os-exit``: as ``user``, but the ranks end with ``os._exit`` (what the test suite's ranks do).

Failures depend on timing: run it on a loaded machine (``--load N`` adds N busy processes for the run's duration)::

    python -m benchmarks.distributed_exit --trials 12 --load 2 --ways destroy end raise refused

Prints a table and writes ``benchmarks/results/distributed_exit.json`` (``--out``), which records which copy of
``sb3_npg`` ran (to measure an older commit, run this script from an export of that commit).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.common import REPOSITORY, free_port, portable_path, write_results

WORLD_SIZE = 2
#: Ways launched by torchrun: the script's end, and torchrun's exit status when nothing aborts.
TORCHRUN_WAYS = {"destroy": 0, "end": 0, "raise": 1, "refused": 0}
SPAWN_WAYS = ("model", "user", "user-os-exit")
WAYS = (*TORCHRUN_WAYS, *SPAWN_WAYS)
#: Steps requested from ``learn()`` (torchrun ways: the issue's script; spawn ways: refused before the first update).
TORCHRUN_STEPS = 512
STEPS = 4 * 64
#: What a rank that aborts at exit prints (C++'s std::terminate).
ABORT_MESSAGE = "terminate called"
#: What torchrun prints about a rank killed by SIGABRT.
ABORT_EXIT_CODE = "exitcode  : -6"
#: How much of a failed trial's output the results file keeps (characters).
OUTPUT_TAIL = 1500
#: The longest a trial may take before it counts as hung (seconds).
TRIAL_TIMEOUT = 300
#: The longest a busy-loop load process lives (seconds), should this script be killed before it ends them.
LOAD_LIFETIME = 3 * 3600
DEFAULT_OUT = REPOSITORY / "benchmarks" / "results" / "distributed_exit.json"


class RaisedOnPurpose(RuntimeError):
    """The ``raise`` way's uncaught exception."""


def _torchrun_rank(way: str) -> None:
    """One rank of a torchrun trial: the user's script, ending as ``way`` says."""
    from sb3_npg import NPG
    from sb3_npg.common import ConfigurationError

    torch.set_num_threads(1)
    options: dict[str, Any] = {"n_steps": 64, "policy_kwargs": {"net_arch": [8]}, "device": "cpu", "distributed": True}
    if way == "refused":
        try:
            NPG("MlpPolicy", "CartPole-v1", cg_damping=-1.0, **options)
        except ConfigurationError:
            pass
        return
    model = NPG("MlpPolicy", "CartPole-v1", **options)
    model.learn(TORCHRUN_STEPS)
    if way == "destroy":
        dist.destroy_process_group()
    elif way == "raise":
        raise RaisedOnPurpose("the user's script fails after learn()")


def _spawn_rank(rank: int, port: int, way: str) -> None:
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
    """Run one two-rank trial; what went wrong (a signal, an unexpected exit status, a hang), or None."""
    return _trial(way)[0]


def _trial(way: str) -> tuple[str | None, str]:
    """:func:`trial`'s outcome, and the end of torchrun's output when it went wrong."""
    if way in SPAWN_WAYS:
        try:
            mp.spawn(_spawn_rank, args=(free_port(), way), nprocs=WORLD_SIZE, join=True)
        except mp.ProcessExitedException as error:
            code = error.exit_code
            return (signal.Signals(-code).name if code < 0 else f"exit code {code}"), str(error)
        return None, ""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD_SIZE),
        "--master-port", str(free_port()), "-m", "benchmarks.distributed_exit", "--rank-of", way,
    ]  # fmt: skip
    here = str(Path(__file__).resolve().parent.parent)  # this copy's sb3_npg and benchmarks, not the installed one
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TRIAL_TIMEOUT, env=env, cwd=here)
    except subprocess.TimeoutExpired:
        return "hung", ""
    output = done.stdout + done.stderr
    tail = "\n".join(line for line in output.splitlines() if "Warning" not in line)[-OUTPUT_TAIL:]
    if ABORT_MESSAGE in output or ABORT_EXIT_CODE in output:
        return "SIGABRT", tail
    if done.returncode != TORCHRUN_WAYS[way]:
        return f"torchrun exit code {done.returncode}", tail
    return None, ""


def _start_load(processes: int) -> list[subprocess.Popen[bytes]]:
    """``processes`` busy loops, each ending by itself after :data:`LOAD_LIFETIME` at the latest."""
    loop = f"import time\nend = time.monotonic() + {LOAD_LIFETIME}\nwhile time.monotonic() < end:\n    pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(processes)]


def _load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=12, help="two-rank runs per way")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(TORCHRUN_WAYS))
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes to run beside the trials")
    parser.add_argument("--label", default="", help="what this run measures (such as the commit), for the JSON")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON results file")
    parser.add_argument("--rank-of", choices=list(TORCHRUN_WAYS), help=argparse.SUPPRESS)  # a torchrun rank
    args = parser.parse_args()
    if args.rank_of is not None:
        _torchrun_rank(args.rank_of)
        return
    import sb3_npg

    load = _start_load(args.load)
    results = []
    try:
        print(f"{'way':<14} {'failed':>10}  outcomes", flush=True)
        for way in args.ways:
            start, load_before = time.monotonic(), _load_average()
            runs = [_trial(way) for _ in range(args.trials)]
            failures = Counter(outcome for outcome, _ in runs if outcome is not None)
            print(f"{way:<14} {sum(failures.values()):>4} of {args.trials:<3}  {dict(failures)}", flush=True)
            results.append(
                {
                    "way": way,
                    "trials": args.trials,
                    "failed": sum(failures.values()),
                    "failures": dict(failures),
                    "seconds": round(time.monotonic() - start, 1),
                    "load_average_1min": [round(load_before, 2), round(_load_average(), 2)],
                    "first_failure_output": next((tail for outcome, tail in runs if outcome is not None), ""),
                }
            )
    finally:
        for process in load:
            process.kill()
            process.wait()
    run = {"label": args.label, "sb3_npg": portable_path(Path(sb3_npg.__file__).parent), "load_processes": args.load}
    write_results(args.out, [{**run, **result} for result in results])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
