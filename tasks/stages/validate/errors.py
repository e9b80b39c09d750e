"""The validation's error."""


class ValidationError(ValueError):
    """The validation cannot run, or its promotion lost a race; the message names the input."""
