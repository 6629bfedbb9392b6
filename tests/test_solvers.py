"""The Fisher solver is a part the algorithm holds: conjugate gradient by default, any :class:`FisherSolver` in its place."""

import warnings

import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.preprocessing import get_flattened_obs_dim
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_npg import NPG, TRPO
from sb3_npg.common.natural_gradient import conjugate_gradient, get_flat_params
from sb3_npg.common.solvers import (
    CG_CURVATURE_FAILURE,
    CG_MAX_STEPS_REACHED,
    CG_PRECONDITIONER_FAILURE,
    ConjugateGradientSolver,
    FisherSolver,
    KroneckerFactoredSolver,
    NaturalDirection,
)

TINY = {"n_steps": 128, "batch_size": 64, "policy_kwargs": {"net_arch": [16]}, "seed": 0, "device": "cpu"}


def _spd(size: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    root = torch.randn(size, size, generator=generator, dtype=torch.float64)
    return root @ root.T + 0.1 * torch.eye(size, dtype=torch.float64)


def test_conjugate_gradient_solves_and_gives_the_curvature_of_its_solution():
    matrix, gradient = _spd(6), torch.linspace(-1.0, 1.0, 6, dtype=torch.float64)
    solved = ConjugateGradientSolver(max_steps=50, residual_tol=1e-24).solve(gradient, lambda v: matrix @ v, None)
    # portable: float64: a small well-conditioned system, solved to convergence
    assert torch.allclose(solved.direction, torch.linalg.solve(matrix, gradient), rtol=1e-8)
    # portable: float64: a small well-conditioned system, solved to convergence
    assert solved.curvature == pytest.approx(float(solved.direction @ matrix @ solved.direction), rel=1e-8)
    assert solved.events == () and set(solved.diagnostics) == {"cg_iterations", "cg_residual"}
    assert solved.diagnostics["cg_iterations"] <= 6 + 1


def test_conjugate_gradient_reports_its_budget_and_a_curvature_failure():
    matrix, gradient = _spd(6), torch.ones(6, dtype=torch.float64)
    assert ConjugateGradientSolver(2, 1e-24).solve(gradient, lambda v: matrix @ v, None).events == (CG_MAX_STEPS_REACHED,)
    assert ConjugateGradientSolver(2, 1e-24).solve(gradient, lambda v: -v, None).events == (CG_CURVATURE_FAILURE,)


def test_conjugate_gradient_reports_a_preconditioner_that_is_not_positive():
    matrix, gradient = _spd(6), torch.ones(6, dtype=torch.float64)
    solver = ConjugateGradientSolver(5, 0.0, preconditioning=lambda observations: lambda r: -r)
    solved = solver.solve(gradient, lambda v: matrix @ v, None)
    assert solved.events == (CG_PRECONDITIONER_FAILURE,) and bool(torch.isfinite(solved.direction).all())


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

    def solve(self, gradient, fisher, observations):
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
    # portable: the parameters' float32 rounding is far below this step (target_kl 1e-3); the cosine drops by its square
    assert cosine == pytest.approx(1.0, abs=1e-5)  # the step lies along the solver's direction


def test_preconditioned_conjugate_gradient_needs_one_product_with_the_exact_inverse():
    matrix, gradient = _spd(8), torch.linspace(-1.0, 2.0, 8, dtype=torch.float64)
    exact = torch.linalg.solve(matrix, gradient)
    preconditioned = conjugate_gradient(lambda v: matrix @ v, gradient, 50, 1e-20, lambda v: torch.linalg.solve(matrix, v))
    plain = conjugate_gradient(lambda v: matrix @ v, gradient, 50, 1e-20)
    assert preconditioned.iterations == 1 < plain.iterations
    # portable: float64: a small well-conditioned system, solved to convergence
    assert torch.allclose(preconditioned.solution, exact, rtol=1e-9) and torch.allclose(plain.solution, exact, rtol=1e-6)
    # A diagonal preconditioner keeps the solution and the stopping rule on the same residual.
    jacobi = conjugate_gradient(lambda v: matrix @ v, gradient, 50, 1e-20, lambda v: v / torch.diagonal(matrix))
    # portable: float64: a small well-conditioned system, solved to convergence
    assert jacobi.converged and torch.allclose(jacobi.solution, exact, rtol=1e-6)


def _jacobi_preconditioning(matrix: torch.Tensor):
    """A stand-in for K-FAC's inverse on a batch: the inverse of ``matrix``'s diagonal, whatever the samples."""
    return lambda observations: lambda vector: vector / torch.diagonal(matrix)


def test_kfac_step_curvature_is_the_damped_fisher_quadratic_form():
    """K-FAC alone scales its step by ``d^T (F + d I) d`` of the exact damped product, not by ``d^T g``, which equals it
    only where K-FAC's inverse is exact."""
    matrix, gradient = _spd(6), torch.linspace(-1.0, 2.0, 6, dtype=torch.float64)
    solved = KroneckerFactoredSolver(_jacobi_preconditioning(matrix)).solve(gradient, lambda v: matrix @ v, None)
    direction = gradient / torch.diagonal(matrix)
    assert torch.equal(solved.direction, direction)
    quadratic_form, gradient_form = float(direction @ matrix @ direction), float(direction @ gradient)
    assert abs(quadratic_form - gradient_form) > 0.1 * quadratic_form  # the case tells the two apart
    # portable: float64: a small well-conditioned system, solved to convergence
    assert solved.curvature == pytest.approx(quadratic_form, rel=1e-12)  # float64, one dot product of 6 terms


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e-3])
def test_kfac_cg_residual_is_relative_to_the_gradient_and_scale_free(scale):
    """``cg_residual`` of K-FAC alone is ``||g - (F + d I) d||^2 / ||g||^2``: the same for any scale of the gradient."""
    matrix, gradient = _spd(6), scale * torch.linspace(-1.0, 2.0, 6, dtype=torch.float64)
    solved = KroneckerFactoredSolver(_jacobi_preconditioning(matrix)).solve(gradient, lambda v: matrix @ v, None)
    unit = torch.linspace(-1.0, 2.0, 6, dtype=torch.float64)
    residual = unit - matrix @ (unit / torch.diagonal(matrix))
    expected = float(residual @ residual / (unit @ unit))
    # portable: float64: a small well-conditioned system, solved to convergence
    assert 0.0 < expected and solved.diagnostics["cg_residual"] == pytest.approx(expected, rel=1e-10)


