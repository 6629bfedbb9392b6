"""The one global-norm gradient clip shared by every call site (critic updates of NPG and TRPO), and the norm it uses."""

from __future__ import annotations

import math

from collections.abc import Iterable

import torch

#: Added to the norm in the scale ``max_norm / (norm + CLIP_EPS)`` so the result never divides by zero.
CLIP_EPS = 1e-6

ParametersOrTensors = torch.Tensor | Iterable[torch.Tensor]


def _gradients(parameters_or_tensors: ParametersOrTensors) -> list[torch.Tensor]:
    """The gradient tensors: ``.grad`` of parameters (skipping those without one), plain tensors as they are."""
    if isinstance(parameters_or_tensors, torch.Tensor):
        parameters_or_tensors = [parameters_or_tensors]
    gradients = []
    for tensor in parameters_or_tensors:
        if isinstance(tensor, torch.nn.Parameter) or tensor.requires_grad:
            if tensor.grad is not None:
                gradients.append(tensor.grad.detach())
        else:
            gradients.append(tensor.detach())
    return gradients


def _global_norm(gradients: list[torch.Tensor]) -> torch.Tensor:
    """``sqrt(sum_p ||g_p||^2)`` as a scalar tensor: the per-tensor norms in one multi-tensor kernel, then their norm."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(gradients, 2.0)), 2.0)


def grad_norm(parameters_or_tensors: ParametersOrTensors) -> float:
    """
    The global L2 norm of gradients, ``sqrt(sum_p ||g_p||^2)``, without changing them.

    :param parameters_or_tensors: parameters (their ``.grad`` is measured; those without one count zero) or gradient
        tensors (measured themselves)
    :return: the norm (``0.0`` when there is no gradient)
    """
    gradients = _gradients(parameters_or_tensors)
    return float(_global_norm(gradients)) if gradients else 0.0


def clip_grad_norm_on_device_(parameters_or_tensors: ParametersOrTensors, max_norm: float | None) -> torch.Tensor:
    """
    :func:`clip_grad_norm_`'s rule, decided on the gradients' device: nothing is read back to the host, so a step on
    an accelerator does not wait for it. On a CPU the plain :func:`clip_grad_norm_` costs less (fewer operations).

    :param parameters_or_tensors: parameters (their ``.grad`` is clipped) or gradient tensors (clipped themselves)
    :param max_norm: the cap on the global norm; ``None`` or ``<= 0`` disables clipping
    :return: the global norm before clipping, as a scalar tensor (``0`` when there is no gradient)
    """
    gradients = _gradients(parameters_or_tensors)
    if not gradients:
        return torch.zeros(())
    total_norm = _global_norm(gradients)
    if max_norm is not None and max_norm > 0:
        clip = torch.isfinite(total_norm) & (total_norm > max_norm)
        torch._foreach_mul_(gradients, torch.where(clip, max_norm / (total_norm + CLIP_EPS), 1.0))
    return total_norm


def clip_grad_norm_(parameters_or_tensors: ParametersOrTensors, max_norm: float | None) -> float:
    """
    Clip gradients by their joint (global) L2 norm, in place, and return that norm before clipping.

    The norm is ``sqrt(sum_p ||g_p||^2)`` over every gradient present; parameters without a gradient count zero.
    When it exceeds ``max_norm``, every gradient is multiplied by ``max_norm / (norm + 1e-6)``, which keeps the
    direction of the joint gradient. A non-finite norm, or a ``max_norm`` that is ``None`` or ``<= 0``, leaves
    the gradients untouched (unlike :func:`torch.nn.utils.clip_grad_norm_`, which would scale them by NaN).

    :param parameters_or_tensors: parameters (their ``.grad`` is clipped) or gradient tensors (clipped themselves)
    :param max_norm: the cap on the global norm; ``None`` or ``<= 0`` disables clipping
    :return: the global norm before clipping (``0.0`` when there is no gradient)
    """
    gradients = _gradients(parameters_or_tensors)
    if not gradients:
        return 0.0
    total_norm = float(_global_norm(gradients))
    if max_norm is not None and max_norm > 0 and math.isfinite(total_norm) and total_norm > max_norm:
        torch._foreach_mul_(gradients, max_norm / (total_norm + CLIP_EPS))
    return total_norm
