from sb3_npg.acktr.acktr import ACKTR, BASELINES_ATARI_SETTINGS
from sb3_npg.acktr.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_npg.acktr.sb2 import sb2_acktr_kwargs

__all__ = ["ACKTR", "BASELINES_ATARI_SETTINGS", "CnnPolicy", "MlpPolicy", "MultiInputPolicy", "sb2_acktr_kwargs"]
