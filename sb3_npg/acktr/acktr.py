"""Actor Critic using Kronecker-Factored Trust Region (ACKTR): the K-FAC natural gradient with a clipped KL."""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

import torch
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from sb3_npg.acktr.critic import KfacCriticOptions, kfac_critic_steps
from sb3_npg.acktr.kfac_state import (
    CLIP_CURVATURES,
    UNDAMPED_CURVATURE,
    KfacSettings,
    KfacStatistics,
    RunningKroneckerSolver,
)
from sb3_npg.acktr.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_npg.common.algorithm import ALWAYS_LOGGED_KEYS, NaturalPolicyGradient
from sb3_npg.common.batches import Observations, PolicyBatch, PolicyInputs, first_tensor
from sb3_npg.common.critic import CRITIC_FITS
from sb3_npg.common.distributed import DEFAULT_TIMEOUT_SECONDS
from sb3_npg.common.kfac import DAMPING_MODES, FACTORED_DAMPING
from sb3_npg.common.kfac_policy import BatchCurvature, KfacPlan, batch_curvature, build_kfac_plan
from sb3_npg.common.natural_step import PolicyObjective, StepOutcome, StepProposal
from sb3_npg.common.solvers import FisherSolver
from sb3_npg.common.stats import WeightedMeans
from sb3_npg.common.validation import (
    NON_NEGATIVE,
    POSITIVE_INT,
    ConfigurationError,
    OptionCheck,
    check_choice,
    check_float,
    check_positive_or_schedule,
    scheduled_value,
)

#: ``critic_fit`` options of ACKTR: K-FAC on the critic's Gauss-Newton matrix, or the shared fits.
ACKTR_CRITIC_FITS = ("kfac", *CRITIC_FITS)
#: ACKTR's keys of every update's record: the shared ones but conjugate gradient's, and its solver's and hook's.
ACKTR_LOGGED_KEYS = (
    *(key for key in ALWAYS_LOGGED_KEYS if key not in ("cg_iterations", "cg_residual")),
    "kfac_curvature",
    "kl_clip_fraction",
    "kl_divergence_over_clip",
    "step_size",
)
#: The step the hook takes when the KL clip binds: all of the KL-scaled step.
FULL_STEP = 1.0
#: OpenAI baselines' ACKTR settings for Atari (``acktr/acktr.py``'s ``learn`` and its ``KfacOptimizer``;
#: Stable-Baselines 2's ``ACKTR`` defaults), the constructor's defaults until 0.1.0's development changed them:
#: ``ACKTR("CnnPolicy", env, **BASELINES_ATARI_SETTINGS)`` on many environments (baselines ran 16 to 32). Not in it,
#: as no constructor keyword gives it: baselines decays ``learning_rate`` linearly to 0 (pass
#: ``learning_rate=LinearSchedule(0.25, 0.0, 1.0)``), steps through momentum SGD, computes its inverses
#: asynchronously, and takes its value loss into the policy's K-FAC update.
BASELINES_ATARI_SETTINGS: dict[str, Any] = {
    "n_steps": 20,
    "learning_rate": 0.25,
    "gamma": 0.99,
    "gae_lambda": 1.0,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "vf_fisher_coef": 1.0,
    "max_grad_norm": 0.5,
    "normalize_advantage": False,
    "kfac_clip": 0.001,
    "kfac_update": 1,
    "kfac_damping": 0.01,
    "kfac_stats_decay": 0.99,
    "critic_fit": "kfac",
    "critic_kfac_clip": None,
    "n_critic_updates": 1,
    "normalize_value_targets": False,
}


