"""The vLLM-compatible emulator: a separate server process built on the engines/analysis vocabulary."""
