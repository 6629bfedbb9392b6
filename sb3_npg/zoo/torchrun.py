"""Data-parallel training from the command line: the RL Zoo's ``train`` on every rank of a ``torchrun`` launch.

    torchrun --nproc-per-node 4 -m sb3_npg.zoo.torchrun --algo npg --env Hopper-v5 -n 1000000 -f logs --seed 0
    torchrun --nnodes 8 --nproc-per-node 16 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        -m sb3_npg.zoo.torchrun --algo npg_trpo --env Hopper-v5 -n 10000000 -f logs

Every flag is the RL Zoo's ``train`` flag (``-n`` total timesteps over all ranks, ``-f`` log folder, ``--seed``,
``-conf``, ``-params``...), read from the same hyperparameter sources as ``sb3-npg-zoo train``; one is ours:
``--distributed-timeout SECONDS``, how long a rank waits for the others before the run stops with an error.
Each rank trains with ``distributed=True`` added to the hyperparameters and ``--seed`` offset by its rank (its own
environments and noise). Rank 0 logs, evaluates and saves the model (a plain ``.zip``) under ``-f``; the other ranks
write nothing there (their Zoo output goes to a temporary folder, removed at the end) and evaluate nothing.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence

import torch.distributed as dist

from sb3_npg.common.distributed import DEFAULT_TIMEOUT_SECONDS, init_process_group, leave_process_group
from sb3_npg.zoo.cli import SCRIPTS, with_default_config
from sb3_npg.zoo.registry import register

TIMEOUT_FLAG = "--distributed-timeout"
PARAMS_FLAG = "-params"
DISTRIBUTED_PARAM = "distributed:True"
#: The Zoo's flags that a rank other than 0 overrides: no evaluation, no checkpoints.
SILENT_FLAGS = {"--eval-freq": "-1", "--save-freq": "-1"}


def _pop_flag(args: list[str], flag: str) -> str | None:
    """Remove ``flag VALUE`` (or ``flag=VALUE``) from ``args`` and return the value."""
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
            del args[index : index + 2]
            return value
        if arg.startswith(f"{flag}="):
            del args[index]
            return arg.split("=", 1)[1]
    return None


def rank_arguments(args: Sequence[str], rank: int, log_folder: str | None = None) -> list[str]:
    """
    The Zoo ``train`` command line of one rank.

    :param args: the command line given to every rank (without ``--distributed-timeout``)
    :param rank: this rank
    :param log_folder: where a rank other than 0 writes the Zoo's output (ignored for rank 0)
    :return: the arguments with ``distributed:True`` in ``-params``, ``--seed`` plus ``rank``, and for ranks other than
        0 the log folder replaced and evaluation and checkpoints off
    """
    rest = with_default_config(args)
    seed = _pop_flag(rest, "--seed")
    if seed is not None:
        rest += ["--seed", str(int(seed) + rank)]
    if PARAMS_FLAG in rest:
        rest.insert(rest.index(PARAMS_FLAG) + 1, DISTRIBUTED_PARAM)  # the Zoo keeps only the last -params
    else:
        rest += [PARAMS_FLAG, DISTRIBUTED_PARAM]
    if rank != 0:
        for flag in ("-f", "--log-folder", *SILENT_FLAGS):
            _pop_flag(rest, flag)
        rest += ["-f", str(log_folder)]
        for flag, value in SILENT_FLAGS.items():
            rest += [flag, value]
    return rest


def main(argv: Sequence[str] | None = None) -> None:
    """
    Train with the RL Zoo on this rank of a ``torchrun`` launch.

    :param argv: the command line after the program name (default: ``sys.argv[1:]``)
    """
    args = list(sys.argv[1:] if argv is None else argv)
    timeout = _pop_flag(args, TIMEOUT_FLAG)
    init_process_group(float(timeout) if timeout is not None else DEFAULT_TIMEOUT_SECONDS)
    rank = dist.get_rank()
    scratch = tempfile.mkdtemp(prefix=f"sb3_npg_rank{rank}_") if rank != 0 else None
    register()
    sys.argv = ["sb3_npg.zoo.torchrun", *rank_arguments(args, rank, scratch)]
    try:
        SCRIPTS["train"]()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        leave_process_group()  # also registered to run at exit; here it ends the group before the Zoo's own exit


if __name__ == "__main__":
    main()
