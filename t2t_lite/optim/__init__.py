"""Learning-rate schedules, optimizers and exact gradient accumulation."""
