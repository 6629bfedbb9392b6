"""The shared base of NPG and TRPO: construction and validation, ``train()`` as a pipeline of named steps, learn, logs.

Where to change what (``docs/design.md`` has the whole map):

- the objective: ``policy_objective`` (:mod:`sb3_npg.common.actor_update`; the surrogate and the KL are one
  function, :func:`~sb3_npg.common.natural_step.surrogate_and_kl`);
- the acceptance rule: ``_accept_step`` of :class:`~sb3_npg.NPG` and :class:`~sb3_npg.TRPO`;
- the critic fit: :mod:`sb3_npg.common.critic`;
- what is synchronised across ranks: every call of ``self._reducer`` (:mod:`sb3_npg.common.distributed`);
- the file format: :mod:`sb3_npg.common.persistence`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import torch
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback, ConvertCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import (
    ActorCriticCnnPolicy,
    ActorCriticPolicy,
    BasePolicy,
    MultiInputActorCriticPolicy,
)
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import explained_variance
from stable_baselines3.common.vec_env import VecEnv

from sb3_npg.common.actor_update import ActorUpdate
from sb3_npg.common.data_parallel import DataParallel
from sb3_npg.common.rollouts import ROLLOUT_COLLECTIONS, FastRollouts
from sb3_npg.common.batches import (
    MIN_NORMALIZED_ROLLOUT,
    Observations,
    rollout_tensors,
)
from sb3_npg.common.checks import (
    FiniteRolloutCheck,
    check_action_space,
    check_fisher_samples,
    check_parameters_finite,
    check_rollout_finite,
    warn_if_batches_uneven,
)
from sb3_npg.common.critic import CRITIC_FITS, CriticFit, make_critic_optimizer
from sb3_npg.common.distributed import DEFAULT_TIMEOUT_SECONDS, Reducer, init_process_group
from sb3_npg.common.fisher import ANALYTIC_FISHER_DISTRIBUTIONS
from sb3_npg.common.kfac_policy import build_kfac_plan
from sb3_npg.common.solvers import FISHER_SOLVERS
from sb3_npg.common.persistence import RecordedFormat
from sb3_npg.common.policy_parameters import split_actor_critic_parameters
from sb3_npg.common.stats import WeightedMeans
from sb3_npg.common.persistence import VALIDATION_EXEMPT
from sb3_npg.common.validation import (
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    OPTIONAL_POSITIVE_INT,
    POSITIVE_INT,
    UNIT_INTERVAL,
    ConfigurationError,
    OptionCheck,
    check_bool,
    check_choice,
    check_integer,
    check_optional_float,
    check_options,
    check_positive_or_schedule,
)
from sb3_npg.common.value_targets import NormalizedValueHead, install_value_head
from sb3_npg.common.vec_normalize_sync import Moments

SelfNaturalPolicyGradient = TypeVar("SelfNaturalPolicyGradient", bound="NaturalPolicyGradient")

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
#: Diagnostics written to every log format but stdout: a ``verbose=1`` table shows what a user reads per update
#: (returns, KL, entropy, improvement, step fraction, value loss); TensorBoard, CSV and JSON get every key.
#: Event counters and ``skipped_steps`` reach stdout only when they are not zero.
NOT_ON_STDOUT = frozenset(
    {
        "policy_objective",
        "expected_improvement",
        "cg_iterations",
        "cg_residual",
        "value_grad_norm",
        "line_search_last_kl",
        "target_kl",
        "kfac_curvature",
        "kl_divergence_over_clip",
        "step_size",
        "value_step_size",
    }
)
#: ``fisher`` options: the Gauss-Newton product with the distribution's analytic Fisher, or the KL's double backward.
FISHER_PRODUCTS = ("analytic", "autograd")
#: The recommended settings for fast updates, to put after any configuration:
#: ``NPG("MlpPolicy", env, **{**config, **FAST_SETTINGS})``. Fisher products on every 5th sample (as OpenAI baselines'
#: TRPO) and a full-batch L-BFGS critic fit of at most 10 iterations (replacing the epochs of ``n_critic_updates``).
#: ``benchmarks/bench_update.py`` and ``benchmarks/bench_learn.py`` measure them against sb3-contrib's TRPO.
FAST_SETTINGS: Mapping[str, Any] = MappingProxyType(
    {"fisher_sub_sampling_factor": 5, "critic_fit": "lbfgs", "n_critic_updates": 10}
)


class NaturalPolicyGradient(ActorUpdate, DataParallel, FastRollouts, RecordedFormat, OnPolicyAlgorithm):
    """
    The shared base of :class:`~sb3_npg.NPG` and :class:`~sb3_npg.TRPO`: one natural-gradient step per policy
    batch, then a critic fit. Subclasses decide only what to do with a proposed step (:meth:`_accept_step`).

    The constructor arguments are documented on :class:`~sb3_npg.NPG`.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": ActorCriticPolicy,
        "CnnPolicy": ActorCriticCnnPolicy,
        "MultiInputPolicy": MultiInputActorCriticPolicy,
    }
    #: The ``critic_fit`` options this algorithm takes (a subclass with a critic fit of its own extends it).
    critic_fits: ClassVar[tuple[str, ...]] = CRITIC_FITS
    #: The ``train/`` keys of every update's record, NaN when no step produced them (a subclass with another solver
    #: names its own).
    always_logged_keys: ClassVar[tuple[str, ...]] = ALWAYS_LOGGED_KEYS
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
        target_kl: float | Schedule = 0.01,
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
        kl_per_action_dimension: bool = False,
        policy_batch_size: int | None = None,
        fisher: str = "analytic",
        fisher_solver: str = "cg",
        fisher_sub_sampling_factor: int = 1,
        critic_fit: str = "minibatch",
        normalize_value_targets: bool = False,
        distributed: bool = False,
        distributed_timeout: float = DEFAULT_TIMEOUT_SECONDS,
        rollout_collection: str = "fast",
        _init_setup_model: bool = True,
    ):
        if distributed:
            init_process_group(distributed_timeout)  # here, a process outside torchrun gets an error that says so
        self._reducer = Reducer(distributed)
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
        # The natural step: its radius, its batches and its advantages.
        self.target_kl, self.policy_batch_size, self.sub_sampling_factor = target_kl, policy_batch_size, sub_sampling_factor
        self.normalize_advantage = normalize_advantage
        # Conjugate gradient and its Fisher-vector products.
        self.cg_max_steps, self.cg_damping, self.cg_residual_tol = cg_max_steps, cg_damping, cg_residual_tol
        self.kl_per_action_dimension = kl_per_action_dimension
        self.fisher, self.fisher_solver, self.fisher_sub_sampling_factor = fisher, fisher_solver, fisher_sub_sampling_factor
        # The critic's fit.
        self.critic_fit, self.n_critic_updates, self.batch_size = critic_fit, n_critic_updates, batch_size
        self.max_grad_norm = max_grad_norm  # type: ignore[assignment]
        self.normalize_value_targets = normalize_value_targets
        # Data-parallel training, and how rollouts are collected.
        self.distributed, self.distributed_timeout = distributed, distributed_timeout
        self.rollout_collection = rollout_collection
        self._normalization_base: dict[str, Moments] = {}
        #: How often each of :attr:`counted_events` happened since the start of training (saved with the model).
        self.event_counts: dict[str, int] = dict.fromkeys(self.counted_events, 0)
        self.use_sde = use_sde
        self._validate_hyperparameters()
        if self.env is not None:
            self._validate_environment()
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------ set-up and validation

    def _option_checks(self) -> dict[str, OptionCheck]:
        """Each option's check, in the order they run (a subclass adds its own options' checks)."""
        return {
            "learning_rate": check_positive_or_schedule,
            "n_steps": POSITIVE_INT,
            "batch_size": POSITIVE_INT,
            "gamma": UNIT_INTERVAL,
            "gae_lambda": UNIT_INTERVAL,
            "cg_max_steps": POSITIVE_INT,
            "cg_damping": NON_NEGATIVE,
            "cg_residual_tol": NON_NEGATIVE,
            "kl_per_action_dimension": check_bool,
            "n_critic_updates": NON_NEGATIVE_INT,
            "target_kl": check_positive_or_schedule,
            "sub_sampling_factor": POSITIVE_INT,
            "max_grad_norm": check_optional_float,
            "policy_batch_size": OPTIONAL_POSITIVE_INT,
            "stats_window_size": POSITIVE_INT,
            "fisher": partial(check_choice, choices=FISHER_PRODUCTS),
            "fisher_solver": partial(check_choice, choices=FISHER_SOLVERS),
            "fisher_sub_sampling_factor": POSITIVE_INT,
            "critic_fit": partial(check_choice, choices=self.critic_fits),
            "normalize_value_targets": check_bool,
            "normalize_advantage": check_bool,
            "use_sde": check_bool,
            "sde_sample_freq": check_integer,
            "rollout_collection": partial(check_choice, choices=ROLLOUT_COLLECTIONS),
        }

    def _validate_hyperparameters(self, exempt: frozenset[str] = frozenset()) -> None:
        """Raise a :class:`ConfigurationError` naming the first option outside its allowed range."""
        check_options(self, self._option_checks(), exempt)

    def _validate_environment(self) -> None:
        """Checks that need the environment: the action space and the rollout size."""
        check_action_space(type(self).__name__, self.action_space, self.use_sde)
        rollout_size = self.n_steps * self.n_envs
        if self.normalize_advantage and rollout_size < MIN_NORMALIZED_ROLLOUT:
            raise ConfigurationError(
                f"`n_steps * n_envs` must be >= {MIN_NORMALIZED_ROLLOUT} to normalize advantages, "
                f"got n_steps={self.n_steps} and n_envs={self.n_envs}: raise `n_steps` or the number of environments, "
                "or pass `normalize_advantage=False`"
            )
        if self.critic_fit == "minibatch":
            warn_if_batches_uneven("batch_size", self.batch_size, rollout_size, "the rollout (n_steps * n_envs)")
        policy_samples = math.ceil(rollout_size / self.sub_sampling_factor)
        if self.policy_batch_size is not None:
            where = "the policy's samples (n_steps * n_envs / sub_sampling_factor, rounded up)"
            warn_if_batches_uneven("policy_batch_size", self.policy_batch_size, policy_samples, where)
        check_fisher_samples(self.fisher_sub_sampling_factor, min(self.policy_batch_size or policy_samples, policy_samples))

    def _setup_model(self) -> None:
        # Again: ``load`` sets the saved options and its keyword overrides first (not those it was told to replace).
        self._validate_hyperparameters(frozenset(self.__dict__.pop(VALIDATION_EXEMPT, ())))
        self._join_ranks()
        super()._setup_model()
        self._seed_this_rank()
        if self.fisher == "analytic" and not isinstance(self.policy.action_dist, ANALYTIC_FISHER_DISTRIBUTIONS):
            raise ConfigurationError(
                f"`fisher='analytic'` does not know the Fisher of {type(self.policy.action_dist).__name__}: "
                "use fisher='autograd'"
            )
        if self.normalize_value_targets:
            install_value_head(self.policy)  # before the split: the critic's parameters are the head's
        self._actor_params, self._critic_params = split_actor_critic_parameters(self.policy)
        if self.fisher_solver != "cg":
            self._setup_kfac()
        # The critic's optimizer covers the critic's own parameters only: the actor moves by natural steps.
        self.policy.optimizer = make_critic_optimizer(
            self.policy.optimizer_class, self._critic_params, self.lr_schedule(1), self.policy.optimizer_kwargs
        )
        self._reducer.broadcast_(list(self.policy.parameters()))  # every rank starts from the main rank's weights

    def _setup_kfac(self) -> None:
        """The K-FAC blocks of the actor, for ``fisher_solver="kfac"`` or ``"kfac_preconditioned_cg"``."""
        if not self.cg_damping > 0.0:
            raise ConfigurationError(f"`fisher_solver`={self.fisher_solver!r} needs cg_damping > 0, got {self.cg_damping}")
        try:
            self._kfac_plan = build_kfac_plan(self.policy, self._actor_params)
        except ValueError as error:
            raise ConfigurationError(f"`fisher_solver`={self.fisher_solver!r} cannot factor this actor: {error}") from error
        self._kfac_generator = torch.Generator(device=self.device).manual_seed(self.seed or 0)

    @property
    def actor_parameters(self) -> tuple[torch.nn.Parameter, ...]:
        """The parameters the action distribution depends on (a shared features extractor included): the natural
        step moves them, in this order in every flat vector."""
        return tuple(self._actor_params)

    @property
    def critic_parameters(self) -> tuple[torch.nn.Parameter, ...]:
        """The value function's own parameters: the critic's optimizer moves them, and nothing else."""
        return tuple(self._critic_params)

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        """SB3's callbacks, after :class:`~sb3_npg.common.checks.FiniteRolloutCheck`: NaN or inf from the
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
        """The rollout collection of SB3 (and of the ranks together), refused when the policy's parameters are not
        finite."""
        check_parameters_finite(self.policy, type(self).__name__)
        return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)

    def _policy_batches_per_update(self) -> int:
        """How many natural steps an update takes: one per policy batch."""
        policy_samples = math.ceil(self.n_steps * self.n_envs / self.sub_sampling_factor)
        return math.ceil(policy_samples / (self.policy_batch_size or policy_samples))

    def _collective_plan(self) -> dict[str, int]:
        """What decides which collectives an update runs: every rank of a distributed run must have the same."""
        rollout_size = self.n_steps * self.n_envs
        return {
            "samples per update (n_steps * n_envs)": rollout_size,
            "policy batches per update": self._policy_batches_per_update(),
            "batch_size": self.batch_size,
            "n_critic_updates": self.n_critic_updates,
            "critic_fit": self.critic_fits.index(self.critic_fit),
            "fisher_solver": FISHER_SOLVERS.index(self.fisher_solver),
            "normalize_value_targets": int(self.normalize_value_targets),
            "normalize_advantage": int(self.normalize_advantage),
        }

    # ------------------------------------------------------------------ the update

    def train(self) -> None:
        """One update: check its inputs, share normalization statistics across ranks, a natural step per policy
        batch, the critic fit, one log record."""
        self._check_update_inputs()
        self._synchronise_ranks()
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        rollout = rollout_tensors(self.rollout_buffer)
        policy_stats = self._update_actor(rollout)
        critic_stats = self._fit_critic(rollout.observations, rollout.returns)
        self._record_logs(policy_stats.means(), critic_stats.means())

    def _check_update_inputs(self) -> None:
        """Refuse to update from non-finite parameters or a rollout holding NaN or inf."""
        check_parameters_finite(self.policy, type(self).__name__)
        check_rollout_finite(self.rollout_buffer)

    def _fit_critic(self, observations: Observations, returns: torch.Tensor) -> WeightedMeans:
        """Regress the value on the returns with the ``critic_fit`` method (nothing when ``n_critic_updates`` is 0)."""
        if self.n_critic_updates == 0:
            return WeightedMeans()
        critic = self._critic_fit_parts(returns)
        if self.critic_fit == "lbfgs":
            return critic.lbfgs(observations, returns, self.n_critic_updates)
        return critic.minibatch_epochs(observations, returns, self.n_critic_updates, self.batch_size, self.max_grad_norm)

    def _critic_fit_parts(self, returns: torch.Tensor) -> CriticFit:
        """The critic's loss and parameters for this update's fit, the value targets' statistics updated first."""
        head = self.policy.value_net if isinstance(self.policy.value_net, NormalizedValueHead) else None
        if head is not None:
            head.add_targets(returns, self._reducer)
        return CriticFit(self.policy, self._critic_params, self._reducer, head)

    def _record_logs(self, policy_means: dict[str, float], critic_means: dict[str, float]) -> None:
        """One record per update: every key of ``docs/design.md``'s diagnostics."""
        means = {key: math.nan for key in self.always_logged_keys} | policy_means | critic_means
        means["target_kl"] = self.current_target_kl()  # the radius this update used (a schedule's value now)
        for key, value in means.items():
            self.logger.record(f"train/{key}", value, exclude="stdout" if key in NOT_ON_STDOUT else None)
        values = self.rollout_buffer.values.flatten()
        returns = self.rollout_buffer.returns.flatten()
        self.logger.record("train/explained_variance", float(explained_variance(values, returns)))
        if isinstance(self.policy.value_net, NormalizedValueHead):
            self.logger.record("train/value_target_mean", self.policy.value_net.target_mean.item(), exclude="stdout")
            self.logger.record("train/value_target_std", self.policy.value_net.target_std.item(), exclude="stdout")
        log_std = getattr(self.policy, "log_std", None)
        if isinstance(log_std, torch.Tensor):
            self.logger.record("train/std", torch.exp(log_std.detach()).mean().item())
        self._record_count("train/skipped_steps", self.skipped_steps)
        for event in self.counted_events:
            self._record_count(f"train/events/{event}", self.event_counts.get(event, 0))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")

    def _record_count(self, key: str, count: int) -> None:
        """A counter for every log format, and for stdout only when it is not zero."""
        self.logger.record(key, count, exclude=None if count else "stdout")

    # ------------------------------------------------------------------ learn, save, load

    def _excluded_save_params(self) -> list[str]:
        return [
            *super()._excluded_save_params(),
            "_actor_params",
            "_critic_params",
            "_reducer",
            "_normalization_base",
            "_warned_sb3_loop",
            "_kfac_plan",
            "_kfac_generator",
        ]
