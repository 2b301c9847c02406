"""watch: a running server's served traffic in windows, what a rig predicts for it, and what to run."""