def test_preconditioned_cg_solver_applies_its_preconditioning_on_the_steps_samples():
    """The solver builds its preconditioner once, on the samples it is given, and applies it to the first residual and
    to every iterate's: with the exact inverse, one product solves the system that plain CG needs several for."""
    matrix, gradient = _spd(8), torch.linspace(-1.0, 2.0, 8, dtype=torch.float64)
    samples, built_on, applied = torch.zeros(4, 3), [], []

    def preconditioning(observations):
        built_on.append(observations)

        def apply(vector):
            applied.append(vector)
            return torch.linalg.solve(matrix, vector)

        return apply

    solved = ConjugateGradientSolver(50, 1e-20, preconditioning).solve(gradient, lambda v: matrix @ v, samples)
    plain = ConjugateGradientSolver(50, 1e-20).solve(gradient, lambda v: matrix @ v, samples)
    assert len(built_on) == 1 and built_on[0] is samples
    assert solved.diagnostics["cg_iterations"] == 1.0 < plain.diagnostics["cg_iterations"]
    assert len(applied) == 1 + 1  # the first residual, then the one iterate's
    # portable: float64: a small well-conditioned system, solved to convergence
    assert torch.allclose(solved.direction, torch.linalg.solve(matrix, gradient), rtol=1e-9)


