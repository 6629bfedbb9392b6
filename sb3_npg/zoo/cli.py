"""``sb3-npg-zoo`` / ``python -m sb3_npg.zoo``: the RL Zoo's scripts with ``npg``, ``npg_trpo``, ``acktr`` registered.

    sb3-npg-zoo train --algo npg --env CartPole-v1
    sb3-npg-zoo train --algo npg_trpo --env Pendulum-v1 -optimize --n-trials 20 --n-jobs 2 \\
        --storage sqlite:///npg.db --study-name pendulum
    sb3-npg-zoo enjoy --algo npg --env CartPole-v1 -f logs/ --no-render
    sb3-npg-zoo record_video --algo npg_trpo --env Pendulum-v1 -f logs/ -n 1000

Every flag after the sub-command is the Zoo's own and means what it means there. One default differs: for our
names, ``train`` reads our shipped hyperparameter file unless ``-conf``/``--conf-file`` is given (the Zoo's own files
stay the default for its algorithms, sb3-contrib's ``trpo`` included). One behaviour differs: without a display
(Matplotlib's backend is non-interactive: ``MPLBACKEND=Agg``, or no ``DISPLAY`` on Linux), ``plot_train``,
``plot_from_file`` and ``all_plots`` save each figure they would show as a PNG in the current directory and print
its path, where the Zoo would show nothing (see :func:`save_figures`).
"""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from sb3_npg.zoo.registry import ZOO_ALGOS, hyperparams_path, register

PROG = "sb3-npg-zoo"
CONF_FLAGS = ("-conf", "--conf-file")
HELP_FLAGS = ("-h", "--help")
#: The exit status of a bad command line (argparse's).
USAGE_ERROR = 2
#: The Zoo's default ``--algo``, when the command line gives none.
ZOO_DEFAULT_ALGO = "ppo"
#: How the Zoo's ``record_training`` records each model: a fresh ``python`` from ``PATH``, which knows none of our names.
ZOO_RECORD_VIDEO = ("python", "-m", "rl_zoo3.record_video")
#: Matplotlib's built-in backends that cannot show a figure (``BackendFilter.NON_INTERACTIVE`` from Matplotlib 3.9).
NON_INTERACTIVE_BACKENDS = frozenset({"agg", "cairo", "pdf", "pgf", "ps", "svg", "template"})


def _function(module: str, name: str) -> Callable[[], None]:
    def run() -> None:
        getattr(__import__(module, fromlist=[name]), name)()

    return run


def _module(module: str) -> Callable[[], None]:
    def run() -> None:
        runpy.run_module(module, run_name="__main__", alter_sys=True)

    return run


def through_this_cli(command: Sequence[str]) -> list[str]:
    """
    A command of the Zoo's ``record_training``, with its ``record_video`` runs sent through this CLI.

    :param command: the command ``record_training`` passes to ``subprocess.call``
    :return: ``record_video`` in this interpreter with our algorithms registered; any other command unchanged
    """
    if tuple(command[: len(ZOO_RECORD_VIDEO)]) == ZOO_RECORD_VIDEO:
        return [sys.executable, "-m", "sb3_npg.zoo", "record_video", *command[len(ZOO_RECORD_VIDEO) :]]
    return list(command)


def _record_training() -> None:
    """The Zoo's ``record_training``, its ``record_video`` sub-processes rewritten by :func:`through_this_cli`."""
    call = subprocess.call

    def redirected(command: Sequence[str], *args: Any, **kwargs: Any) -> int:
        return call(through_this_cli(command), *args, **kwargs)

    # The Zoo's script calls ``subprocess.call``, looked up in the module at each call.
    subprocess.call = redirected  # type: ignore[assignment]
    try:
        _module("rl_zoo3.record_training")()
    finally:
        subprocess.call = call


def has_display() -> bool:
    """
    Whether Matplotlib can show figures here: its backend (as resolved: with no ``DISPLAY`` on Linux its automatic
    choice is ``agg``) is not one of :data:`NON_INTERACTIVE_BACKENDS`.

    :return: ``False`` where ``plt.show()`` would show nothing
    """
    import matplotlib

    return matplotlib.get_backend().lower() not in NON_INTERACTIVE_BACKENDS


def save_figures(prefix: str, directory: Path | None = None) -> list[Path]:
    """
    Save every open figure as ``<prefix>-<its label>.png`` (``<prefix>-figure-<number>.png`` without a label), then
    close it; what the plotting sub-commands do instead of ``plt.show()`` without a display.

    :param prefix: the start of each file name (the sub-command)
    :param directory: where the files go (default: the current directory); an existing file of the same name is
        replaced
    :return: the paths written, absolute, in the order of the figures
    """
    from matplotlib import pyplot as plt

    directory = Path.cwd() if directory is None else directory
    paths: list[Path] = []
    for number in plt.get_fignums():
        figure = plt.figure(number)
        label = re.sub(r"[^a-z0-9]+", "-", str(figure.get_label()).lower()).strip("-") or f"figure-{number}"
        path = (directory / f"{prefix}-{label}.png").absolute()
        if path in paths:
            path = path.with_name(f"{prefix}-{label}-{number}.png")
        figure.savefig(path)
        plt.close(figure)
        paths.append(path)
    return paths


