"""The optimizer loop: search space, optuna ask/tell, recommendation from measured trials."""
