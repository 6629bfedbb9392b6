from sb3_npg.common.checks import NonFiniteParametersError
from sb3_npg.common.clip import clip_grad_norm_, grad_norm
from sb3_npg.common.distributed import DistributedError
from sb3_npg.common.validation import ConfigurationError

__all__ = ["ConfigurationError", "DistributedError", "NonFiniteParametersError", "clip_grad_norm_", "grad_norm"]
