"""The shared natural-gradient ``train()`` pipeline of NPG and TRPO (see GUIDE.md section 2)."""

from __future__ import annotations

import copy
import inspect
import math
import warnings
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np

import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.distributions import Distribution, kl_divergence
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import (
    ActorCriticCnnPolicy,
    ActorCriticPolicy,
    BasePolicy,
    MultiInputActorCriticPolicy,
)
from stable_baselines3.common.callbacks import BaseCallback, ConvertCallback
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.logger import configure
from stable_baselines3.common.utils import explained_variance
from torch.nn import functional as F

from sb3_npg.common.clip import clip_grad_norm_
from sb3_npg.common.distributed import (
    CHECKSUM_INTERVAL,
    DEFAULT_TIMEOUT_SECONDS,
    Moments,
    Reducer,
    init_process_group,
)
from sb3_npg.common.env_checks import FiniteRolloutCheck
from sb3_npg.common.fisher import ANALYTIC_FISHER_DISTRIBUTIONS, analytic_fisher_product
from sb3_npg.common.natural_gradient import (
    MatVec,
    conjugate_gradient,
    fisher_vector_product,
    flat_grad,
    get_flat_params,
    kl_scaled_step_size,
    set_flat_params_,
)
from sb3_npg.common.persistence import FORMAT_KEY, PathLike, check_saved_model, format_record
from sb3_npg.common.policy_parameters import split_actor_critic_parameters
from sb3_npg.common.stats import WeightedMeans
from sb3_npg.common.validation import (
    check_float,
    check_int,
    check_choice,
    check_learning_rate,
    check_optional_float,
    check_optional_int,
)

SelfNaturalPolicyGradient = TypeVar("SelfNaturalPolicyGradient", bound="NaturalPolicyGradient")

#: Action spaces whose distributions have a closed-form KL in Stable-Baselines3.
SUPPORTED_ACTION_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
#: Added to the advantages' standard deviation when normalizing them.
ADVANTAGE_NORMALIZATION_EPS = 1e-8
#: Keys recorded on every update even when no batch produced them (every step skipped, no critic epoch).
ALWAYS_LOGGED_KEYS = (
    "policy_objective",
    "kl_divergence",
    "entropy",
    "surrogate_improvement",
    "expected_improvement",
    "step_fraction",
    "cg_iterations",
    "cg_residual",
    "policy_grad_norm",
    "value_loss",
    "value_grad_norm",
)
#: The numerical events an update counts, cumulatively over training, logged as ``train/events/<name>``. The first
#: five refuse a natural step (the parameters stay as they were); the others let it proceed.
SKIP_EVENTS = (
    "zero_gradient",
    "non_finite_gradient",
    "non_finite_direction",
    "non_positive_curvature",
    "non_finite_step",
)
FAULT_EVENTS = (*SKIP_EVENTS, "cg_max_steps_reached", "cg_curvature_failure", "line_search_failed")
#: The smallest rollout for which advantages can be normalized (a standard deviation needs two samples).
MIN_NORMALIZED_ROLLOUT = 2
#: ``fisher`` options: the Gauss-Newton product with the distribution's analytic Fisher, or the KL's double backward.
FISHER_PRODUCTS = ("analytic", "autograd")
#: ``critic_fit`` options: minibatch epochs with the policy's optimizer, or full-batch L-BFGS.
CRITIC_FITS = ("minibatch", "lbfgs")
#: L-BFGS's initial step scale; its strong-Wolfe line search then chooses each step.
LBFGS_LEARNING_RATE = 1.0
#: The recommended settings for fast updates, to put after any configuration:
#: ``NPG("MlpPolicy", env, **{**config, **FAST_SETTINGS})``. Fisher products on every 5th sample (as OpenAI baselines'
#: TRPO) and a full-batch L-BFGS critic fit of at most 10 iterations (replacing the epochs of ``n_critic_updates``).
#: ``benchmarks/bench_update.py`` and ``benchmarks/bench_learn.py`` measure them against sb3-contrib's TRPO.
FAST_SETTINGS: Mapping[str, Any] = MappingProxyType(
    {"fisher_sub_sampling_factor": 5, "critic_fit": "lbfgs", "n_critic_updates": 10}
)


class StepOutcome(NamedTuple):
    """
    What the step-acceptance hook did with a proposed natural step.

    :param fraction: the fraction of the full step in place afterwards (0 when rejected)
    :param surrogate: the surrogate objective at the parameters in place afterwards
    :param kl: the mean KL from the base point to the parameters in place afterwards
    :param last_candidate_kl: the KL of the last candidate the hook tried (tells why a line search failed)
    """

    fraction: float
    surrogate: float
    kl: float
    last_candidate_kl: float


