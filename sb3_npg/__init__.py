"""Natural policy gradient (NPG), TRPO and ACKTR for Stable-Baselines3."""

from sb3_npg.version import __version__

from sb3_npg.acktr import ACKTR
from sb3_npg.common.algorithm import FAST_SETTINGS
from sb3_npg.mask import MaskableACKTR, MaskableNPG, MaskableTRPO
from sb3_npg.npg import NPG
from sb3_npg.trpo import TRPO

__all__ = ["ACKTR", "FAST_SETTINGS", "NPG", "TRPO", "MaskableACKTR", "MaskableNPG", "MaskableTRPO", "__version__"]
