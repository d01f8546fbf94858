"""The one exception type for bad data input; run.py prints it as a one-line error."""


class DataError(ValueError):
    """Data that cannot be used as given: the message names the value and what would be valid."""
