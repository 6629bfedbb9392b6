"""``sb3-npg-zoo`` / ``python -m sb3_npg.zoo``: the RL Zoo's scripts with ``npg`` and ``npg_trpo`` registered.

    sb3-npg-zoo train --algo npg --env CartPole-v1
    sb3-npg-zoo train --algo npg_trpo --env Pendulum-v1 -optimize --n-trials 20 --n-jobs 2 \\
        --storage sqlite:///npg.db --study-name pendulum
    sb3-npg-zoo enjoy --algo npg --env CartPole-v1 -f logs/ --no-render
    sb3-npg-zoo record_video --algo npg_trpo --env Pendulum-v1 -f logs/ -n 1000

Every flag after the sub-command is the Zoo's own and means what it means there. One default differs: for our
names, ``train`` reads our shipped hyperparameter file unless ``-conf``/``--conf-file`` is given (the Zoo's own files
stay the default for its algorithms, sb3-contrib's ``trpo`` included).
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable, Sequence

from sb3_npg.zoo.registry import ZOO_ALGOS, hyperparams_path, register

CONF_FLAGS = ("-conf", "--conf-file")
#: The Zoo's default ``--algo``, when the command line gives none.
ZOO_DEFAULT_ALGO = "ppo"


def _function(module: str, name: str) -> Callable[[], None]:
    def run() -> None:
        getattr(__import__(module, fromlist=[name]), name)()

    return run


def _module(module: str) -> Callable[[], None]:
    def run() -> None:
        runpy.run_module(module, run_name="__main__", alter_sys=True)

    return run


#: Sub-command -> the Zoo's script (a function, or a module that runs as ``__main__``).
SCRIPTS: dict[str, Callable[[], None]] = {
    "train": _function("rl_zoo3.train", "train"),
    "enjoy": _function("rl_zoo3.enjoy", "enjoy"),
    "record_video": _module("rl_zoo3.record_video"),
    "record_training": _module("rl_zoo3.record_training"),
    "plot_train": _function("rl_zoo3.plots.plot_train", "plot_train"),
    "plot_from_file": _function("rl_zoo3.plots.plot_from_file", "plot_from_file"),
    "all_plots": _function("rl_zoo3.plots.all_plots", "all_plots"),
}


def _algo(args: Sequence[str]) -> str:
    """The ``--algo`` value of a Zoo command line (both ``--algo X`` and ``--algo=X``)."""
    for index, arg in enumerate(args):
        if arg == "--algo" and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--algo="):
            return arg.split("=", 1)[1]
    return ZOO_DEFAULT_ALGO


def with_default_config(args: Sequence[str]) -> list[str]:
    """
    A ``train`` command line with our shipped hyperparameter file added for our algorithms when none is given.

    :param args: the arguments after ``train``
    :return: the arguments, with ``--conf-file <sb3_npg/zoo/hyperparams/{algo}.yml>`` appended where it applies
    """
    algo = _algo(args)
    has_config = any(arg in CONF_FLAGS or arg.startswith(tuple(f"{flag}=" for flag in CONF_FLAGS)) for arg in args)
    if algo in ZOO_ALGOS and not has_config:
        return [*args, "--conf-file", str(hyperparams_path(algo))]
    return list(args)


def main(argv: Sequence[str] | None = None) -> None:
    """
    Run a Zoo script with our algorithms registered.

    :param argv: the command line after the program name (default: ``sys.argv[1:]``)
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in SCRIPTS:
        print(__doc__, file=sys.stderr)
        print(f"usage: sb3-npg-zoo {{{','.join(SCRIPTS)}}} [RL Zoo flags ...]", file=sys.stderr)
        raise SystemExit(2)
    script, rest = args[0], args[1:]
    register()
    if script == "train":
        rest = with_default_config(rest)
    sys.argv = [f"sb3-npg-zoo {script}", *rest]
    SCRIPTS[script]()
