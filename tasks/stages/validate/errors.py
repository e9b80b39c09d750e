"""The validation's error."""


class ValidateError(ValueError):
    """The validation cannot run, or its promotion lost a race; the message names the input."""
