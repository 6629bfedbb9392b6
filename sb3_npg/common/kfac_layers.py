"""The layers K-FAC factors: what a layer's inputs and output gradients contribute, and its parameters as a matrix.

Pure PyTorch, like :mod:`sb3_npg.common.kfac`, which builds the factors' algebra on it.

**``nn.Linear``**: a layer ``s = W a + b`` contributes ``A = E[a_ext a_ext^T]`` with ``a_ext = [a, 1]`` (a bias is the
weight of a constant input) and ``G = E[g g^T]``, ``g`` the log-likelihood's gradient at ``s``.

**``nn.Conv2d``** (Grosse and Martens 2016, "A Kronecker-factored approximate Fisher matrix for convolution layers",
https://arxiv.org/abs/1602.01407): the convolution is a linear layer applied at every output location ``t`` of ``T`` to
the input patch ``a_t`` (``F.unfold``'s ``C * kh * kw`` values, channel-major, the order of ``weight.view(out, -1)``),
so the weight's gradient per sample is ``sum_t g_t a_t^T``. Under the paper's spatial homogeneity and uncorrelated
derivatives, the Fisher block is ``T * kron(E_t[g g^T], E_t[a a^T])``; here ``A`` is the mean of ``a_t a_t^T`` over
samples and locations and ``G = E_n[sum_t g_t g_t^T]`` carries the ``T``. For a kernel as large as its input (one
location) it is the linear layer's factors exactly. Grouped convolutions, string paddings (``"same"``) and padding
modes other than zeros are refused.

**The layer's matrix** is ``V = [W | b]`` (``out x in_ext``, a convolution's weight as ``weight.view(out, -1)``);
:func:`layer_matrices` and :func:`flatten_layer_matrices` move between a flat vector in the parameters' order
(``[vec(W), b]`` per layer, :func:`layer_parameters`) and these matrices.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

#: The layers whose factors this module computes.
SUPPORTED_LAYERS = (nn.Linear, nn.Conv2d)
#: The value of the input column appended for a bias (the bias is the weight of a constant input).
BIAS_INPUT = 1.0
#: The dimensions of a 2-d convolution's output: ``(n, channels, height, width)``.
CONV_OUTPUT_DIMS = 4


def layer_weight_and_bias(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    A supported layer's weight and bias (``None`` without one; a bias adds a column of ones to the inputs).

    :param layer: the layer
    :return: ``(weight, bias)``
    :raises TypeError: for a layer whose factors this module cannot compute
    """
    if not isinstance(layer, SUPPORTED_LAYERS):
        raise TypeError(f"K-FAC supports {[kind.__name__ for kind in SUPPORTED_LAYERS]}, not {type(layer).__name__}")
    if isinstance(layer, nn.Conv2d) and (layer.groups != 1 or layer.padding_mode != "zeros" or isinstance(layer.padding, str)):
        raise TypeError(f"K-FAC supports nn.Conv2d with groups=1 and numeric zero padding, not {layer}")
    return layer.weight, layer.bias


def factor_sizes(layer: nn.Module) -> tuple[int, int]:
    """The sizes of a layer's factors: ``in_ext`` (inputs, or patch values, plus one for a bias) and ``out``."""
    weight, bias = layer_weight_and_bias(layer)
    return weight[0].numel() + (bias is not None), weight.shape[0]


def layer_parameters(layers: Sequence[nn.Module]) -> list[torch.Tensor]:
    """
    The parameters of ``layers`` in the order of every flat vector here: each layer's weight, then its bias.

    :param layers: the layers, each supported (``SUPPORTED_LAYERS``)
    :return: the parameters, in order
    """
    params: list[torch.Tensor] = []
    for layer in layers:
        weight, bias = layer_weight_and_bias(layer)
        params.extend([weight] if bias is None else [weight, bias])
    return params


