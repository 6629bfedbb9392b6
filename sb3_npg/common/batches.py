"""The rollout as tensors, the batches of the natural step, and row selection in observations of any space."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, overload

import torch
from stable_baselines3.common.buffers import RolloutBuffer

from sb3_npg.common.distributed import Reducer

#: A batch of observations: a tensor, or a dict of tensors for Dict observation spaces.
Observations = torch.Tensor | dict[str, torch.Tensor]


class MaskedInputs(NamedTuple):
    """
    What a masked policy reads to give its action distribution: the observations and the action masks recorded with
    them at collection (the behaviour policy's), one row per sample.

    :param observations: the observations
    :param action_masks: the masks, ``(n, mask_dims)``, nonzero where an action is valid (sb3-contrib's layout)
    """

    observations: Observations
    action_masks: torch.Tensor


#: What the update hands the policy for a distribution: observations, or observations with what else it reads.
PolicyInputs = Observations | MaskedInputs
#: Added to the advantages' standard deviation when normalizing them.
ADVANTAGE_NORMALIZATION_EPS = 1e-8
#: The smallest rollout for which advantages can be normalized (a standard deviation needs two samples).
MIN_NORMALIZED_ROLLOUT = 2


class RolloutTensors(NamedTuple):
    """The parts of the rollout an update uses, as tensors."""

    observations: Observations
    actions: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    old_log_prob: torch.Tensor
    action_masks: torch.Tensor | None = None


class PolicyBatch(NamedTuple):
    """
    The tensors the policy's objective needs.

    :param observations: what the policy reads: the observations, with the action masks for a masked policy
    :param actions: the actions taken
    :param advantages: their advantages
    :param old_log_prob: their log-probabilities under the behaviour policy, which collected them (the rollout's)
    """

    observations: PolicyInputs
    actions: torch.Tensor
    advantages: torch.Tensor
    old_log_prob: torch.Tensor

    @property
    def size(self) -> int:
        """The number of samples."""
        return len(self.advantages)

    def rows(self, index: slice) -> PolicyBatch:
        """The samples ``index`` of this batch."""
        return PolicyBatch(select_rows(self.observations, index), *(part[index] for part in self[1:]))


def first_tensor(observations: PolicyInputs) -> torch.Tensor:
    """The observations' tensor (the first one of a dict), to count samples."""
    if isinstance(observations, MaskedInputs):
        return first_tensor(observations.observations)
    return next(iter(observations.values())) if isinstance(observations, dict) else observations


@overload
def select_rows(observations: MaskedInputs, index: slice | torch.Tensor) -> MaskedInputs: ...
@overload
def select_rows(observations: Observations, index: slice | torch.Tensor) -> Observations: ...
@overload
def select_rows(observations: PolicyInputs, index: slice | torch.Tensor) -> PolicyInputs: ...
def select_rows(observations: PolicyInputs, index: slice | torch.Tensor) -> PolicyInputs:
    """
    Rows ``index`` of a batch of observations (or of policy inputs: the masks go with their rows).

    :param observations: a tensor, a dict of tensors for Dict spaces, or :class:`MaskedInputs`
    :param index: a slice or an index tensor over the first dimension
    :return: the selected rows, in the same structure
    """
    if isinstance(observations, MaskedInputs):
        return MaskedInputs(select_rows(observations.observations, index), observations.action_masks[index])
    if isinstance(observations, dict):
        return {key: value[index] for key, value in observations.items()}
    return observations[index]


def policy_inputs(observations: Observations, action_masks: torch.Tensor | None) -> PolicyInputs:
    """The observations, or the observations with their action masks (for a masked policy)."""
    return observations if action_masks is None else MaskedInputs(observations, action_masks)


def float64_to_float32(observations: Observations) -> Observations:
    """Float64 observations as float32 (SB3's preprocessing of a Box does ``.float()``); others unchanged."""
    if isinstance(observations, dict):
        return {key: float64_to_float32(value) for key, value in observations.items()}  # type: ignore[misc]
    return observations.float() if observations.dtype == torch.float64 else observations


def rollout_tensors(buffer: RolloutBuffer) -> RolloutTensors:
    """
    The whole rollout as tensors (in the buffer's shuffled order), converted once per update.

    Float64 observations (MuJoCo's) become float32 here, which is what the policy's preprocessing would do on every
    forward pass, so every minibatch and forward pass after this copies half the bytes and converts nothing.

    :param buffer: the filled rollout buffer
    """
    rollout = next(buffer.get(batch_size=None))
    observations = float64_to_float32(rollout.observations)
    masks = getattr(rollout, "action_masks", None)  # sb3-contrib's masked buffers
    return RolloutTensors(observations, rollout.actions, rollout.advantages, rollout.returns, rollout.old_log_prob, masks)


def normalized_advantages(advantages: torch.Tensor, reducer: Reducer) -> torch.Tensor:
    """
    Advantages minus their mean over all samples, over their (unbiased) standard deviation there.

    Across ranks in two passes, mean then squared deviations, as stable as the single-process formula.

    :param advantages: this rank's advantages
    :param reducer: the model's reducer
    """
    if not reducer.enabled:
        if len(advantages) < MIN_NORMALIZED_ROLLOUT:
            return advantages
        return (advantages - advantages.mean()) / (advantages.std() + ADVANTAGE_NORMALIZATION_EPS)
    total, count = reducer.sum(torch.stack([advantages.sum(), advantages.new_tensor(float(len(advantages)))]))
    if count < MIN_NORMALIZED_ROLLOUT:
        return advantages
    mean = total / count
    variance = reducer.sum((advantages - mean).square().sum()) / (count - 1)
    return (advantages - mean) / (variance.sqrt() + ADVANTAGE_NORMALIZATION_EPS)


def policy_sample(
    rollout: RolloutTensors,
    sub_sampling_factor: int,
    *,
    discrete_actions: bool,
    normalize: Callable[[torch.Tensor], torch.Tensor] | None,
) -> PolicyBatch:
    """
    The policy's share of the rollout: every ``sub_sampling_factor``-th sample.

    :param rollout: the whole rollout
    :param sub_sampling_factor: keep every n-th sample
    :param discrete_actions: whether actions are indices of a ``Discrete`` space (made ``long`` and flat)
    :param normalize: applied to the kept advantages, all together (``None``: they stay raw)
    """
    index = slice(None, None, sub_sampling_factor)
    actions = rollout.actions[index]
    if discrete_actions:
        actions = actions.long().flatten()
    advantages = rollout.advantages[index]
    if normalize is not None:
        advantages = normalize(advantages)
    observations = policy_inputs(rollout.observations, rollout.action_masks)
    return PolicyBatch(select_rows(observations, index), actions, advantages, rollout.old_log_prob[index])


def split(sample: PolicyBatch, batch_size: int | None) -> list[PolicyBatch]:
    """
    ``sample`` in consecutive batches of ``batch_size`` (the last may be smaller).

    :param sample: the policy's samples (already in the rollout buffer's shuffled order)
    :param batch_size: the samples of each batch (``None``: one batch of all)
    """
    step = batch_size or sample.size
    return [sample.rows(slice(start, start + step)) for start in range(0, sample.size, step)]
