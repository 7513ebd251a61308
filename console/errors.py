"""The CLI's user-facing failure type."""


class CliError(Exception):
    """A user-facing failure: printed as one line `gpudeck: message`, exit code `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
