"""scaleguard: a pytest performance regression suite for PyTorch training on 1..N devices."""

__version__ = "0.1.0"
