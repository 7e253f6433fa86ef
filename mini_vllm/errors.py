"""Errors a user can cause and fix: the CLI prints them as one line, without a traceback."""


class UserError(ValueError):
    """A mistake in what the user asked for; the message says what to do instead."""


class MissingWeightsError(UserError):
    """The real model's weights package is not installed."""