def test_kfac_preconditioned_cg_applies_kfac_at_every_iteration_of_an_update():
    """In an update, ``kfac_preconditioned_cg`` builds K-FAC's inverse once per natural step and applies it to the
    first residual and after every CG iteration (no curvature failure here)."""
    model = NPG("MlpPolicy", "Pendulum-v1", fisher_solver="kfac_preconditioned_cg", **TINY)
    built, applied = [], []
    kfac_inverse = model._kfac_inverse

    def counting(observations):
        built.append(len(observations))
        inverse = kfac_inverse(observations)
        return lambda vector: applied.append(1) or inverse(vector)

    model._kfac_inverse = counting
    model.learn(TINY["n_steps"])
    logs = model.logger.name_to_value
    assert built == [TINY["n_steps"]] and model.event_counts["cg_curvature_failure"] == 0
    assert len(applied) == logs["train/cg_iterations"] + 1 >= 2


def _one_step(algo, fisher_solver, env_id="Pendulum-v1", **options):
    """The actor's step of one update of a fresh model (the same rollout for every solver: same seed)."""
    settings = {**TINY, "target_kl": 1e-3, "fisher_solver": fisher_solver, **options}
    model = algo("MlpPolicy", env_id, **settings)
    start = get_flat_params(model.actor_parameters).clone()
    model.learn(TINY["n_steps"])
    return get_flat_params(model.actor_parameters) - start, model.logger.name_to_value


def _cosine(a, b):
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("algo", [NPG, TRPO])
def test_kfac_alone_is_the_solve_where_kfac_is_exact(algo):
    """An actor that is one linear layer with a state-independent std: K-FAC is its Fisher, so with light damping
    K-FAC's direction is conjugate gradient's converged one; a hidden layer makes it an approximation."""
    exact = {"policy_kwargs": {"net_arch": []}, "cg_damping": 1e-4, "cg_max_steps": 100, "cg_residual_tol": 1e-12}
    solved, solved_logs = _one_step(algo, "cg", **exact)
    kfac, kfac_logs = _one_step(algo, "kfac", **exact)
    assert solved_logs["train/cg_residual"] < 1e-10 and kfac_logs["train/cg_iterations"] == 0.0
    assert _cosine(kfac, solved) > 0.999 and kfac_logs["train/cg_residual"] < 1e-3
    hidden = {**exact, "policy_kwargs": {"net_arch": [16]}}
    assert _one_step(algo, "kfac", **hidden)[1]["train/cg_residual"] > 10 * kfac_logs["train/cg_residual"]


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_kfac_preconditioned_cg_reaches_the_same_direction_as_cg(env_id):
    tight = {"cg_max_steps": 200, "cg_residual_tol": 1e-10}
    plain, plain_logs = _one_step(NPG, "cg", env_id, **tight)
    preconditioned, logs = _one_step(NPG, "kfac_preconditioned_cg", env_id, **tight)
    assert logs["train/cg_residual"] <= 1e-10 and plain_logs["train/cg_residual"] <= 1e-10
    assert _cosine(preconditioned, plain) > 0.999
    assert float(preconditioned.norm()) == pytest.approx(float(plain.norm()), rel=1e-2)


def test_the_kfac_solvers_are_held_as_the_option_says_and_survive_save_and_load(tmp_path):
    from sb3_npg.common.solvers import KroneckerFactoredSolver

    model = NPG("MlpPolicy", "CartPole-v1", fisher_solver="kfac", **TINY)
    assert isinstance(model.solver, KroneckerFactoredSolver)
    model.fisher_solver = "kfac_preconditioned_cg"
    assert isinstance(model.solver, ConjugateGradientSolver) and model.solver.preconditioning is not None
    model.learn(TINY["n_steps"])
    model.save(tmp_path / "kfac.zip")
    loaded = NPG.load(tmp_path / "kfac.zip", env=model.get_env())
    assert loaded.fisher_solver == "kfac_preconditioned_cg" and loaded.solver.preconditioning is not None
    loaded.learn(TINY["n_steps"], reset_num_timesteps=False)
    assert all(bool(torch.isfinite(p).all()) for p in loaded.policy.parameters())