def _saving_figures_without_display(name: str, run: Callable[[], None]) -> Callable[[], None]:
    """A Zoo plotting script whose ``plt.show()`` saves the figures (:func:`save_figures`) when there is no display."""

    def run_and_save() -> None:
        from matplotlib import pyplot as plt

        if has_display():
            run()
            return
        show = plt.show

        def save(*args: Any, **kwargs: Any) -> None:
            for path in save_figures(name):
                print(f"{PROG} {name}: no display (Matplotlib backend {plt.get_backend()!r}): saved {path}")

        # The Zoo's scripts call ``plt.show``, looked up in the module at each call.
        plt.show = save
        try:
            run()
        finally:
            plt.show = show

    return run_and_save


#: Sub-command -> the Zoo's script (a function, or a module that runs as ``__main__``).
SCRIPTS: dict[str, Callable[[], None]] = {
    "train": _function("rl_zoo3.train", "train"),
    "enjoy": _function("rl_zoo3.enjoy", "enjoy"),
    "record_video": _module("rl_zoo3.record_video"),
    "record_training": _record_training,
    "plot_train": _saving_figures_without_display("plot_train", _function("rl_zoo3.plots.plot_train", "plot_train")),
    "plot_from_file": _saving_figures_without_display(
        "plot_from_file", _function("rl_zoo3.plots.plot_from_file", "plot_from_file")
    ),
    "all_plots": _saving_figures_without_display("all_plots", _function("rl_zoo3.plots.all_plots", "all_plots")),
}

#: Sub-command -> its one-line summary in ``--help`` (the same keys as :data:`SCRIPTS`).
SUMMARIES: dict[str, str] = {
    "train": "train an agent (or tune its hyperparameters with -optimize)",
    "enjoy": "run a trained agent",
    "record_video": "record a video of a trained agent",
    "record_training": "record a video of each checkpoint, the final and the best model of a run",
    "plot_train": "plot the training episode returns of runs (Monitor logs)",
    "plot_from_file": "plot the results saved by all_plots -o",
    "all_plots": "gather the evaluations of runs, plot them and print a table",
}
USAGE = f"usage: {PROG} {{{','.join(SCRIPTS)}}} [RL Zoo flags ...]"
#: The plain-text part of ``--help`` after the sub-commands (the module docstring is reStructuredText for Sphinx).
HELP_DETAILS = f"""\
Every flag after the sub-command is the RL Zoo's own and means what it means there
({PROG} <sub-command> --help lists them). One default differs: for npg, npg_trpo and acktr, train
reads sb3-npg's shipped hyperparameter file unless -conf/--conf-file is given (the Zoo's own files stay
the default for its algorithms, sb3-contrib's trpo included). Without a display (MPLBACKEND=Agg, or
no DISPLAY on Linux), plot_train, plot_from_file and all_plots save each figure as a PNG in the current
directory and print its path. python -m sb3_npg.zoo is the same command.

examples:
  {PROG} train --algo npg --env CartPole-v1
  {PROG} train --algo npg_trpo --env Pendulum-v1 -optimize --n-trials 20 --n-jobs 2 \\
      --storage sqlite:///npg.db --study-name pendulum
  {PROG} enjoy --algo npg --env CartPole-v1 -f logs/ --no-render
  {PROG} record_video --algo npg_trpo --env Pendulum-v1 -f logs/ -n 1000
  {PROG} plot_train --algo npg --env CartPole-v1 -f logs/"""


def help_text() -> str:
    """
    The plain-text ``--help`` of ``sb3-npg-zoo``: usage, one line per sub-command, how flags pass through, examples.

    :return: the text, without a trailing newline
    """
    width = max(map(len, SUMMARIES))
    lines = [f"  {name:<{width}}  {summary}" for name, summary in SUMMARIES.items()]
    title = "The RL Zoo's scripts with sb3-npg's algorithms (npg, npg_trpo, acktr) registered."
    return "\n".join([USAGE, "", title, "", "sub-commands:", *lines, "", HELP_DETAILS])


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


def _fail(message: str) -> NoReturn:
    """Exit as argparse does on a bad command line: the usage and the message on stderr, status 2."""
    print(USAGE, file=sys.stderr)
    print(f"{PROG}: {message}", file=sys.stderr)
    raise SystemExit(USAGE_ERROR)


def main(argv: Sequence[str] | None = None) -> None:
    """
    Run a Zoo script with our algorithms registered.

    :param argv: the command line after the program name (default: ``sys.argv[1:]``)
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        _fail(f"a sub-command is required (choose from {', '.join(SCRIPTS)}); {PROG} --help says more")
    if args[0] in HELP_FLAGS:
        print(help_text())
        return
    if args[0] not in SCRIPTS:
        _fail(f"unknown sub-command {args[0]!r} (choose from {', '.join(SCRIPTS)})")
    script, rest = args[0], args[1:]
    register()
    if script == "train":
        rest = with_default_config(rest)
    sys.argv = [f"{PROG} {script}", *rest]
    SCRIPTS[script]()
