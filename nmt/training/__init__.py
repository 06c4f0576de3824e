"""Training loop, checkpoints, learning-rate schedules."""
