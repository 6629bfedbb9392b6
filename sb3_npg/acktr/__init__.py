from sb3_npg.acktr.acktr import ACKTR, BASELINES_ATARI_SETTINGS
from sb3_npg.acktr.policies import CnnPolicy, MlpPolicy, MultiInputPolicy

__all__ = ["ACKTR", "BASELINES_ATARI_SETTINGS", "CnnPolicy", "MlpPolicy", "MultiInputPolicy"]
