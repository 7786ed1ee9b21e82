"""Dropping one known log message at the logger that emits it (and nothing else that logger says)."""

from __future__ import annotations

import logging


class DropMessage(logging.Filter):
    """Drops the records whose message contains `text`."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def drop_message(logger_name: str, text: str) -> None:
    """Add a `DropMessage(text)` filter to the logger `logger_name` (once)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, DropMessage) and f.text == text for f in logger.filters):
        logger.addFilter(DropMessage(text))
