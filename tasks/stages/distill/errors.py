"""The distill stage's error."""


class DistillError(ValueError):
    """Distillation cannot run or resume as configured; the message names the input."""
