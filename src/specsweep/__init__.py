"""specsweep: find the speculative-decoding settings that make an inference server fastest."""

__version__ = "0.1.0"
