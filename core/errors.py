"""Errors the CLI reports as one line, without a traceback."""


class UserError(Exception):
    """Bad input from the user (a file, a flag, a task id): one line naming it, exit code 2."""