def expanded_inputs(layer: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The rows ``a_ext``, ``(n, in_ext)``, of a layer's inputs (a convolution's patches, ``(n * T, in_ext)``):
    ``BIAS_INPUT`` appended for a bias."""
    _, bias = layer_weight_and_bias(layer)
    if isinstance(layer, nn.Conv2d):
        padding = (0, 0) if isinstance(layer.padding, str) else layer.padding  # a string padding was refused above
        patches = F.unfold(inputs.detach(), layer.kernel_size, dilation=layer.dilation, padding=padding, stride=layer.stride)
        rows = patches.transpose(1, 2).reshape(-1, patches.shape[1])
    else:
        rows = inputs.detach().reshape(-1, inputs.shape[-1])
    if bias is not None:
        rows = torch.cat([rows, torch.full_like(rows[:, :1], BIAS_INPUT)], dim=1)
    return rows


def second_moment(rows: torch.Tensor) -> torch.Tensor:
    """The second moment ``E[x x^T] = rows^T rows / n`` of per-sample rows ``(n, d)``: a ``(d, d)`` matrix."""
    return rows.T @ rows / rows.shape[0]


def input_factor(layer: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """``A = E[a_ext a_ext^T]``, ``(in_ext, in_ext)``, of a layer from the inputs it saw (a convolution's: the mean
    over samples and locations)."""
    return second_moment(expanded_inputs(layer, inputs))


def output_factor(gradient: torch.Tensor) -> torch.Tensor:
    """
    A layer's ``G`` from the per-sample gradients at its outputs: ``E[g g^T]`` for a linear layer's ``(n, out)``, and
    ``E_n[sum_t g_t g_t^T]`` for a convolution's ``(n, out, height, width)`` (the module doc).

    :param gradient: the gradients, detached
    :return: ``(out, out)``
    """
    if gradient.dim() == CONV_OUTPUT_DIMS:
        locations = gradient.shape[2] * gradient.shape[3]
        rows = gradient.permute(0, 2, 3, 1).reshape(-1, gradient.shape[1])
        return second_moment(rows) * locations
    return second_moment(gradient.reshape(-1, gradient.shape[-1]))


@dataclass
class LayerRecord:
    """
    What one forward pass through a layer left: its inputs (detached) and its outputs (with their graph).

    :param inputs: the layer's inputs
    :param outputs: the layer's outputs, differentiable, for the backward signals of the ``G`` factor
    """

    inputs: torch.Tensor
    outputs: torch.Tensor


@contextmanager
def record_layers(layers: Sequence[nn.Module]) -> Iterator[dict[nn.Module, LayerRecord]]:
    """
    Record every supported layer's inputs and outputs during the forward passes inside the ``with`` block.

    A layer called more than once keeps its last call. The hooks are removed on leaving the block.

    :param layers: the layers to record
    :return: (yields) a dict filled by the forward passes, layer to :class:`LayerRecord`
    """
    records: dict[nn.Module, LayerRecord] = {}

    def hook(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        records[module] = LayerRecord(inputs=args[0].detach(), outputs=output)

    handles = []
    for layer in layers:
        layer_weight_and_bias(layer)
        handles.append(layer.register_forward_hook(hook))
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()


def layer_matrices(flat: torch.Tensor, layers: Sequence[nn.Module]) -> list[torch.Tensor]:
    """
    Split a flat vector in the parameters' order (:func:`layer_parameters`) into each layer's ``V = [W | b]``.

    :param flat: the vector
    :param layers: the layers
    :return: one ``(out, in_ext)`` matrix per layer
    """
    total = sum(param.numel() for param in layer_parameters(layers))
    if total != flat.numel():
        raise ValueError(f"The flat vector has {flat.numel()} values but the layers hold {total}")
    matrices, offset = [], 0
    for layer in layers:
        weight, bias = layer_weight_and_bias(layer)
        columns = [flat[offset : offset + weight.numel()].view(weight.shape[0], -1)]
        offset += weight.numel()
        if bias is not None:
            columns.append(flat[offset : offset + bias.numel()].view(-1, 1))
            offset += bias.numel()
        matrices.append(torch.cat(columns, dim=1))
    return matrices


def flatten_layer_matrices(matrices: Sequence[torch.Tensor], layers: Sequence[nn.Module]) -> torch.Tensor:
    """The inverse of :func:`layer_matrices`: each layer's ``[W | b]`` back into ``[vec(W), b]``, concatenated."""
    parts = []
    for matrix, layer in zip(matrices, layers, strict=True):
        weight, bias = layer_weight_and_bias(layer)
        columns = weight[0].numel()
        parts.append(matrix[:, :columns].reshape(-1))
        if bias is not None:
            parts.append(matrix[:, columns])
    return torch.cat(parts)
