"""What one level measured, reduced: a level's figures from its requests, acceptance from counter
deltas, counter growth across resets, when a level has measured enough. Pure: no I/O."""