def _image_env():
    """An image-observation environment, for CnnPolicy."""
    from tests.test_integration import IMAGE, _SpacesEnv

    return DummyVecEnv([lambda: _SpacesEnv(IMAGE, spaces.Discrete(2))])


@pytest.mark.parametrize("algo", [NPG, TRPO])
def test_the_kfac_solvers_refuse_what_they_cannot_factor(algo):
    with pytest.raises(ValueError, match="`fisher_solver` must be one of"):
        algo("MlpPolicy", "CartPole-v1", fisher_solver="lbfgs", **TINY)
    with pytest.raises(ValueError, match=r"`fisher_solver`='kfac' needs cg_damping > 0, got 0.0"):
        algo("MlpPolicy", "CartPole-v1", fisher_solver="kfac", cg_damping=0.0, **TINY)
    kwargs = {**TINY, "policy_kwargs": {"net_arch": [16], "features_extractor_class": _ScaledExtractor}}
    with pytest.raises(ValueError, match=r"`fisher_solver`='kfac_preconditioned_cg' cannot factor this actor.*scale"):
        algo("MlpPolicy", "CartPole-v1", fisher_solver="kfac_preconditioned_cg", **kwargs)


class _ScaledExtractor(BaseFeaturesExtractor):
    """A features extractor with a parameter outside any layer: K-FAC has no block for it."""

    def __init__(self, observation_space):
        super().__init__(observation_space, features_dim=get_flattened_obs_dim(observation_space))
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, observations):
        return self.scale * observations.flatten(1)


@pytest.mark.parametrize("algo", [NPG, TRPO])
def test_the_kfac_solvers_factor_cnn_policies_convolutions(algo):
    kwargs = {**TINY, "policy_kwargs": {"net_arch": [16], "features_extractor_kwargs": {"features_dim": 16}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = algo("CnnPolicy", _image_env(), fisher_solver="kfac", **kwargs)
    assert sum(isinstance(layer, torch.nn.Conv2d) for layer in model._kfac_plan.layers) == 3
    before = [p.detach().clone() for p in model.actor_parameters]
    model.learn(TINY["n_steps"])
    assert model.skipped_steps == 0
    assert all(not torch.equal(b, p) for b, p in zip(before, model.actor_parameters, strict=True))


def test_trpo_with_the_reviews_preconditioned_options_completes_an_update():
    # The options a review saw raise ZeroDivisionError (r^T M^-1 r underflowing to 0 with cg_residual_tol=0).
    options = {"fisher_solver": "kfac_preconditioned_cg", "cg_residual_tol": 0.0, "cg_damping": 1e-10, "cg_max_steps": 25}
    model = TRPO("MlpPolicy", "Pendulum-v1", **{**TINY, **options})
    model.learn(TINY["n_steps"])
    assert model._n_updates == 1 and all(bool(torch.isfinite(param).all()) for param in model.policy.parameters())


class _IndefinitePreconditionerTRPO(TRPO):
    """TRPO whose K-FAC preconditioner is negated: ``r^T M^-1 r < 0`` from the first iteration of CG."""

    def _kfac_inverse(self, observations):
        inverse = super()._kfac_inverse(observations)
        return lambda vector: -inverse(vector)


def test_a_preconditioner_that_is_not_positive_stops_cg_and_the_update_completes():
    model = _IndefinitePreconditionerTRPO("MlpPolicy", "Pendulum-v1", fisher_solver="kfac_preconditioned_cg", **TINY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the zero direction's step is refused, with a warning
        model.learn(TINY["n_steps"])
    assert model.event_counts[CG_PRECONDITIONER_FAILURE] == 1
    assert all(bool(torch.isfinite(param).all()) for param in model.policy.parameters())
