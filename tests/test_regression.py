"""Behaviour pinned across refactorings: the parameters after five updates equal those recorded by an earlier version.

The recording (``tests/data/parameters_after_5_updates.pt``) holds, for each case below, every policy parameter after
``learn(5 * n_steps)`` with seed 0, and the torch version and CPU capability it was made with. On the same torch
and CPU capability the parameters must match bit for bit; elsewhere (other kernels may round differently) within
:data:`OTHER_MACHINE_RTOL`.

A change that is meant to change the update (a bug fix, a new default) re-records it, and says so in its commit:

    .venv/bin/python -m tests.test_regression --record
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import torch

from sb3_npg import NPG, TRPO

RECORDING = Path(__file__).parent / "data" / "parameters_after_5_updates.pt"
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


def parameters_after_updates(name: str) -> torch.Tensor:
    """Every policy parameter, flattened, after :data:`UPDATES` updates of case ``name``."""
    algo, env_id, options = CASES[name]
    model = algo("MlpPolicy", env_id, **{**TINY, **options})
    model.learn(UPDATES * TINY["n_steps"])
    return torch.cat([param.detach().flatten() for param in model.policy.parameters()])


def _machine() -> dict[str, str]:
    return {"torch": str(torch.__version__), "cpu_capability": str(torch.backends.cpu.get_cpu_capability())}


@pytest.fixture(scope="module")
def recording() -> dict[str, Any]:
    return torch.load(RECORDING, weights_only=True)


@pytest.mark.parametrize("name", CASES)
def test_parameters_after_five_updates_equal_the_recording(name, recording):
    torch.set_num_threads(1)
    got, want = parameters_after_updates(name), recording["parameters"][name]
    if recording["machine"] == _machine():
        assert torch.equal(got, want), f"{name}: largest difference {float((got - want).abs().max()):.3g}"
    else:
        assert torch.allclose(got, want, rtol=OTHER_MACHINE_RTOL, atol=OTHER_MACHINE_RTOL * float(want.abs().max()))


def record() -> None:
    """Write the recording from the code as it is now."""
    torch.set_num_threads(1)
    RECORDING.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"machine": _machine(), "parameters": {name: parameters_after_updates(name) for name in CASES}}, RECORDING)
    print(f"recorded {len(CASES)} cases in {RECORDING}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="write the recording from the current code")
    if parser.parse_args().record:
        record()
