from sb3_npg.acktr.acktr import ACKTR
from sb3_npg.acktr.policies import CnnPolicy, MlpPolicy, MultiInputPolicy

__all__ = ["ACKTR", "CnnPolicy", "MlpPolicy", "MultiInputPolicy"]