class ACKTR(NaturalPolicyGradient):
    """
    Actor Critic using Kronecker-Factored Trust Region (ACKTR)

    Paper: https://arxiv.org/abs/1708.05144 (Wu et al., 2017). Stable-Baselines 2's ``ACKTR`` keyword names where the
    meaning is the same (``docs/guide/algorithms.md`` lists those without an equivalent).

    The defaults are for vector observations on one or a few environments, as NPG's and TRPO's are: rollouts of
    ``n_steps=1024`` per environment with ``gae_lambda=0.98`` and ``normalize_advantage=True``, no entropy bonus
    (``ent_coef=0.0``), ``kfac_clip=0.01``, running factors that keep half of the past (``kfac_stats_decay=0.5``:
    between updates this far apart the policy has moved, and factors that keep 99% of the past describe a policy long
    gone), and our TRPO's critic (``critic_fit="minibatch"``, ``n_critic_updates=10`` epochs of Adam at
    ``critic_learning_rate`` on minibatches of 128). They are ``sb3_npg/zoo/hyperparams/acktr.yml``'s screened
    CartPole-v1 entry on one environment with that critic, which won the screen against the entry's K-FAC critic on
    CartPole-v1, Pendulum-v1 and Hopper-v5 (tuning seeds; ``benchmarks/acktr_defaults.py`` holds the candidates and
    measures the defaults on tasks nobody tuned, ``benchmarks/README.md``'s "Defaults" has the tables).
    They do not depend on the observation space: one call means one algorithm whatever the task, and Atari needs
    settings a constructor cannot choose anyway (16 or more environments, frame stacking). OpenAI baselines' Atari
    settings (``n_steps`` 20, ``kfac_clip`` 0.001, ``kfac_stats_decay`` 0.99, the n-step returns of ``gae_lambda``
    1, ``ent_coef`` 0.01, raw advantages, one K-FAC critic step; the defaults before) are one keyword away:
    ``ACKTR("CnnPolicy", env, **BASELINES_ATARI_SETTINGS)`` (:data:`~sb3_npg.acktr.BASELINES_ATARI_SETTINGS`).

    Each update averages the K-FAC factors of the policy's true Fisher (Kronecker factors of every ``nn.Linear`` and
    ``nn.Conv2d`` layer of the actor, exact blocks for ``log_std``) into running ones, takes K-FAC's natural direction
    ``d`` of the policy gradient (the A2C objective with an entropy bonus) and moves by
    ``min(learning_rate, sqrt(2 * kfac_clip / d^T F_hat d)) * d``, ``F_hat`` the running K-FAC Fisher; the critic
    takes K-FAC steps on its Gauss-Newton matrix with ``critic_fit="kfac"``. Its parts: the solver, ``solver``
    (:class:`~sb3_npg.acktr.kfac_state.RunningKroneckerSolver`); the step rule, the KL-scaled step with ``kfac_clip``
    as its radius (:mod:`sb3_npg.common.natural_step`); the acceptance hook, :meth:`_accept_step` below, which caps
    the step at ``learning_rate``.

    :param policy: The policy model to use (``MlpPolicy``, ``CnnPolicy``, ``MultiInputPolicy``) or an
        ``ActorCriticPolicy`` subclass
    :param env: The environment to learn from (if registered in Gymnasium, can be a str)
    :param learning_rate: The largest multiple of the K-FAC direction a step takes (actor and K-FAC critic), > 0; it
        can be a function of the remaining progress (from 1 to 0): Stable-Baselines 2's default ``lr_schedule="linear"``
        is ``LinearSchedule(0.25, 0.0, 1.0)`` here. A schedule's value must be >= 0 and finite; at 0 (where such a
        schedule ends) the update's steps are zero
    :param n_steps: The number of steps to run for each environment per update (baselines' Atari ACKTR: 20)
    :param gamma: Discount factor, in [0, 1]
    :param gae_lambda: Factor of the bias-variance trade-off of the Generalized Advantage Estimator, in [0, 1]; 1
        gives the n-step returns of Stable-Baselines 2's ``gae_lambda=None`` (baselines' Atari ACKTR)
    :param ent_coef: Entropy coefficient: the policy's objective is the surrogate plus ``ent_coef`` times the mean
        entropy, >= 0 (baselines' Atari ACKTR: 0.01)
    :param vf_coef: The value loss's weight on the critic's gradient in the K-FAC critic step, >= 0
    :param vf_fisher_coef: The weight of the critic's Gauss-Newton matrix in its Fisher (the critic as a Gaussian of
        unit variance over the returns), > 0: a larger one takes smaller critic steps under the same KL clip
    :param max_grad_norm: The cap on the global L2 norm of the critic's gradient before each step
        (``sb3_npg.common.clip_grad_norm_``); ``None`` or <= 0 disables clipping
    :param kfac_clip: The bound on the quadratic model's KL of each step, ``1/2 step^T F_hat step``, > 0; it can be a
        function of the remaining progress, whose values must be >= 0 and finite (0 takes no step). The KL is the
        true KL of the joint action distribution, summed over action dimensions (baselines' Atari ACKTR: 0.001). It
        bounds the model under the *running* factors, not the step's actual KL (logged as ``train/kl_divergence``, and
        over the clip as ``train/kl_divergence_over_clip``): with OpenAI baselines' settings (20 steps per update,
        ``kfac_stats_decay=0.99``) the actual KL is a median 22x ``kfac_clip`` on CartPole-v1 and 64x on Pendulum-v1,
        2.8x and 3.3x with ``kfac_stats_decay=0`` (``benchmarks/acktr_baselines.py``). Stable-Baselines 2's
        ``kfac_clip=c`` bounds the same model's KL by ``c / 2``: pass ``c / 2`` here, or translate a whole SB2
        configuration with :func:`sb3_npg.acktr.sb2_acktr_kwargs`
    :param kfac_update: Recompute the inverse of the running factors every this many updates (their running averages
        are updated at every one). The inverse's eigendecompositions grow with the cube of each layer's inputs: with
        ``CnnPolicy`` (NatureCNN's linear layer takes 3136 inputs) raise it, as OpenAI baselines' asynchronous
        inversion did in effect
    :param use_sde: Whether to use generalized State Dependent Exploration (gSDE) instead of action noise
        (Box actions only)
    :param sde_sample_freq: Sample a new gSDE noise matrix every n steps (-1: only at the start of each rollout)
    :param rollout_buffer_class: Rollout buffer class to use. If ``None``, it is selected from the observation space
    :param rollout_buffer_kwargs: Keyword arguments of the rollout buffer
    :param normalize_advantage: Whether to normalize the advantages over the rollout (OpenAI baselines' continuous
        ACKTR does; its Atari one does not)
    :param stats_window_size: Window size for the rollout logging, specifying the number of episodes to average
        the reported success rate, mean episode length, and mean reward over
    :param tensorboard_log: The log location for TensorBoard (if None, no logging)
    :param policy_kwargs: Additional arguments to be passed to the policy on creation
    :param verbose: The verbosity level: 0 no output, 1 info, 2 debug
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run; "auto" uses the GPU if possible
    :param kfac_damping: The Tikhonov damping of the K-FAC inverses (OpenAI baselines' ``epsilon``), > 0
    :param kfac_damping_mode: How ``kfac_damping`` enters each layer's inverse: ``"factored"`` (default) splits it
        between the layer's two factors by the pi-correction of Martens and Grosse (2015), ``(G + sqrt(damping) / pi I)
        (x) (A + pi sqrt(damping) I)``; ``"eigenbasis"`` damps the Kronecker product exactly, ``(G (x) A + damping
        I)^-1``, diagonal in the factors' eigenbasis (OpenAI baselines' and Stable-Baselines 2's default; no extra
        cost, the factors are eigendecomposed either way). It applies to the actor's and the K-FAC critic's inverses
    :param kfac_clip_curvature: The curvature ``c`` of the direction ``d`` that the KL clip scales the step by,
        ``sqrt(2 kfac_clip / c)``: ``"undamped"`` (default, the paper's) ``d^T F_hat d``; ``"damped"`` ``g^T d``, that
        is ``d^T (F_hat + damping) d`` under the damped Fisher ``d`` was solved with (OpenAI baselines' and Stable-
        Baselines 2's clip; smaller steps where the damping dominates). Actor and K-FAC critic alike
    :param kfac_stats_decay: The decay of the factors' running averages (OpenAI baselines' ``stats_decay``), in
        [0, 1): ``F <- kfac_stats_decay * F + (1 - kfac_stats_decay) * F_batch``; the first update sets them
        (baselines' Atari ACKTR: 0.99, over its updates of 20 steps)
    :param critic_fit: How the critic is fitted each update. ``"kfac"`` (the paper's; baselines' Atari ACKTR):
        ``n_critic_updates`` K-FAC steps on its Gauss-Newton matrix, each
        ``min(learning_rate, sqrt(2 * critic_kfac_clip / d^T F_hat d)) * d`` with running factors. ``"minibatch"``
        (default, NPG's and TRPO's): ``n_critic_updates`` epochs of ``batch_size`` minibatch steps of the policy's
        optimizer (Adam by default) at ``critic_learning_rate``, with the ``max_grad_norm`` clip.
        ``"lbfgs"``: full-batch L-BFGS of at most ``n_critic_updates`` iterations. Every fit moves the critic's own
        parameters only: with a shared features extractor (``CnnPolicy``'s default) the K-FAC critic's plan holds the
        value head alone, so the value loss never shapes the shared CNN (which only the actor's natural step moves),
        where OpenAI baselines' joint update lets it; pass ``policy_kwargs=dict(share_features_extractor=False)`` for a
        critic with a CNN of its own
    :param critic_kfac_clip: The K-FAC critic's bound on its quadratic model's KL (of the unit-variance Gaussian over
        the returns) per step, > 0; ``None``: ``kfac_clip``
    :param n_critic_updates: The number of critic steps (``"kfac"``), epochs (``"minibatch"``) or iterations
        (``"lbfgs"``) per update (0 disables the critic; baselines' Atari ACKTR: 1)
    :param critic_learning_rate: The learning rate of the critic's optimizer with ``critic_fit="minibatch"``, > 0
    :param batch_size: Minibatch size of the critic's optimizer steps with ``critic_fit="minibatch"`` (NPG's and
        TRPO's default)
    :param normalize_value_targets: Whether the critic learns the returns in units of their running mean and
        standard deviation (PopArt's preserved outputs, https://arxiv.org/abs/1602.07714), as for NPG and TRPO
    :param distributed: Data-parallel training on ``torch.distributed`` (launch with ``torchrun``): every mean an
        update computes, K-FAC factors included, is averaged over all ranks' samples, so all ranks take the same step
    :param distributed_timeout: Seconds a collective waits for the other ranks before the run stops with
        ``sb3_npg.common.distributed.DistributedError``
    :param rollout_collection: ``"fast"`` (default): SB3's rollout loop with per-step work cut to acting (see
        :class:`~sb3_npg.NPG`). ``"sb3"``: SB3's own loop
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
    }
    critic_fits: ClassVar[tuple[str, ...]] = ACKTR_CRITIC_FITS
    always_logged_keys: ClassVar[tuple[str, ...]] = ACKTR_LOGGED_KEYS
    target_kl_option: ClassVar[str] = "kfac_clip"

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 0.25,
        n_steps: int = 1024,
        gamma: float = 0.99,
        gae_lambda: float = 0.98,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        vf_fisher_coef: float = 1.0,
        max_grad_norm: float | None = 0.5,
        kfac_clip: float | Schedule = 0.01,
        kfac_update: int = 1,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: type[RolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        normalize_advantage: bool = True,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: torch.device | str = "auto",
        *,
        kfac_damping: float = 0.01,
        kfac_damping_mode: str = FACTORED_DAMPING,
        kfac_clip_curvature: str = UNDAMPED_CURVATURE,
        kfac_stats_decay: float = 0.5,
        critic_fit: str = "minibatch",
        critic_kfac_clip: float | None = None,
        n_critic_updates: int = 10,
        critic_learning_rate: float = 1e-3,
        batch_size: int = 128,
        normalize_value_targets: bool = False,
        distributed: bool = False,
        distributed_timeout: float = DEFAULT_TIMEOUT_SECONDS,
        rollout_collection: str = "fast",
        _init_setup_model: bool = True,
    ):
        # ACKTR's own options, set before the shared constructor, which validates them with the shared ones.
        self.kfac_clip, self.kfac_update, self.kfac_damping, self.kfac_stats_decay = (
            kfac_clip,
            kfac_update,
            kfac_damping,
            kfac_stats_decay,
        )
        self.kfac_damping_mode, self.kfac_clip_curvature = kfac_damping_mode, kfac_clip_curvature
        self.vf_fisher_coef, self.critic_kfac_clip, self.critic_learning_rate = (
            vf_fisher_coef,
            critic_kfac_clip,
            critic_learning_rate,
        )
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            gamma=gamma,
            n_critic_updates=n_critic_updates,
            gae_lambda=gae_lambda,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            normalize_advantage=normalize_advantage,
            target_kl=kfac_clip,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
            max_grad_norm=max_grad_norm,
            critic_fit=critic_fit,
            normalize_value_targets=normalize_value_targets,
            distributed=distributed,
            distributed_timeout=distributed_timeout,
            rollout_collection=rollout_collection,
            _init_setup_model=False,
        )
        # SB3's constructor set these to 0 (the shared base fits the critic apart); ACKTR's objective uses them.
        self.ent_coef, self.vf_coef = ent_coef, vf_coef
        self._validate_hyperparameters()
        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------ options

    @property
    def target_kl(self) -> float | Schedule:
        """The shared step's KL radius: ACKTR's ``kfac_clip``."""
        return self.kfac_clip

    @target_kl.setter
    def target_kl(self, value: float | Schedule) -> None:
        self.kfac_clip = value

    def _option_checks(self) -> dict[str, OptionCheck]:
        checks = {name: check for name, check in super()._option_checks().items() if name not in ACKTR_UNUSED}
        return {
            **checks,
            "kfac_clip": check_positive_or_schedule,
            "kfac_update": POSITIVE_INT,
            "kfac_damping": partial(check_float, low=0.0, low_inclusive=False),
            "kfac_damping_mode": partial(check_choice, choices=DAMPING_MODES),
            "kfac_clip_curvature": partial(check_choice, choices=CLIP_CURVATURES),
            "kfac_stats_decay": partial(check_float, low=0.0, high=1.0, high_inclusive=False),
            "ent_coef": NON_NEGATIVE,
            "vf_coef": NON_NEGATIVE,
            "vf_fisher_coef": partial(check_float, low=0.0, low_inclusive=False),
            "critic_kfac_clip": _check_optional_positive,
            "critic_learning_rate": partial(check_float, low=0.0, low_inclusive=False),
        }

    # ------------------------------------------------------------------ set-up

    def _setup_model(self) -> None:
        super()._setup_model()
        self._actor_plan = self._kfac_plan_of(self._actor_params, "actor")
        self.kfac_statistics = KfacStatistics(self._actor_plan)
        self._critic_plan = self._kfac_plan_of(self._critic_params, "critic") if self.critic_fit == "kfac" else None
        self.critic_kfac_statistics = None if self._critic_plan is None else KfacStatistics(self._critic_plan)
        self._kfac_generator = torch.Generator(device=self.device).manual_seed(self.seed or 0)

    def _kfac_plan_of(self, params: list[torch.nn.Parameter], part: str) -> KfacPlan:
        """The K-FAC blocks of the actor's or the critic's parameters; a clear error for a layer K-FAC cannot factor."""
        try:
            return build_kfac_plan(self.policy, params)
        except ValueError as error:
            raise ConfigurationError(f"ACKTR cannot factor this policy's {part}: {error}") from error

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        """The running K-FAC statistics are saved beside the policy, so a loaded model continues exactly."""
        state_dicts, variables = super()._get_torch_save_params()
        extra = ["kfac_statistics"] + (["critic_kfac_statistics"] if self.critic_kfac_statistics is not None else [])
        return [*state_dicts, *extra], variables

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_actor_plan", "_critic_plan"]

    # ------------------------------------------------------------------ the update

    @property
    def solver(self) -> FisherSolver:
        """Running K-FAC: each step's factors averaged in, the direction from their damped inverse."""
        return RunningKroneckerSolver(self._actor_plan, self.kfac_statistics, self._actor_curvature, self._kfac_settings)

    @property
    def _kfac_settings(self) -> KfacSettings:
        return KfacSettings(
            self.kfac_damping, self.kfac_stats_decay, self.kfac_update, self.kfac_damping_mode, self.kfac_clip_curvature
        )

    def _actor_curvature(self, observations: PolicyInputs) -> BatchCurvature:
        """The true-Fisher factors of the actor on a step's samples, over every rank's samples."""
        local = batch_curvature(self._actor_plan, self.policy, observations, self._kfac_generator)
        return local.averaged(partial(self._reducer.mean, weight=len(first_tensor(observations))))

    def current_learning_rate(self) -> float:
        """The largest multiple of the K-FAC direction this update takes (``learning_rate`` now), >= 0 and finite (0,
        where a schedule reaches it, takes no step)."""
        return scheduled_value("learning_rate", self.lr_schedule, self._current_progress_remaining)

    def policy_objective(self, batch: PolicyBatch, distribution: Distribution, behaviour: Distribution) -> PolicyObjective:
        """The surrogate plus ``ent_coef`` times the mean entropy (whose gradient at the base point is A2C's)."""
        objective = super().policy_objective(batch, distribution, behaviour)
        entropy = distribution.entropy()
        if self.ent_coef == 0.0 or entropy is None:
            return objective
        return objective._replace(surrogate=objective.surrogate + self.ent_coef * entropy.mean())

    def _accept_step(self, proposal: StepProposal) -> StepOutcome:
        """
        The step ``min(learning_rate, sqrt(2 * kfac_clip / d^T F_hat d)) * d``: the KL-scaled step (whose quadratic
        model's KL is ``kfac_clip``), or less where ``learning_rate`` caps it; taken without a line search. The KL it
        returns (logged as ``train/kl_divergence``) is measured on the step's samples, old against new distribution,
        not the model's; ``train/kl_divergence_over_clip`` is that KL over ``kfac_clip``.
        """
        learning_rate = self.current_learning_rate()  # 0 at a schedule's end: no step
        fraction = FULL_STEP if learning_rate >= proposal.kl_scale else learning_rate / proposal.kl_scale
        proposal.apply(fraction)
        surrogate, kl = proposal.measure()
        metrics = {
            "kl_clip_fraction": float(fraction == FULL_STEP),
            "kl_divergence_over_clip": kl / self.current_target_kl(),
            "step_size": fraction * proposal.kl_scale,
        }
        return StepOutcome(fraction=fraction, surrogate=surrogate, kl=kl, metrics=metrics)

    def _update_learning_rate(self, optimizers: list[torch.optim.Optimizer] | torch.optim.Optimizer) -> None:
        """Log ``learning_rate`` (the steps' cap); the shared critic fits' optimizer runs at ``critic_learning_rate``."""
        self.logger.record("train/learning_rate", self.current_learning_rate())
        for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
            for group in optimizer.param_groups:
                group["lr"] = self.critic_learning_rate

    def _fit_critic(self, observations: Observations, returns: torch.Tensor) -> WeightedMeans:
        """K-FAC steps on the critic's Gauss-Newton matrix (``critic_fit="kfac"``), else the shared fits."""
        if self.critic_fit != "kfac" or self.n_critic_updates == 0:
            return super()._fit_critic(observations, returns)
        if self._critic_plan is None or self.critic_kfac_statistics is None:
            raise RuntimeError("The K-FAC critic was not set up")
        critic = self._critic_fit_parts(returns)
        clip = self.critic_kfac_clip if self.critic_kfac_clip is not None else self.current_target_kl()
        options = KfacCriticOptions(self.current_learning_rate(), clip, self.vf_coef, self.vf_fisher_coef, self.max_grad_norm)
        return kfac_critic_steps(
            critic,
            self._critic_plan,
            self.critic_kfac_statistics,
            (observations, returns),
            self._kfac_settings,
            options,
            self.n_critic_updates,
        )


#: Options of the shared base that ACKTR does not take (its constructor leaves them at their defaults).
ACKTR_UNUSED = frozenset({"target_kl", "cg_max_steps", "cg_damping", "cg_residual_tol", "fisher_solver"})


def _check_optional_positive(name: str, value: Any) -> None:
    """``None``, or a positive finite number."""
    if value is not None:
        check_float(name, value, 0.0, low_inclusive=False)