@dataclass(frozen=True)
class StepProposal:
    """
    A natural step ready for the acceptance hook.

    :param params: the actor parameters
    :param start: their values at the base point, flattened
    :param full_step: the KL-scaled natural step, flattened
    :param surrogate_before: the surrogate objective at the base point
    :param evaluate: measures ``(surrogate, kl)`` at the parameters currently in place, without gradients
    """

    params: list[torch.nn.Parameter]
    start: torch.Tensor
    full_step: torch.Tensor
    surrogate_before: float
    evaluate: Callable[[], tuple[float, float]]

    def apply(self, fraction: float) -> None:
        """Put ``start + fraction * full_step`` into the parameters."""
        set_flat_params_(self.params, self.start + fraction * self.full_step)


class _RolloutTensors(NamedTuple):
    """The parts of the rollout an update uses, as tensors."""

    observations: torch.Tensor | dict[str, torch.Tensor]
    actions: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


class _PolicyBatch(NamedTuple):
    """The tensors one natural step needs."""

    observations: torch.Tensor | dict[str, torch.Tensor]
    actions: torch.Tensor
    advantages: torch.Tensor


class _SkippedStep(Exception):
    """Raised inside a natural step when a non-finite or degenerate quantity means the step must not be applied."""

    def __init__(self, event: str, reason: str):
        super().__init__(reason)
        self.event = event


class NonFiniteParametersError(RuntimeError):
    """The policy's parameters hold NaN or inf, so no update can be computed from them."""


