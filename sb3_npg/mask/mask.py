"""
``MaskableNPG``, ``MaskableTRPO`` and ``MaskableACKTR``: each its algorithm, unchanged, with sb3-contrib's masking.

The constructor, its keywords and defaults, and the update are the unmasked class's; what masking adds (sb3-contrib's
masked policies as ``MlpPolicy``/``CnnPolicy``/``MultiInputPolicy``, its masked buffers, ``learn(use_masking=)``,
``predict(action_masks=)``) is :class:`~sb3_npg.common.masking.MaskableAlgorithm`. A ``MaskablePPO`` script runs with
``MaskableTRPO`` swapped in, PPO's own keywords (``clip_range``, ``n_epochs``, ``ent_coef``...) aside.
"""

from sb3_npg.acktr import ACKTR
from sb3_npg.common.masking import MaskableAlgorithm
from sb3_npg.npg import NPG
from sb3_npg.trpo import TRPO


class MaskableNPG(MaskableAlgorithm, NPG):
    """NPG (:class:`~sb3_npg.NPG`, same keywords) on sb3-contrib's masked policies: the natural gradient over valid actions."""


class MaskableTRPO(MaskableAlgorithm, TRPO):
    """TRPO (:class:`~sb3_npg.TRPO`, same keywords) on sb3-contrib's masked policies: the trust region over valid actions."""


class MaskableACKTR(MaskableAlgorithm, ACKTR):
    """ACKTR (:class:`~sb3_npg.ACKTR`, same keywords) on sb3-contrib's masked policies: K-FAC over valid actions."""
