"""What differs per inference server, with no I/O: flags, validation, metric names, syntax."""
