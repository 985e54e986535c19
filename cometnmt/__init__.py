"""cometnmt: neural machine translation with convolution + attention architectures."""

__version__ = "0.1.0"
