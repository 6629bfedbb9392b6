"""Behaviour pinned across refactorings: the parameters after five updates equal those recorded by an earlier version.

Each recording (``tests/data/parameters_after_5_updates_<CPU capability>.pt``) holds, for each case below, every policy
parameter after ``learn(5 * n_steps)`` with seed 0, and the torch version and CPU capability it was made with. On the
torch and CPU capability of a recording the parameters must match it bit for bit. Elsewhere (other kernels round
differently) they must be within :data:`OTHER_MACHINE_RTOL` of the first recording, except the cases of
:data:`ROUNDING_AMPLIFIERS`, whose steps turn a rounding difference into a different trajectory within five updates:
those are skipped there, with a message saying how to record the machine.

A change that is meant to change the update (a bug fix, a new default) re-records this machine's file, deletes the
recordings it cannot remake (a machine of that CPU capability records it again), and says so in its commit:

    .venv/bin/python -m tests.test_regression --record
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import torch

from sb3_npg import NPG, TRPO

RECORDINGS = Path(__file__).parent / "data"
RECORDING_PREFIX = "parameters_after_5_updates_"
UPDATES = 5
TINY = {"n_steps": 64, "batch_size": 32, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}
#: Relative tolerance when the recording comes from another torch version or CPU capability.
OTHER_MACHINE_RTOL = 1e-4
#: name -> (algorithm, environment, options): the issue's four (NPG and TRPO on Discrete and Box), then the options
#: that take other paths through an update.
CASES: dict[str, tuple[type, str, dict[str, Any]]] = {
    "npg-discrete": (NPG, "CartPole-v1", {}),
    "npg-box": (NPG, "Pendulum-v1", {}),
    "trpo-discrete": (TRPO, "CartPole-v1", {}),
    "trpo-box": (TRPO, "Pendulum-v1", {}),
    "trpo-box-policy-batches": (TRPO, "Pendulum-v1", {"policy_batch_size": 24}),
    "npg-discrete-autograd-fisher-sub-sampled": (NPG, "CartPole-v1", {"fisher": "autograd", "fisher_sub_sampling_factor": 3}),
    "trpo-box-autograd-fisher-sub-sampled": (TRPO, "Pendulum-v1", {"fisher": "autograd", "fisher_sub_sampling_factor": 3}),
    "trpo-box-fast": (TRPO, "Pendulum-v1", {"fisher_sub_sampling_factor": 4, "critic_fit": "lbfgs"}),
    "npg-box-gsde-sub-sampled": (NPG, "Pendulum-v1", {"use_sde": True, "sde_sample_freq": 4, "sub_sampling_factor": 2}),
    "trpo-discrete-raw-advantages-unclipped": (TRPO, "CartPole-v1", {"normalize_advantage": False, "max_grad_norm": None}),
    "npg-box-wide-step": (NPG, "Pendulum-v1", {"target_kl": 0.5, "cg_damping": 1e-3}),
    "trpo-box-line-search": (TRPO, "Pendulum-v1", {"target_kl": 0.5, "cg_damping": 1e-3, "line_search_shrinking_factor": 0.5}),
}
#: Cases whose wide steps, line search or L-BFGS critic amplify a rounding difference: on a machine with other kernels
#: their parameters after five updates differ far beyond :data:`OTHER_MACHINE_RTOL` (AVX2 against AVX512), so only a
#: recording of that machine checks them.
ROUNDING_AMPLIFIERS = frozenset({"trpo-box-fast", "npg-box-wide-step", "trpo-box-line-search"})


def parameters_after_updates(name: str) -> torch.Tensor:
    """Every policy parameter, flattened, after :data:`UPDATES` updates of case ``name``."""
    algo, env_id, options = CASES[name]
    model = algo("MlpPolicy", env_id, **{**TINY, **options})
    model.learn(UPDATES * TINY["n_steps"])
    return torch.cat([param.detach().flatten() for param in model.policy.parameters()])


def _machine() -> dict[str, str]:
    return {"torch": str(torch.__version__), "cpu_capability": str(torch.backends.cpu.get_cpu_capability())}


def recording_path(machine: dict[str, str]) -> Path:
    return RECORDINGS / f"{RECORDING_PREFIX}{machine['cpu_capability']}.pt"


@pytest.fixture(scope="module")
def recording() -> dict[str, Any]:
    """This machine's recording if there is one, else the first by name."""
    paths = sorted(RECORDINGS.glob(f"{RECORDING_PREFIX}*.pt"))
    recordings = [torch.load(path, weights_only=True) for path in paths]
    return next((each for each in recordings if each["machine"] == _machine()), recordings[0])


@pytest.mark.parametrize("name", CASES)
def test_parameters_after_five_updates_equal_the_recording(name, recording):
    torch.set_num_threads(1)
    same_machine = recording["machine"] == _machine()
    if not same_machine and name in ROUNDING_AMPLIFIERS:
        pytest.skip(f"{name} is checked only against a recording of this machine: python -m tests.test_regression --record")
    got, want = parameters_after_updates(name), recording["parameters"][name]
    if same_machine:
        assert torch.equal(got, want), f"{name}: largest difference {float((got - want).abs().max()):.3g}"
    else:
        assert torch.allclose(got, want, rtol=OTHER_MACHINE_RTOL, atol=OTHER_MACHINE_RTOL * float(want.abs().max()))


def record() -> None:
    """Write this machine's recording from the code as it is now."""
    torch.set_num_threads(1)
    path = recording_path(_machine())
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"machine": _machine(), "parameters": {name: parameters_after_updates(name) for name in CASES}}, path)
    print(f"recorded {len(CASES)} cases in {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="write the recording from the current code")
    if parser.parse_args().record:
        record()
