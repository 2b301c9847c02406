"""Pure math on counts and timings: acceptance, expected tokens per step, throughput."""
