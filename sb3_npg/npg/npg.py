"""Natural Policy Gradient (NPG) with a KL-scaled step."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, Schedule

from sb3_npg.common.algorithm import NaturalPolicyGradient
from sb3_npg.common.checks import user_stack_level
from sb3_npg.common.distributed import DEFAULT_TIMEOUT_SECONDS
from sb3_npg.common.natural_step import StepOutcome, StepProposal
from sb3_npg.npg.policies import CnnPolicy, MlpPolicy, MultiInputPolicy

#: NPG always takes the whole KL-scaled step.
FULL_STEP = 1.0


class NPG(NaturalPolicyGradient):
    """
    Natural Policy Gradient (NPG)

    Paper: https://papers.nips.cc/paper/2073-a-natural-policy-gradient (Kakade, 2001); the KL-normalized step
    follows https://arxiv.org/abs/1703.02660 (Rajeswaran et al., 2017).

    Each update solves ``(F + cg_damping * I) s = g`` by conjugate gradient on Fisher-vector products (``F`` the
    Fisher matrix of the policy, ``g`` the gradient of the surrogate objective) and takes the full step
    ``sqrt(2 * target_kl / s^T (F + cg_damping * I) s) * s``, with no line search; the critic is fitted by minibatch
    regression. Its parts: the solver, ``solver`` (conjugate gradient, :mod:`sb3_npg.common.solvers`); the step rule,
    the KL-scaled step (:mod:`sb3_npg.common.natural_step`); the acceptance hook, :meth:`_accept_step` below.

    Actor and critic parameters are found from the computation graph, not from names, so custom policies work.
    With a shared features extractor (``share_features_extractor=True``, the default of ``CnnPolicy``) the
    extractor belongs to the actor: only the natural step moves it, so the critic cannot move the policy outside
    the trust region; the critic's optimizer trains the value head (and a separate value extractor) only.

    :param policy: The policy model to use (``MlpPolicy``, ``CnnPolicy``, ``MultiInputPolicy``) or an
        ``ActorCriticPolicy`` subclass
    :param env: The environment to learn from (if registered in Gymnasium, can be a str)
    :param learning_rate: The learning rate of the critic's optimizer (Adam by default); it can be a function
        of the remaining progress (from 1 to 0). The actor has no learning rate: its step is set by ``target_kl``
    :param n_steps: The number of steps to run for each environment per update (the rollout holds
        ``n_steps * n_envs`` samples, which must be at least 2 when ``normalize_advantage``)
    :param batch_size: Minibatch size of the critic's optimizer steps
    :param gamma: Discount factor, in [0, 1]
    :param cg_max_steps: The most Fisher-vector products conjugate gradient uses to solve ``F s = g``
    :param cg_damping: Damping added to the Fisher-vector product, ``(F + cg_damping * I) v``, >= 0
    :param n_critic_updates: The number of epochs of critic minibatch updates per rollout (0 disables the critic)
    :param gae_lambda: Factor of the bias-variance trade-off of the Generalized Advantage Estimator, in [0, 1]
    :param use_sde: Whether to use generalized State Dependent Exploration (gSDE) instead of action noise
        (Box actions only)
    :param sde_sample_freq: Sample a new gSDE noise matrix every n steps (-1: only at the start of each rollout)
    :param rollout_buffer_class: Rollout buffer class to use. If ``None``, it is selected from the observation space
    :param rollout_buffer_kwargs: Keyword arguments of the rollout buffer
    :param normalize_advantage: Whether to normalize the advantages over the rollout
    :param target_kl: The KL radius of each natural step, > 0: the step is scaled so that the damped quadratic
        model of the KL from the old policy, ``1/2 step^T (F + cg_damping * I) step``, equals it; the undamped model
        ``1/2 step^T F step``, which a small step's KL follows, is lower by the damping's share of that curvature
        (``train/kl_divergence`` reports the KL reached; a lower ``cg_damping`` brings it closer). It can be a
        function of the remaining progress (from 1 to 0), such as SB3's ``LinearSchedule(0.03, 0.003, 1.0)``: each
        update uses its value then, which must be >= 0 and finite, 0 taking no step (``train/target_kl`` logs it;
        ``train/step_fraction`` is then 0), so a schedule may reach 0 at the end of training. The KL is the true KL
        of the joint action distribution, summed over action dimensions (sb3-contrib's TRPO averages it over them, so
        its ``target_kl`` on a d-dimensional Box is d times looser)
    :param sub_sampling_factor: Use every n-th sample of the rollout for the whole policy update (gradient,
        Fisher products and line search), as sb3-contrib does; the critic always uses the full rollout
    :param stats_window_size: Window size for the rollout logging, specifying the number of episodes to average
        the reported success rate, mean episode length, and mean reward over
    :param tensorboard_log: The log location for TensorBoard (if None, no logging)
    :param policy_kwargs: Additional arguments to be passed to the policy on creation
    :param verbose: The verbosity level: 0 no output, 1 info, 2 debug
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run; "auto" uses the GPU if possible
    :param max_grad_norm: The cap on the global L2 norm of the critic's gradient before each optimizer step
        (``sb3_npg.common.clip_grad_norm_``); ``None`` or <= 0 disables clipping
    :param cg_residual_tol: Conjugate gradient stops once ``||g - F s||^2 <= cg_residual_tol * ||g||^2``: relative
        to the gradient, so the solve does not depend on the reward scale, >= 0
    :param kl_per_action_dimension: ``target_kl`` and ``cg_damping`` are per action dimension, sb3-contrib's
        convention (its KL is the mean over the dimensions of a Box or the bits of a MultiBinary): the model uses both
        multiplied by that number (1 for Discrete and MultiDiscrete actions), the same trust region and the same
        conjugate-gradient problem as sb3-contrib's for the same values, so one setting carries across action spaces
        (``train/target_kl`` logs the radius in use)
    :param policy_batch_size: ``None``: one natural step on the whole rollout (as sb3-contrib). An int: one
        natural step per shuffled minibatch of that size, each from the parameters the previous one left, its ratio
        taken against the behaviour policy (the rollout's log-probabilities). TRPO's line search keeps every accepted
        step within ``target_kl`` of the behaviour policy over all the update's samples; NPG scales each step to
        ``target_kl`` from where it starts, so its KL from the behaviour policy grows with the number of batches
        (``train/kl_divergence`` reports it; NPG warns at construction when an update has more than one batch)
    :param fisher: How Fisher-vector products are computed; both give the same product (the Hessian of the mean
        KL at the base point). ``"analytic"`` (default): the Gauss-Newton product ``J^T M J v`` with the action
        distribution's analytic Fisher ``M`` (Categorical, MultiCategorical, Bernoulli, diagonal Gaussian and gSDE);
        ``"autograd"``: double backward through the KL, for custom distributions (``benchmarks/bench_fisher.py``
        times both)
    :param fisher_solver: How each natural direction ``(F + cg_damping * I)^-1 g`` is found. ``"cg"`` (default):
        conjugate gradient on Fisher-vector products. ``"kfac"``: K-FAC's inverse of the damped Fisher on the step's
        samples (Kronecker-factored blocks of the actor's linear and 2-d convolution layers, exact blocks for
        ``log_std``; the true Fisher of the policy's own actions), with one Fisher product to scale the step by the
        same KL model (``cg_residual`` logs how far it is from the solve). ``"kfac_preconditioned_cg"``: conjugate
        gradient preconditioned by it: the same stopping rule, in fewer products where K-FAC resembles the Fisher.
        The K-FAC options need ``cg_damping`` > 0 and an actor of such layers (a parameter outside them is refused);
        with ``distributed``, the factors are those of every rank's samples together
    :param fisher_sub_sampling_factor: Compute Fisher-vector products on every n-th sample of the policy batch
        only, while the gradient and the line search keep the whole batch (the TRPO paper's trick; OpenAI
        baselines use 5). Conjugate gradient gets about n times cheaper; unlike ``sub_sampling_factor``, the
        gradient loses no samples. A factor that leaves one sample of a policy batch is refused
    :param critic_fit: How the critic is fitted each update. ``"minibatch"`` (default, as sb3-contrib):
        ``n_critic_updates`` epochs of ``batch_size`` minibatch steps of the policy's optimizer with the
        ``max_grad_norm`` clip. ``"lbfgs"``: full-batch L-BFGS with a strong-Wolfe line search, at most
        ``n_critic_updates`` iterations, started afresh each update; the line search sets the step, so
        ``learning_rate``, ``batch_size`` and ``max_grad_norm`` do not apply to the critic
    :param normalize_value_targets: Whether the critic learns the returns in units of their running mean and
        standard deviation (over every rollout so far), its last layer rescaled whenever they change so that no value
        changes (PopArt's preserved outputs, https://arxiv.org/abs/1602.07714); the critic's loss, and
        ``train/value_loss``, are then in those units. The values the rollout and GAE use stay in the returns' units.
        Needs a linear value layer (``policy.value_net``, as all of SB3's policies have); the statistics are buffers
        of that layer, saved with the model
    :param distributed: Data-parallel training on ``torch.distributed`` (launch with ``torchrun``): each rank collects
        its own rollouts (seeded ``seed + rank``), and every mean an update computes (advantage statistics, surrogate
        gradient, Fisher-vector products, line-search surrogate and KL, critic gradients) is averaged over all ranks'
        samples, so all ranks take the same step from rank 0's initial weights. Joins the process group of the
        ``torchrun`` environment variables unless one is initialized (NCCL with CUDA, else gloo)
    :param distributed_timeout: Seconds a collective waits for the other ranks before the run stops with
        ``sb3_npg.common.distributed.DistributedError`` (a rank died or stalled)
    :param rollout_collection: ``"fast"`` (default): SB3's rollout loop with per-step work cut to acting; values and
        log-probabilities are computed for the whole rollout after it, so callbacks do not see ``values`` and
        ``log_probs`` among their step locals (the same rollout otherwise; a policy that overrides ``forward``,
        ``get_distribution``, ``evaluate_actions``, ``predict_values`` or ``extract_features``, or a custom rollout
        buffer class, gets SB3's loop with a warning). ``"sb3"``: SB3's own loop
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
    }

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
        # Spelled out, as SB3's algorithms do, so that ``help(NPG)``, IDEs and a wrong keyword's error name NPG.
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            gamma=gamma,
            cg_max_steps=cg_max_steps,
            cg_damping=cg_damping,
            n_critic_updates=n_critic_updates,
            gae_lambda=gae_lambda,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            normalize_advantage=normalize_advantage,
            target_kl=target_kl,
            sub_sampling_factor=sub_sampling_factor,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
            max_grad_norm=max_grad_norm,
            cg_residual_tol=cg_residual_tol,
            kl_per_action_dimension=kl_per_action_dimension,
            policy_batch_size=policy_batch_size,
            fisher=fisher,
            fisher_solver=fisher_solver,
            fisher_sub_sampling_factor=fisher_sub_sampling_factor,
            critic_fit=critic_fit,
            normalize_value_targets=normalize_value_targets,
            distributed=distributed,
            distributed_timeout=distributed_timeout,
            rollout_collection=rollout_collection,
            _init_setup_model=_init_setup_model,
        )

    def _validate_environment(self) -> None:
        """The shared checks, and a warning that policy batches take NPG outside the trust region."""
        super()._validate_environment()
        batches = self._policy_batches_per_update()
        if batches > 1:
            warnings.warn(
                f"NPG with `policy_batch_size`={self.policy_batch_size} takes {batches} natural steps per update, each "
                "scaled to target_kl from where the previous one left the policy, so the update's KL from the behaviour "
                "policy can exceed target_kl several times over (train/kl_divergence reports it); TRPO's line search "
                "keeps it within target_kl",
                UserWarning,
                stacklevel=user_stack_level(),
            )

    def _accept_step(self, proposal: StepProposal) -> StepOutcome:
        """Take the full natural step and measure where it landed."""
        proposal.apply(FULL_STEP)
        surrogate, kl = proposal.measure()
        return StepOutcome(fraction=FULL_STEP, surrogate=surrogate, kl=kl)
