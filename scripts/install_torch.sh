#!/bin/sh
# Installs torch into a virtual environment, as `make` does before the project (the Makefile's `$(BIN)/python` rule):
#
#   scripts/install_torch.sh PYTHON SPEC      e.g. scripts/install_torch.sh .venv/bin/python torch==2.13.0
#
# - Linux without a working NVIDIA GPU (no `nvidia-smi`, or it lists no GPU): the CPU build, from PyTorch's CPU wheel
#   index, so pip never downloads the multi-GB CUDA build PyPI serves on Linux x86_64. When that index cannot be
#   reached within TORCH_PROBE_TIMEOUT_S seconds (a firewall, a proxy, no network but a local mirror), torch comes from
#   pip's default index instead, with a message saying so and how to force the CPU build.
# - Linux with an NVIDIA GPU, macOS and anything else: pip's default index (PyPI's build: CUDA-enabled on Linux x86_64;
#   macOS has no CUDA build).
#
# Environment: TORCH_CPU_INDEX (default https://download.pytorch.org/whl/cpu), TORCH_PROBE_TIMEOUT_S (default 5),
# INSTALL_TORCH_DRY_RUN=1 prints the pip command instead of running it (the decision, probe included, is made as usual).
# To pass pip arguments of your own, set the Makefile's TORCH_PIP_ARGS: make then runs pip itself, not this script.
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 PYTHON SPEC" >&2
    exit 2
fi
python=$1
spec=$2
cpu_index=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
probe_timeout=${TORCH_PROBE_TIMEOUT_S:-5}

say() {
    echo "install_torch: $*"
}

pip_install() {
    if [ "${INSTALL_TORCH_DRY_RUN:-0}" = 1 ]; then
        echo "+ $python -m pip install $*"
    else
        "$python" -m pip install "$@"
    fi
}

# An NVIDIA GPU this machine can use: `nvidia-smi -L` lists at least one. (Not /proc/driver/nvidia: a container
# sees the host's driver there even when it was given no GPU.)
has_nvidia_gpu() {
    command -v nvidia-smi >/dev/null 2>&1 || return 1
    gpus=$(nvidia-smi -L 2>/dev/null) || return 1
    case $gpus in
        *GPU*) return 0 ;;
        *) return 1 ;;
    esac
}

# Whether the index answers within the timeout, DNS included (a thread bounds the whole attempt, not each step).
index_reachable() {
    "$python" - "$1/torch/" "$probe_timeout" <<'EOF'
import os, sys, threading, urllib.request

url, timeout = sys.argv[1], float(sys.argv[2])
answered = []


def probe():
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            answered.append(response.status == 200)
    except Exception:
        pass


thread = threading.Thread(target=probe, daemon=True)
thread.start()
thread.join(timeout)
os._exit(0 if answered == [True] else 1)
EOF
}

system=$(uname -s)
if [ "$system" != Linux ]; then
    say "$system: torch from pip's default index (no CUDA build there)"
    pip_install "$spec"
elif has_nvidia_gpu; then
    say "NVIDIA GPU found (nvidia-smi -L): torch from pip's default index, the CUDA build on Linux x86_64"
    pip_install "$spec"
elif index_reachable "$cpu_index"; then
    say "no NVIDIA GPU: the CPU build of torch from $cpu_index"
    pip_install --index-url "$cpu_index" "$spec"
else
    say "no NVIDIA GPU, but $cpu_index did not answer within ${probe_timeout} s: torch from pip's default index"
    say "(on Linux x86_64 PyPI's build is the CUDA one, about 3 GB, unless pip finds a CPU build elsewhere;"
    say " to force the CPU build: make TORCH_PIP_ARGS=\"--index-url <a reachable CPU wheel index>\")"
    pip_install "$spec"
fi