def _first(observations: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
    """The observations' tensor (the first one of a dict), to count samples."""
    return next(iter(observations.values())) if isinstance(observations, dict) else observations


def _select(
    observations: torch.Tensor | dict[str, torch.Tensor], index: slice | torch.Tensor
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Rows ``index`` of a batch of observations (a tensor, or a dict of tensors for Dict spaces)."""
    if isinstance(observations, dict):
        return {key: value[index] for key, value in observations.items()}
    return observations[index]


def _float64_to_float32(
    observations: torch.Tensor | dict[str, torch.Tensor],
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Float64 observations as float32 (SB3's preprocessing of a Box does ``.float()``); others unchanged."""
    if isinstance(observations, dict):
        return {key: _float64_to_float32(value) for key, value in observations.items()}  # type: ignore[misc]
    return observations.float() if observations.dtype == torch.float64 else observations


def _warn_if_batches_uneven(name: str, size: int, samples: int, what: str) -> None:
    """Warn (once, at construction) when batches of ``size`` do not split ``samples`` evenly; training still runs."""
    if size > samples:
        message = f"is larger than {what} = {samples}: each epoch uses one batch of all {samples}"
    elif samples % size != 0:
        message = (
            f"does not divide {what} = {samples}: the last batch holds {samples % size} samples "
            "(its metrics are weighted by its samples)"
        )
    else:
        return
    warnings.warn(f"`{name}`={size} {message}", UserWarning, stacklevel=4)


def _raise_if_not_finite(values: np.ndarray, what: str) -> None:
    """Raise a ``ValueError`` naming ``what`` when ``values`` (from the environment) hold NaN or inf."""
    if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
        count = int(np.size(values) - np.isfinite(values).sum())
        raise ValueError(
            f"The rollout's {what} hold {count} NaN or inf values: the environment emitted them, and training on them "
            "would corrupt the policy, so the update is refused. Fix the environment, or wrap it in "
            "stable_baselines3.common.vec_env.VecCheckNan(env, raise_exception=True) to stop at the step that "
            "produced them."
        )


def mean_kl(old: Distribution, new: Distribution) -> torch.Tensor:
    """
    The mean over the batch of the true KL(old || new) between action distributions.

    SB3's ``kl_divergence`` returns one value per action dimension (Box, MultiBinary) or per sub-action
    (MultiDiscrete); those are independent, so the KL of the joint distribution is their sum.

    :param old: the frozen distribution at the base point
    :param new: the current distribution
    :return: the scalar mean KL
    """
    per_sample = kl_divergence(old, new)
    if per_sample.dim() > 1:
        per_sample = per_sample.flatten(start_dim=1).sum(dim=1)
    return per_sample.mean()


def _make_critic_optimizer(
    optimizer_class: type[torch.optim.Optimizer],
    params: list[torch.nn.Parameter],
    learning_rate: float,
    optimizer_kwargs: dict[str, Any],
) -> torch.optim.Optimizer:
    """
    The critic's optimizer; the fused implementation when the class offers one and the user chose none.

    Fused Adam does the same arithmetic in one kernel instead of a per-tensor loop, which is cheaper for the many
    small steps of the critic fit (``benchmarks/bench_update.py`` measures the whole update).
    """
    kwargs = dict(optimizer_kwargs)
    accepts_fused = "fused" in inspect.signature(optimizer_class.__init__).parameters
    if accepts_fused and "fused" not in kwargs and "foreach" not in kwargs:
        try:
            return optimizer_class(params, lr=learning_rate, fused=True, **kwargs)  # type: ignore[call-arg]
        except (RuntimeError, ValueError):  # no fused kernel for this device or dtype
            pass
    return optimizer_class(params, lr=learning_rate, **kwargs)  # type: ignore[call-arg]


class NaturalPolicyGradient(OnPolicyAlgorithm):
    """
    The shared base of :class:`~sb3_npg.NPG` and :class:`~sb3_npg.TRPO`: one natural-gradient update per policy
    batch, then a critic fit. Subclasses decide only what to do with a proposed step (:meth:`_accept_step`).

    The constructor arguments are documented on :class:`~sb3_npg.NPG`.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": ActorCriticPolicy,
        "CnnPolicy": ActorCriticCnnPolicy,
        "MultiInputPolicy": MultiInputActorCriticPolicy,
    }
    #: Whether :meth:`_accept_step` runs a line search (then its success rate is logged).
    has_line_search: ClassVar[bool] = False
    policy: ActorCriticPolicy
    rollout_buffer: RolloutBuffer

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 1e-3,
        n_steps: int = 2048,
        batch_size: int = 128,
        gamma: float = 0.99,
        cg_max_steps: int = 15,
        cg_damping: float = 0.1,
        n_critic_updates: int = 10,
        gae_lambda: float = 0.95,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: type[RolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        normalize_advantage: bool = True,
        target_kl: float = 0.01,
        sub_sampling_factor: int = 1,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: torch.device | str = "auto",
        *,
        max_grad_norm: float | None = 0.5,
        cg_residual_tol: float = 1e-10,
        policy_batch_size: int | None = None,
        fisher: str = "analytic",
        fisher_sub_sampling_factor: int = 1,
        critic_fit: str = "minibatch",
        distributed: bool = False,
        distributed_timeout: float = DEFAULT_TIMEOUT_SECONDS,
        _init_setup_model: bool = True,
    ):
        if distributed:
            init_process_group(distributed_timeout)
        self._reducer = Reducer(distributed)
        if seed is not None:
            seed += self._reducer.rank  # each rank explores with its own environments and noise
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            ent_coef=0.0,  # no entropy bonus: the natural step follows the surrogate alone
            vf_coef=0.0,  # the critic is fitted separately
            max_grad_norm=0.0,  # replaced below by our own option, which may be None
            use_sde=False,  # set below, so that our check names the option (SB3 asserts it without the name)
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            device=device,
            seed=seed,
            _init_setup_model=False,
            supported_action_spaces=None,  # checked below with a ValueError instead of SB3's assert
        )
        self.batch_size = batch_size
        self.cg_max_steps = cg_max_steps
        self.cg_damping = cg_damping
        self.cg_residual_tol = cg_residual_tol
        self.n_critic_updates = n_critic_updates
        self.normalize_advantage = normalize_advantage
        self.target_kl = target_kl
        self.sub_sampling_factor = sub_sampling_factor
        self.max_grad_norm = max_grad_norm  # type: ignore[assignment]
        self.policy_batch_size = policy_batch_size
        self.fisher = fisher
        self.fisher_sub_sampling_factor = fisher_sub_sampling_factor
        self.critic_fit = critic_fit
        self.distributed = distributed
        self.distributed_timeout = distributed_timeout
        self._normalization_base: dict[str, Moments] = {}
        self.skipped_steps = 0
        self.fault_counts: dict[str, int] = dict.fromkeys(FAULT_EVENTS, 0)
        self.use_sde = use_sde
        self._validate_hyperparameters()
        if self.env is not None:
            self._validate_environment()
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------ set-up and validation

    def _validate_hyperparameters(self) -> None:
        """Raise a ``ValueError`` naming the first option outside its allowed range."""
        check_learning_rate(self.learning_rate)
        check_int("n_steps", self.n_steps, 1)
        check_int("batch_size", self.batch_size, 1)
        check_float("gamma", self.gamma, 0.0, 1.0)
        check_float("gae_lambda", self.gae_lambda, 0.0, 1.0)
        check_int("cg_max_steps", self.cg_max_steps, 1)
        check_float("cg_damping", self.cg_damping, 0.0)
        check_float("cg_residual_tol", self.cg_residual_tol, 0.0)
        check_int("n_critic_updates", self.n_critic_updates, 0)
        check_float("target_kl", self.target_kl, 0.0, low_inclusive=False)
        check_int("sub_sampling_factor", self.sub_sampling_factor, 1)
        check_optional_float("max_grad_norm", self.max_grad_norm)
        check_optional_int("policy_batch_size", self.policy_batch_size, 1)
        check_int("stats_window_size", self._stats_window_size, 1)
        check_choice("fisher", self.fisher, FISHER_PRODUCTS)
        check_int("fisher_sub_sampling_factor", self.fisher_sub_sampling_factor, 1)
        check_choice("critic_fit", self.critic_fit, CRITIC_FITS)
        for name in ("normalize_advantage", "use_sde"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"`{name}` must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.sde_sample_freq, int) or isinstance(self.sde_sample_freq, bool):
            raise ValueError(f"`sde_sample_freq` must be an integer (-1: once per rollout), got {self.sde_sample_freq!r}")

    def _validate_environment(self) -> None:
        """Checks that need the environment: the action space and the rollout size."""
        if not isinstance(self.action_space, SUPPORTED_ACTION_SPACES):
            names = ", ".join(space.__name__ for space in SUPPORTED_ACTION_SPACES)
            raise ValueError(
                f"{type(self).__name__} does not support the action space {self.action_space}: "
                f"supported action spaces are {names}"
            )
        if self.use_sde and not isinstance(self.action_space, spaces.Box):
            raise ValueError(f"`use_sde=True` needs a Box action space (gSDE is Gaussian noise), got {self.action_space}")
        rollout_size = self.n_steps * self.n_envs
        if self.normalize_advantage and rollout_size < MIN_NORMALIZED_ROLLOUT:
            raise ValueError(
                f"`n_steps * n_envs` must be >= {MIN_NORMALIZED_ROLLOUT} to normalize advantages, "
                f"got n_steps={self.n_steps} and n_envs={self.n_envs}"
            )
        policy_samples = math.ceil(rollout_size / self.sub_sampling_factor)
        _warn_if_batches_uneven("batch_size", self.batch_size, rollout_size, "the rollout (n_steps * n_envs)")
        if self.policy_batch_size is not None:
            where = "the policy's samples (n_steps * n_envs / sub_sampling_factor, rounded up)"
            _warn_if_batches_uneven("policy_batch_size", self.policy_batch_size, policy_samples, where)

    def _setup_model(self) -> None:
        super()._setup_model()
        if self.fisher == "analytic" and not isinstance(self.policy.action_dist, ANALYTIC_FISHER_DISTRIBUTIONS):
            raise ValueError(
                f"`fisher='analytic'` does not know the Fisher of {type(self.policy.action_dist).__name__}: "
                "use fisher='autograd'"
            )
        self._actor_params, self._critic_params = split_actor_critic_parameters(self.policy)
        # The critic's optimizer covers the critic's own parameters only: the actor moves by natural steps.
        self.policy.optimizer = _make_critic_optimizer(
            self.policy.optimizer_class, self._critic_params, self.lr_schedule(1), self.policy.optimizer_kwargs
        )
        self._reducer.device = self.device
        self._reducer.broadcast_(list(self.policy.parameters()))  # every rank starts from rank 0's weights

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        """SB3's callbacks, after :class:`~sb3_npg.common.env_checks.FiniteRolloutCheck`: NaN or inf from the
        environment stop training before any callback, the policy or the rollout buffer sees them."""
        if callback is None:
            callbacks: list[BaseCallback] = []
        elif isinstance(callback, list):
            callbacks = callback
        else:
            callbacks = [callback if isinstance(callback, BaseCallback) else ConvertCallback(callback)]
        return super()._init_callback([FiniteRolloutCheck(), *callbacks], progress_bar)

    def collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """
        SB3's rollout collection, refused up front when the policy's parameters are not finite. With
        ``distributed=True``, ``num_timesteps`` counts every rank's samples once the rollout is complete (during it,
        the callbacks see this rank's steps added to the count at its start).
        """
        self._check_parameters_finite()
        start = self.num_timesteps
        complete = super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        self.num_timesteps = start + (self.num_timesteps - start) * self._reducer.world_size
        return complete

    def save(self, path: PathLike, exclude: Iterable[str] | None = None, include: Iterable[str] | None = None) -> None:
        """
        Save the model as SB3 does, with a record of the saving algorithm and file format that ``load`` checks.

        :param path: the file (``.zip`` is added when missing) or a file object
        :param exclude: names of attributes not to save, in addition to the default ones
        :param include: names of attributes to save even if they would be excluded
        """
        setattr(self, FORMAT_KEY, format_record(type(self).__name__))
        super().save(path, exclude=exclude, include=include)

    @classmethod
    def load(
        cls: type[SelfNaturalPolicyGradient],
        path: PathLike,
        env: GymEnv | None = None,
        device: torch.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfNaturalPolicyGradient:
        """
        Load a model saved by this algorithm (see SB3's ``BaseAlgorithm.load``).

        Before SB3 deserializes anything, the archive's JSON is read and checked: a file that is not an intact model
        archive, holds another algorithm, or comes from a newer file format gets a ``ValueError`` saying what to do.
        SB3 then unpickles the objects embedded in the archive (the policy class, schedules, spaces): load only files
        you trust, or replace those entries with ``custom_objects``.

        :param path: the saved file (``.zip`` may be omitted) or a file object
        :param env: the environment to continue with (its spaces must match the saved ones)
        :param device: the device to put the model on
        :param custom_objects: entries of the saved data to replace instead of unpickling them
        :param print_system_info: print the system information of the machine that saved the model
        :param force_reset: reset the environment before the next ``learn()``
        :param kwargs: attributes to set on the loaded model
        :return: the loaded model
        """
        check_saved_model(path, cls.__name__)
        model = super().load(
            path,
            env=env,
            device=device,
            custom_objects=custom_objects,
            print_system_info=print_system_info,
            force_reset=force_reset,
            **kwargs,
        )
        # A model saved by a distributed run loads in a plain process (the reducer is then the identity) and joins
        # the ranks again when loaded under torchrun with a process group initialized.
        model._reducer = Reducer(model.distributed)
        model._reducer.device = model.device
        return model

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_actor_params", "_critic_params", "_reducer", "_normalization_base"]

    # ------------------------------------------------------------------ the update

    def train(self) -> None:
        """One update: a natural step per policy batch, then the critic fit, then one log record."""
        self._check_parameters_finite()
        self._check_rollout_finite()
        if self._n_updates % CHECKSUM_INTERVAL == 0:
            self._reducer.check_same(list(self.policy.parameters()), "policy parameters")
        vec_normalize = self.get_vec_normalize_env()
        if vec_normalize is not None:
            self._normalization_base = self._reducer.combine_normalization(vec_normalize, self._normalization_base)
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        rollout = self._rollout_tensors()
        policy_stats = WeightedMeans()
        for batch in self._policy_batches(rollout):
            self._natural_step(batch, policy_stats)
            self._n_updates += 1
        critic_stats = self._fit_critic(rollout.observations, rollout.returns)
        self._record_logs(policy_stats.means(), critic_stats.means())

    def _check_parameters_finite(self) -> None:
        """Refuse to update from non-finite parameters, naming them and how to recover."""
        broken = [name for name, param in self.policy.named_parameters() if not bool(torch.isfinite(param).all())]
        if broken:
            name = type(self).__name__
            raise NonFiniteParametersError(
                f"{name}: the policy parameters {', '.join(broken)} hold NaN or inf, so this update is refused. "
                f"The model cannot recover by itself: load the last good checkpoint ({name}.load(path, env=env), for "
                "example one written by CheckpointCallback) or restore good weights with model.set_parameters(...), "
                "then make the problem better conditioned (normalize observations and rewards with VecNormalize, "
                "lower target_kl or learning_rate)."
            )

    def _check_rollout_finite(self) -> None:
        """Refuse to train on a rollout whose observations or rewards hold NaN or inf, naming which."""
        buffer = self.rollout_buffer
        observations = buffer.observations
        parts = observations.items() if isinstance(observations, dict) else [("", observations)]
        for key, values in parts:
            _raise_if_not_finite(values, f"observations{f'[{key!r}]' if key else ''}")
        _raise_if_not_finite(buffer.rewards, "rewards")

    def _rollout_tensors(self) -> _RolloutTensors:
        """
        The whole rollout as tensors (in the buffer's shuffled order), converted once per update.

        Float64 observations (MuJoCo's) become float32 here, which is what the policy's preprocessing would do on
        every forward pass, so every minibatch and forward pass after this copies half the bytes and converts nothing.
        """
        rollout = next(self.rollout_buffer.get(batch_size=None))
        return _RolloutTensors(_float64_to_float32(rollout.observations), rollout.actions, rollout.advantages, rollout.returns)

    def _policy_batches(self, rollout: _RolloutTensors) -> Iterator[_PolicyBatch]:
        """The rollout (sub-sampled, advantages normalized over it) in batches of ``policy_batch_size``."""
        index = slice(None, None, self.sub_sampling_factor)
        observations = _select(rollout.observations, index)
        actions = rollout.actions[index]
        if isinstance(self.action_space, spaces.Discrete):
            actions = actions.long().flatten()
        advantages = rollout.advantages[index]
        if self.normalize_advantage:
            advantages = self._normalized(advantages)
        size = len(advantages)
        step = self.policy_batch_size or size
        for start in range(0, size, step):
            part = slice(start, start + step)
            yield _PolicyBatch(_select(observations, part), actions[part], advantages[part])

    def _normalized(self, advantages: torch.Tensor) -> torch.Tensor:
        """Advantages minus their mean over all samples, over their (unbiased) standard deviation there. Across ranks
        in two passes, mean then squared deviations, as stable as the single-process formula."""
        if not self._reducer.enabled:
            if len(advantages) < MIN_NORMALIZED_ROLLOUT:
                return advantages
            return (advantages - advantages.mean()) / (advantages.std() + ADVANTAGE_NORMALIZATION_EPS)
        total, count = self._reducer.sum(torch.stack([advantages.sum(), advantages.new_tensor(float(len(advantages)))]))
        if count < MIN_NORMALIZED_ROLLOUT:
            return advantages
        mean = total / count
        variance = self._reducer.sum((advantages - mean).square().sum()) / (count - 1)
        return (advantages - mean) / (variance.sqrt() + ADVANTAGE_NORMALIZATION_EPS)

    def _natural_step(self, batch: _PolicyBatch, stats: WeightedMeans) -> None:
        """Propose one KL-scaled natural step on ``batch`` from the current parameters, and hand it to the hook."""
        with torch.no_grad():
            old_distribution = copy.copy(self.policy.get_distribution(batch.observations))
            base_log_prob = old_distribution.log_prob(batch.actions)
        distribution = self.policy.get_distribution(batch.observations)
        ratio = torch.exp(distribution.log_prob(batch.actions) - base_log_prob)
        surrogate = (batch.advantages * ratio).mean()
        entropy = distribution.entropy()
        weight = len(batch.advantages)
        if entropy is not None:
            stats.add(weight, entropy=entropy.mean().item())
        fisher = self._fisher_product(batch.observations, old_distribution, distribution)

        def evaluate() -> tuple[float, float]:
            with torch.no_grad():
                candidate = self.policy.get_distribution(batch.observations)
                candidate_ratio = torch.exp(candidate.log_prob(batch.actions) - base_log_prob)
                local = torch.stack([(batch.advantages * candidate_ratio).mean(), mean_kl(old_distribution, candidate)])
                candidate_surrogate, candidate_kl = self._reducer.mean(local, weight).tolist()
                return candidate_surrogate, candidate_kl

        try:
            proposal, diagnostics = self._propose_step(surrogate, weight, fisher, evaluate)
        except _SkippedStep as skipped:
            self._skip_step(skipped, surrogate.item(), weight, stats)
            return
        try:
            outcome = self._accept_step(proposal)
        except BaseException:  # KeyboardInterrupt mid line search: leave the last accepted parameters, not a candidate
            proposal.apply(0.0)
            raise
        self._count_event("line_search_failed", self.has_line_search and outcome.fraction == 0.0)
        stats.add(
            weight,
            **diagnostics,
            policy_objective=outcome.surrogate,
            kl_divergence=outcome.kl,
            surrogate_improvement=outcome.surrogate - proposal.surrogate_before,
            step_fraction=outcome.fraction,
        )
        if self.has_line_search:
            stats.add(
                weight, is_line_search_success=float(outcome.fraction > 0), line_search_last_kl=outcome.last_candidate_kl
            )

    def _fisher_product(
        self,
        observations: torch.Tensor | dict[str, torch.Tensor],
        old_distribution: Distribution,
        distribution: Distribution,
    ) -> MatVec:
        """
        The damped Fisher-vector product at the base point, over every ``fisher_sub_sampling_factor``-th sample.

        :param observations: the policy batch
        :param old_distribution: the frozen distribution on the whole batch
        :param distribution: the distribution on the whole batch, with its graph to the actor parameters
        :return: the product ``v -> (F + cg_damping * I) v``
        """
        if self.fisher_sub_sampling_factor > 1:
            observations = _select(observations, slice(None, None, self.fisher_sub_sampling_factor))
            distribution = copy.copy(self.policy.get_distribution(observations))
            if self.fisher == "autograd":
                with torch.no_grad():
                    old_distribution = copy.copy(self.policy.get_distribution(observations))
        if self.fisher == "analytic":
            product = analytic_fisher_product(distribution, self._actor_params, self.cg_damping)
        else:
            product = fisher_vector_product(mean_kl(old_distribution, distribution), self._actor_params, self.cg_damping)
        if not self._reducer.enabled:
            return product
        weight = len(_first(observations))
        return lambda vector: self._reducer.mean(product(vector), weight)

    def _propose_step(
        self, surrogate: torch.Tensor, weight: int, fisher: MatVec, evaluate: Callable[[], tuple[float, float]]
    ) -> tuple[StepProposal, dict[str, float]]:
        """Gradient, conjugate gradient and KL scaling; raises :class:`_SkippedStep` on any non-finite quantity.
        ``weight`` is the batch's number of samples, which weights this rank's gradient in a distributed update."""
        params = self._actor_params
        gradient = self._reducer.mean(flat_grad(surrogate, params, retain_graph=True), weight)
        gradient_norm = float(torch.linalg.vector_norm(gradient))
        if not math.isfinite(gradient_norm):
            raise _SkippedStep("non_finite_gradient", "the policy gradient is not finite")
        if gradient_norm == 0.0:
            raise _SkippedStep("zero_gradient", "the policy gradient is zero (are all advantages equal?)")
        solve = conjugate_gradient(fisher, gradient, self.cg_max_steps, self.cg_residual_tol)
        self._count_event("cg_curvature_failure", solve.curvature_failure)
        self._count_event("cg_max_steps_reached", not solve.converged and not solve.curvature_failure)
        direction = solve.solution
        if not bool(torch.isfinite(direction).all()):
            raise _SkippedStep("non_finite_direction", "the conjugate-gradient direction is not finite")
        curvature = float(torch.dot(direction, fisher(direction)))
        step_size = kl_scaled_step_size(curvature, self.target_kl)
        if not math.isfinite(step_size):
            raise _SkippedStep("non_positive_curvature", f"the curvature s^T F s = {curvature} is not positive and finite")
        full_step = step_size * direction
        if not bool(torch.isfinite(full_step).all()):
            raise _SkippedStep("non_finite_step", "the natural step is not finite")
        proposal = StepProposal(
            params=params,
            start=get_flat_params(params),
            full_step=full_step,
            surrogate_before=float(self._reducer.mean(surrogate.detach(), weight)),
            evaluate=evaluate,
        )
        diagnostics = {
            "policy_grad_norm": gradient_norm,
            "expected_improvement": float(torch.dot(gradient, full_step)),
            "cg_iterations": float(solve.iterations),
            "cg_residual": solve.residual,
        }
        return proposal, diagnostics

    def _count_event(self, event: str, happened: bool = True) -> None:
        """Count one of :data:`FAULT_EVENTS` when it happened."""
        if happened:
            self.fault_counts[event] = self.fault_counts.get(event, 0) + 1

    def _skip_step(self, skipped: _SkippedStep, surrogate: float, weight: int, stats: WeightedMeans) -> None:
        """Leave the parameters as they are, count the skip and its cause, and say why."""
        self.skipped_steps += 1
        self._count_event(skipped.event)
        warnings.warn(
            f"{type(self).__name__}: natural step skipped because {skipped}; the policy parameters are unchanged",
            RuntimeWarning,
            stacklevel=2,
        )
        stats.add(
            weight,
            policy_objective=surrogate,
            kl_divergence=0.0,
            surrogate_improvement=0.0,
            expected_improvement=0.0,
            step_fraction=0.0,
        )
        if self.has_line_search:
            stats.add(weight, is_line_search_success=0.0)

    @abstractmethod
    def _accept_step(self, proposal: StepProposal) -> StepOutcome:
        """
        Decide how much of the proposed step to take and leave those parameters in place.

        :param proposal: the full natural step and a way to measure candidates
        :return: what was done
        """

    def _fit_critic(self, observations: torch.Tensor | dict[str, torch.Tensor], returns: torch.Tensor) -> WeightedMeans:
        """Regress the value on the returns with the ``critic_fit`` method (nothing when ``n_critic_updates`` is 0)."""
        if self.n_critic_updates == 0:
            return WeightedMeans()
        if self.critic_fit == "lbfgs":
            return self._fit_critic_lbfgs(observations, returns)
        return self._fit_critic_minibatch(observations, returns)

    def _critic_gradient(self, observations: torch.Tensor | dict[str, torch.Tensor], returns: torch.Tensor) -> torch.Tensor:
        """The value loss on a batch, with its gradient put into the critic's own parameters (none for the actor's);
        in a distributed update both are means over every rank's batch."""
        values = self.policy.predict_values(observations).flatten()
        value_loss = F.mse_loss(values, returns)
        grads = torch.autograd.grad(value_loss, self._critic_params, allow_unused=True)
        for param, grad in zip(self._critic_params, grads, strict=True):
            param.grad = grad
        return self._reducer.mean_gradients(self._critic_params, len(returns), value_loss.detach())

    def _fit_critic_minibatch(
        self, observations: torch.Tensor | dict[str, torch.Tensor], returns: torch.Tensor
    ) -> WeightedMeans:
        """``n_critic_updates`` epochs of minibatch steps of the policy's optimizer, with the global-norm clip."""
        size = len(returns)
        loss_sum = torch.zeros((), device=self.device)
        grad_norm_sum = 0.0
        for _ in range(self.n_critic_updates):
            # One permutation per epoch from numpy's generator, which SB3 seeds, as RolloutBuffer.get() does; the data
            # is gathered once in that order, so each minibatch is a contiguous slice (a view, no copy).
            order = torch.as_tensor(np.random.permutation(size), device=self.device)
            shuffled_observations, shuffled_returns = _select(observations, order), returns[order]
            for start in range(0, size, self.batch_size):
                part = slice(start, start + self.batch_size)
                n_part = len(shuffled_returns[part])
                loss_sum += self._critic_gradient(_select(shuffled_observations, part), shuffled_returns[part]) * n_part
                grad_norm_sum += clip_grad_norm_(self._critic_params, self.max_grad_norm) * n_part
                self.policy.optimizer.step()
        n_samples = size * self.n_critic_updates
        stats = WeightedMeans()
        stats.add(n_samples, value_loss=loss_sum.item() / n_samples, value_grad_norm=grad_norm_sum / n_samples)
        return stats

    def _fit_critic_lbfgs(self, observations: torch.Tensor | dict[str, torch.Tensor], returns: torch.Tensor) -> WeightedMeans:
        """
        Full-batch L-BFGS with a strong-Wolfe line search, at most ``n_critic_updates`` iterations, started afresh.

        The line search sets the step, so neither the learning rate nor the gradient clip applies (clipping would
        corrupt the curvature pairs). The logged loss and gradient norm are those of the last evaluation.
        """
        optimizer = torch.optim.LBFGS(
            self._critic_params, lr=LBFGS_LEARNING_RATE, max_iter=self.n_critic_updates, line_search_fn="strong_wolfe"
        )
        last: dict[str, torch.Tensor] = {}

        def closure() -> torch.Tensor:
            last["loss"] = self._critic_gradient(observations, returns)
            return last["loss"]

        optimizer.step(closure)
        stats = WeightedMeans()
        # The norm only: ``max_norm=None`` leaves the gradients as they are.
        stats.add(len(returns), value_loss=last["loss"].item(), value_grad_norm=clip_grad_norm_(self._critic_params, None))
        return stats

    def _record_logs(self, policy_means: dict[str, float], critic_means: dict[str, float]) -> None:
        """One record per update: every key of GUIDE.md section 5."""
        means = {key: math.nan for key in ALWAYS_LOGGED_KEYS} | policy_means | critic_means
        for key, value in means.items():
            self.logger.record(f"train/{key}", value)
        values = self.rollout_buffer.values.flatten()
        returns = self.rollout_buffer.returns.flatten()
        self.logger.record("train/explained_variance", float(explained_variance(values, returns)))
        log_std = getattr(self.policy, "log_std", None)
        if isinstance(log_std, torch.Tensor):
            self.logger.record("train/std", torch.exp(log_std.detach()).mean().item())
        self.logger.record("train/skipped_steps", self.skipped_steps)
        for event in FAULT_EVENTS:
            self.logger.record(f"train/events/{event}", self.fault_counts.get(event, 0))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")

    def learn(
        self: SelfNaturalPolicyGradient,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str | None = None,
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfNaturalPolicyGradient:
        """
        Train for ``total_timesteps`` environment steps (see SB3's ``OnPolicyAlgorithm.learn``).

        :param total_timesteps: the number of environment steps to train for
        :param callback: callback(s) called at every step with the state of the algorithm
        :param log_interval: the number of rollouts between two log records
        :param tb_log_name: the name of the TensorBoard run (default: the algorithm's class name)
        :param reset_num_timesteps: whether to reset the current timestep count (used in logging)
        :param progress_bar: display a progress bar using tqdm and rich
        :return: the trained model

        With ``distributed=True``, ``total_timesteps`` and ``num_timesteps`` count the samples of all ranks (each rank
        collects its share), and only rank 0 logs and runs the callbacks (evaluation, checkpoints) and the progress bar.
        """
        if self._reducer.rank != 0:
            callback, progress_bar = None, False
            self.set_logger(configure(None, []))
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name or type(self).__name__,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )
