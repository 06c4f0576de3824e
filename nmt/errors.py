"""User-facing errors: one clear line, exit code 2, no traceback."""

from __future__ import annotations


class NmtError(Exception):
    """A mistake in the user's input (file, config key, checkpoint); printed as one line, exit code 2."""

    exit_code = 2
