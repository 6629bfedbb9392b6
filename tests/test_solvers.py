"""The Fisher solver is a part the algorithm holds: conjugate gradient by default, any :class:`FisherSolver` in its place."""

import pytest
import torch

from sb3_npg import NPG, TRPO
from sb3_npg.common.natural_gradient import get_flat_params
from sb3_npg.common.solvers import (
    CG_CURVATURE_FAILURE,
    CG_MAX_STEPS_REACHED,
    ConjugateGradientSolver,
    FisherSolver,
    NaturalDirection,
)

TINY = {"n_steps": 128, "batch_size": 64, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}


def _spd(size: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    root = torch.randn(size, size, generator=generator, dtype=torch.float64)
    return root @ root.T + 0.1 * torch.eye(size, dtype=torch.float64)


def test_conjugate_gradient_solves_and_gives_the_curvature_of_its_solution():
    matrix, gradient = _spd(6), torch.linspace(-1.0, 1.0, 6, dtype=torch.float64)
    solved = ConjugateGradientSolver(max_steps=50, residual_tol=1e-24).solve(gradient, lambda v: matrix @ v)
    assert torch.allclose(solved.direction, torch.linalg.solve(matrix, gradient), rtol=1e-8)
    assert solved.curvature == pytest.approx(float(solved.direction @ matrix @ solved.direction), rel=1e-8)
    assert solved.events == () and set(solved.diagnostics) == {"cg_iterations", "cg_residual"}
    assert solved.diagnostics["cg_iterations"] <= 6 + 1


def test_conjugate_gradient_reports_its_budget_and_a_curvature_failure():
    matrix, gradient = _spd(6), torch.ones(6, dtype=torch.float64)
    assert ConjugateGradientSolver(2, 1e-24).solve(gradient, lambda v: matrix @ v).events == (CG_MAX_STEPS_REACHED,)
    assert ConjugateGradientSolver(2, 1e-24).solve(gradient, lambda v: -v).events == (CG_CURVATURE_FAILURE,)


@pytest.mark.parametrize("algo", [NPG, TRPO])
def test_the_algorithm_holds_conjugate_gradient_with_its_options(algo):
    model = algo("MlpPolicy", "Pendulum-v1", cg_max_steps=7, cg_residual_tol=1e-6, **TINY)
    assert isinstance(model.solver, ConjugateGradientSolver)
    assert (model.solver.max_steps, model.solver.residual_tol) == (7, 1e-6)
    model.cg_max_steps = 9  # an option set later (or by load) is the one the next update solves with
    assert model.solver.max_steps == 9
    assert set(ConjugateGradientSolver.events) <= set(algo.counted_events)


class _GradientSolver(FisherSolver):
    """Takes the gradient itself as the direction (a KL-scaled vanilla gradient step), and records its calls."""

    def __init__(self):
        self.gradients = []

    def solve(self, gradient, fisher):
        self.gradients.append(gradient.clone())
        return NaturalDirection(gradient, float(gradient @ fisher(gradient)), {"gradient_solver_calls": 1.0})


@pytest.mark.parametrize("algo", [NPG, TRPO])
def test_another_solver_in_its_place_sets_the_direction_of_the_step(algo):
    solver = _GradientSolver()

    class WithGradientSolver(algo):  # type: ignore[valid-type,misc]
        @property
        def solver(self):
            return solver

    model = WithGradientSolver("MlpPolicy", "Pendulum-v1", target_kl=1e-3, **TINY)
    start = get_flat_params(model.actor_parameters).clone()
    model.learn(TINY["n_steps"])
    step = get_flat_params(model.actor_parameters) - start
    assert len(solver.gradients) == 1 and model.logger.name_to_value["train/gradient_solver_calls"] == 1.0
    assert model.logger.name_to_value["train/step_fraction"] > 0.0
    cosine = float(step @ solver.gradients[0] / (step.norm() * solver.gradients[0].norm()))
    assert cosine == pytest.approx(1.0, abs=1e-5)  # the step lies along the solver's direction
