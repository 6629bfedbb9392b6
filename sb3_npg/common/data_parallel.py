"""Data-parallel training on ``torch.distributed``, as methods of the algorithm: everything ranks must do together.

Each rank collects its own rollouts and every quantity an update derives from them goes through the
:class:`~sb3_npg.common.distributed.Reducer`. Around that, this module makes the ranks:

- join the process group ``torchrun`` describes, from the constructor and from ``load`` alike;
- explore differently: every rank but the main one reseeds its generators and environments with ``seed + rank``
  (a fresh seed when ``seed`` is ``None``) after the model is built or loaded;
- agree, at the start of ``learn()``, on what decides which collectives run (samples per update, batches, critic
  epochs...), so that unequal configurations fail clearly instead of pairing collectives wrongly;
- count every rank's samples in ``num_timesteps``, and stop together when a callback on the main rank stops training;
- share ``VecNormalize`` statistics and check, every ``CHECKSUM_INTERVAL`` updates, that their parameters agree.

Only the main rank logs, runs the callbacks (evaluation, checkpoints) and shows the progress bar.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TypeVar

import numpy as np
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.type_aliases import MaybeCallback
from stable_baselines3.common.vec_env import VecEnv

from sb3_npg.common.distributed import (
    CHECKSUM_INTERVAL,
    MAIN_RANK,
    Reducer,
    init_process_group,
    launched_by_torchrun,
)
from sb3_npg.common.vec_normalize_sync import Moments, combine_normalization

#: How to install what ``tensorboard_log=...`` needs (the ``tensorboard`` extra of ``pyproject.toml``).
TENSORBOARD_INSTALL = 'pip install "sb3-npg[tensorboard]"'

SelfDataParallel = TypeVar("SelfDataParallel", bound="DataParallel")
#: Seeds of numpy's legacy generator (which SB3 seeds) must be below this.
SEED_BOUND = 2**32


class DataParallel(OnPolicyAlgorithm):
    """
    What the ranks of a ``distributed=True`` run do together (nothing but the plain behaviour in one process).
    The algorithm provides the attributes annotated below and :meth:`_collective_plan`.
    """

    _reducer: Reducer
    _normalization_base: dict[str, Moments]
    _n_updates: int
    distributed: bool
    distributed_timeout: float

    @property
    def reducer(self) -> Reducer:
        """Averages every per-sample mean of an update across ``torch.distributed`` ranks (the identity in one
        process); its ``on_collective`` reports each message."""
        return self._reducer

    @abstractmethod
    def _collective_plan(self) -> dict[str, int]:
        """The quantities that decide which collectives an update runs, by name: every rank must have the same."""

    def _join_ranks(self) -> None:
        """The reducer; a ``distributed`` model built or loaded under ``torchrun`` joins its process group first."""
        if self.distributed and launched_by_torchrun():
            init_process_group(self.distributed_timeout)
        self._reducer = Reducer(self.distributed)
        self._reducer.device = self.device

    def _seed_this_rank(self) -> None:
        """Every rank but the main one reseeds its generators and environments: ``seed + rank``, or a fresh seed."""
        if self._reducer.rank == MAIN_RANK:
            return
        seed = self.seed if self.seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
        self.set_random_seed((seed + self._reducer.rank) % SEED_BOUND)

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        """SB3's set-up of ``learn()``, after the ranks agreed on :meth:`_collective_plan` (before any update)."""
        self._reducer.check_agree(self._collective_plan())
        try:
            return super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)
        except ImportError as error:
            if self.tensorboard_log is None or "tensorboard" not in str(error):
                raise
            raise ImportError(f"{error} `tensorboard_log` needs sb3-npg's extra: {TENSORBOARD_INSTALL}") from error

    def collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """
        SB3's rollout collection. With ``distributed=True``, ``num_timesteps`` counts every rank's samples once the
        rollout is complete (during it, the callbacks see this rank's steps added to the count at its start), and
        training goes on only if it goes on for every rank: a callback that stops the main rank stops them all.
        """
        start = self.num_timesteps
        complete = super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        self.num_timesteps = start + (self.num_timesteps - start) * self._reducer.world_size
        return self._reducer.all_true(complete)

    def _synchronise_ranks(self) -> None:
        """Before an update: the same parameters on every rank (checked every ``CHECKSUM_INTERVAL`` updates) and the
        ``VecNormalize`` statistics of all ranks' samples."""
        if self._n_updates % CHECKSUM_INTERVAL == 0:
            self._reducer.check_same(list(self.policy.parameters()), "policy parameters")
        vec_normalize = self.get_vec_normalize_env()
        if vec_normalize is not None:
            self._normalization_base = combine_normalization(self._reducer, vec_normalize, self._normalization_base)

    def learn(
        self: SelfDataParallel,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str | None = None,
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfDataParallel:
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
        if self._reducer.rank != MAIN_RANK:
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
