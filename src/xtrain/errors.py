"""Errors a user can act on: each message names the file, row or field and what to do."""


class XtrainError(Exception):
    """A problem with the user's input or setup; the message is complete without a traceback."""


class RecipeError(XtrainError, ValueError):
    """A recipe that cannot run; the message names the recipe file, the field and the fix."""
