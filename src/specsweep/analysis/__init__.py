"""The study's model, pure math: acceptance fits, the step-time model, rates, the one rule that picks."""
