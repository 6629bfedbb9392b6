"""The sdist and the wheel build, pass ``twine check`` and carry the license; the extras install what the commands need.

The slow test keeps the promise end to end: in a fresh virtual environment, ``pip install "sb3-npg[zoo]"`` gives an
``sb3-npg-zoo`` whose every sub-command runs.
"""

import email.parser
import importlib.metadata
import importlib.util
import os
import shlex
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from packaging.requirements import Requirement

from sb3_npg.zoo.cli import SCRIPTS

ROOT = Path(__file__).resolve().parent.parent
MISSING_TOOLS = [tool for tool in ("build", "twine") if importlib.util.find_spec(tool) is None]
#: Building isolates itself and installs setuptools: minutes at worst on a slow index.
BUILD_TIMEOUT_S = 600
#: One ``pip install`` of the project with the zoo extra into an empty environment (torch excluded).
INSTALL_TIMEOUT_S = 1200
#: One Zoo sub-command on a tiny budget.
COMMAND_TIMEOUT_S = 300
#: The tiny training run the other sub-commands read: steps, rollout length, and steps of enjoy/record_video.
TRAIN_STEPS, ROLLOUT_STEPS, PLAY_STEPS = 256, 64, 10
ENV_ID = "CartPole-v1"

#: (extra, a requirement it must hold, as ``name[extras]``): what each command needs (see pyproject.toml).
EXTRA_REQUIREMENTS = [
    ("zoo", "rl_zoo3[plots]"),  # plot_train, all_plots, plot_from_file: scipy, seaborn, pandas<3
    ("zoo", "gymnasium[classic-control]"),  # record_video renders the classic-control environments with pygame
    ("zoo", "moviepy"),  # record_video writes the video
    ("tensorboard", "tensorboard"),  # tensorboard_log=... in the constructors
    ("all", "sb3-npg[tensorboard]"),
]

needs_tools = pytest.mark.skipif(bool(MISSING_TOOLS), reason=f"needs {' and '.join(MISSING_TOOLS)} (the dev extra)")


def _run(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    assert completed.returncode == 0, f"{shlex.join(command)}\n{completed.stdout[-4000:]}\n{completed.stderr[-4000:]}"
    return completed


@pytest.fixture(scope="session")
def dists(tmp_path_factory):
    """
    The sdist and the wheel (built from the sdist), as ``pip`` and ``make package`` build them.

    Built once per session: xdist workers share the folder (the build writes ``sb3_npg.egg-info`` in the source tree,
    so two at once would race).
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        out = tmp_path_factory.mktemp("dist")
    else:
        out = tmp_path_factory.getbasetemp().parent / "dist"  # this session's folder, above each worker's
    with FileLock(f"{out}.lock"):
        if not any(out.glob("*.whl")):
            _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], BUILD_TIMEOUT_S)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


def _requirements(metadata, extra: str) -> list[Requirement]:
    """The requirements an extra adds."""
    requirements = [Requirement(line) for line in metadata.get_all("Requires-Dist")]
    return [req for req in requirements if req.marker is not None and req.marker.evaluate({"extra": extra})]


@needs_tools
def test_sdist_and_wheel_pass_twine_check(dists):
    _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dists)], BUILD_TIMEOUT_S)


@needs_tools
def test_both_carry_the_license_and_the_sdist_leaves_the_tests_to_the_repository(dists):
    sdist, wheel = dists
    with tarfile.open(sdist) as archive:
        files = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert "LICENSE" in files and "sb3_npg/zoo/hyperparams/npg.yml" in files
    assert not any(name.startswith("tests") for name in files)  # they need conftest.py, benchmarks/, examples/...
    with zipfile.ZipFile(wheel) as archive:
        assert any(name.endswith(".dist-info/licenses/LICENSE") for name in archive.namelist())
    metadata = _metadata(wheel)
    assert metadata["License-Expression"] == "MIT" and metadata.get_all("License-File") == ["LICENSE"]
    assert not any(classifier.startswith("License ::") for classifier in metadata.get_all("Classifier"))


@needs_tools
@pytest.mark.parametrize(("extra", "requirement"), EXTRA_REQUIREMENTS)
def test_extras_hold_what_their_commands_need(dists, extra, requirement):
    wanted = Requirement(requirement)
    found = _requirements(_metadata(dists[1]), extra)
    assert any(req.name == wanted.name and wanted.extras <= req.extras for req in found), [str(req) for req in found]


def test_rl_zoo3_plots_extra_brings_scipy_and_pins_pandas_below_3():
    """The zoo extra leans on rl_zoo3's ``plots`` extra: it must exist in the rl_zoo3 we install."""
    plots = {req.name: req for req in _requirements(importlib.metadata.metadata("rl_zoo3"), "plots")}
    assert "scipy" in plots and "seaborn" in plots
    assert not plots["pandas"].specifier.contains("3.0")


def _torch_install_command(python: Path) -> list[str]:
    """Install the torch this environment runs (the CPU build ``make`` installs first, see the Makefile)."""
    extra_args = shlex.split(os.environ.get("TORCH_PIP_ARGS", ""))
    return [str(python), "-m", "pip", "install", *extra_args, f"torch=={torch.__version__}"]


def _zoo(bin_dir: Path, *args: str, cwd: Path) -> None:
    env = {**os.environ, "MPLBACKEND": "Agg"}  # without a display, the plot commands save their figures in cwd
    _run([str(bin_dir / "sb3-npg-zoo"), *args], COMMAND_TIMEOUT_S, cwd=cwd, env=env)


@pytest.mark.slow
@needs_tools
def test_every_zoo_sub_command_runs_after_installing_the_zoo_extra_in_a_clean_venv(dists, tmp_path):
    wheel = dists[1]
    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    python = bin_dir / "python"
    _run(_torch_install_command(python), INSTALL_TIMEOUT_S)
    _run([str(python), "-m", "pip", "install", f"{wheel}[zoo]"], INSTALL_TIMEOUT_S)

    _zoo(bin_dir, "--help", cwd=tmp_path)
    for script in SCRIPTS:
        _zoo(bin_dir, script, "--help", cwd=tmp_path)  # imports the Zoo's script: every module it needs is there
    common = ["--algo", "npg", "--env", ENV_ID, "-f", "logs"]
    tiny = ["--seed", "0", "-params", f"n_steps:{ROLLOUT_STEPS}", "policy_kwargs:dict(net_arch=[16])"]
    _zoo(bin_dir, "train", *common, "-n", str(TRAIN_STEPS), *tiny, cwd=tmp_path)
    _zoo(bin_dir, "enjoy", *common, "--no-render", "-n", str(PLAY_STEPS), cwd=tmp_path)
    _zoo(bin_dir, "record_video", *common, "-n", str(PLAY_STEPS), "-o", "videos", cwd=tmp_path)
    assert [path.suffix for path in (tmp_path / "videos").iterdir()] == [".mp4"]
    _zoo(bin_dir, "plot_train", "-a", "npg", "-e", ENV_ID, "-f", "logs", cwd=tmp_path)

    _run([str(python), "-m", "pip", "install", f"{wheel}[tensorboard]"], INSTALL_TIMEOUT_S)
    _run([str(python), "-c", "import tensorboard"], COMMAND_TIMEOUT_S)


def test_the_description_names_all_three_algorithms():
    import tomllib

    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    assert all(name in description for name in ("NPG", "TRPO", "ACKTR")), description
