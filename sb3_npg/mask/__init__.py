"""NPG, TRPO and ACKTR with invalid-action masking, in sb3-contrib's ``MaskablePPO`` API."""

from sb3_npg.mask.mask import MaskableACKTR, MaskableNPG, MaskableTRPO

__all__ = ["MaskableACKTR", "MaskableNPG", "MaskableTRPO"]
