"""TSLib's inception blocks under its names, signatures and state_dict keys (Time-Series-Library,
layers/Conv_Blocks.py; TimesNet, Wu et al., ICLR 2023): layers/inception.InceptionBlock, the block this
codebase's TimesNet uses, which runs the average of the parallel convolutions as one convolution.
"""
from torch import nn

from layers.inception import InceptionBlock


class Inception_Block_V1(InceptionBlock):
    """num_kernels square convolutions, sizes 1, 3, ..., 2 num_kernels - 1, averaged."""

    def __init__(self, in_channels, out_channels, num_kernels=6, init_weight=True):
        super().__init__(in_channels, out_channels, num_kernels, init_weight)
        self.in_channels = in_channels
        self.out_channels = out_channels


class Inception_Block_V2(Inception_Block_V1):
    """num_kernels // 2 pairs of 1 x (2i + 3) and (2i + 3) x 1 convolutions and one 1 x 1, averaged."""

    @staticmethod
    def convolutions(in_channels, out_channels, num_kernels):
        kernels = []
        for i in range(num_kernels // 2):
            kernels.append(nn.Conv2d(in_channels, out_channels, kernel_size=[1, 2 * i + 3], padding=[0, i + 1]))
            kernels.append(nn.Conv2d(in_channels, out_channels, kernel_size=[2 * i + 3, 1], padding=[i + 1, 0]))
        kernels.append(nn.Conv2d(in_channels, out_channels, kernel_size=1))
        return kernels
