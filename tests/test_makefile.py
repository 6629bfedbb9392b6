"""How ``make`` installs torch: the Makefile's ``$(BIN)/python`` rule and ``scripts/install_torch.sh``, in dry runs.

The script runs with ``INSTALL_TORCH_DRY_RUN=1`` (it prints the pip command instead of running it), a ``PATH`` that
holds only ``uname`` and, where a case wants one, a fake ``nvidia-smi``, and a CPU index on localhost (a small HTTP
server, or a closed port for an index that cannot be reached): nothing is downloaded.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install_torch.sh"
SPEC = "torch==2.13.0"
#: Generous next to the ~0.3 s the decision takes when the index cannot be reached (the probe's own limit is 5 s).
UNREACHABLE_LIMIT_S = 4.0

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or shutil.which("sh") is None, reason="the CPU-index choice is made on Linux only"
)


@pytest.fixture
def cpu_index(tmp_path: Path) -> Iterator[str]:
    """A reachable stand-in for PyTorch's CPU wheel index: ``<url>/torch/`` answers 200."""
    (tmp_path / "index" / "whl" / "cpu" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "whl" / "cpu" / "torch" / "index.html").write_text("<html></html>")

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(QuietHandler, directory=str(tmp_path / "index"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def unreachable_index() -> str:
    """An index on a port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"


def _bin_dir(tmp_path: Path, nvidia_smi: str | None) -> Path:
    """A ``PATH`` directory with ``uname`` and, unless ``None``, an ``nvidia-smi`` script with this body."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uname = shutil.which("uname")
    assert uname is not None
    (bin_dir / "uname").symlink_to(uname)
    if nvidia_smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        fake.chmod(0o755)
    return bin_dir


def _install_torch(tmp_path: Path, index: str, nvidia_smi: str | None) -> tuple[str, float]:
    """The script's output in a dry run, and how long it took."""
    env = {
        key: value for key, value in os.environ.items() if not key.lower().endswith("_proxy") and not key.startswith("TORCH_")
    }
    env.update(PATH=str(_bin_dir(tmp_path, nvidia_smi)), INSTALL_TORCH_DRY_RUN="1", TORCH_CPU_INDEX=index)
    start = time.perf_counter()
    completed = subprocess.run(
        [shutil.which("sh") or "sh", str(SCRIPT), sys.executable, SPEC],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    elapsed = time.perf_counter() - start
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout, elapsed


def _pip_command(output: str) -> str:
    (command,) = [line for line in output.splitlines() if line.startswith("+ ")]
    return command


def test_without_an_nvidia_gpu_the_cpu_index_is_used(tmp_path, cpu_index):
    output, _ = _install_torch(tmp_path, cpu_index, nvidia_smi=None)
    assert _pip_command(output) == f"+ {sys.executable} -m pip install --index-url {cpu_index} {SPEC}"


def test_an_nvidia_smi_that_finds_no_gpu_counts_as_no_gpu(tmp_path, cpu_index):
    output, _ = _install_torch(tmp_path, cpu_index, nvidia_smi='echo "NVIDIA-SMI has failed" >&2; exit 9')
    assert f"--index-url {cpu_index}" in _pip_command(output)


def test_with_an_nvidia_gpu_the_default_index_is_used(tmp_path, cpu_index):
    output, _ = _install_torch(tmp_path, cpu_index, nvidia_smi='echo "GPU 0: NVIDIA H100 (UUID: GPU-0)"')
    assert _pip_command(output) == f"+ {sys.executable} -m pip install {SPEC}"
    assert "NVIDIA GPU found" in output


def test_an_unreachable_cpu_index_falls_back_to_the_default_index_in_seconds(tmp_path, unreachable_index):
    output, elapsed = _install_torch(tmp_path, unreachable_index, nvidia_smi=None)
    assert _pip_command(output) == f"+ {sys.executable} -m pip install {SPEC}"
    assert "did not answer" in output and "TORCH_PIP_ARGS" in output
    assert elapsed < UNREACHABLE_LIMIT_S


def _make_dry_run(tmp_path: Path, *overrides: str) -> str:
    """The commands ``make -n`` would run to create a venv (none runs)."""
    env = {key: value for key, value in os.environ.items() if key not in {"TORCH_PIP_ARGS", "MAKEFLAGS", "MFLAGS"}}
    venv = tmp_path / "venv"
    completed = subprocess.run(
        ["make", "-n", "-C", str(ROOT), f"{venv}/bin/python", f"VENV={venv}", *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return completed.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_runs_the_script_unless_torch_pip_args_is_set(tmp_path):
    assert f'sh scripts/install_torch.sh {tmp_path}/venv/bin/python "{SPEC}"' in _make_dry_run(tmp_path)
    given = _make_dry_run(tmp_path, "TORCH_PIP_ARGS=--index-url http://example.invalid/simple")
    assert "install_torch.sh" not in given
    assert f'-m pip install --index-url http://example.invalid/simple "{SPEC}"' in given
    # Set but empty: pip's default index, no detection.
    assert f'-m pip install  "{SPEC}"' in _make_dry_run(tmp_path, "TORCH_PIP_ARGS=")
