"""Example plugin: a team's causal conv1d kernel, registered with convmatrix."""

from my_mlu_conv.kernel import MyMluKernel

__all__ = ["MyMluKernel"]
