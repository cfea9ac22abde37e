"""Domain errors -> click exceptions with exit codes."""

from __future__ import annotations

import click

EXIT_SPEC_ERROR = 2
EXIT_NOT_READY = 1


class SpecInvalid(click.ClickException):
    exit_code = EXIT_SPEC_ERROR

    def format_message(self) -> str:
        return f"invalid pipeline spec: {self.message}"


class CheckFailed(click.ClickException):
    exit_code = EXIT_NOT_READY
