"""A local SMTP server (aiosmtpd) on 127.0.0.1 that keeps every message it receives, for alert tests."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

from tests.support.servers import free_port


class _Keep:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's hook
        self.messages.append(email.message_from_bytes(envelope.content, policy=email.policy.default))
        return "250 OK"


class SmtpSink:
    """Start with :meth:`start`; ``messages`` lists what arrived; :meth:`connection_uri` is an Airflow SMTP
    connection (``AIRFLOW_CONN_...``) pointing at it, plain SMTP without TLS."""

    def __init__(self) -> None:
        self._handler = _Keep()
        self.port = free_port()
        self._controller = Controller(self._handler, hostname="127.0.0.1", port=self.port)

    @property
    def messages(self) -> list[EmailMessage]:
        return list(self._handler.messages)

    def connection_uri(self) -> str:
        return f"smtp://127.0.0.1:{self.port}/?disable_ssl=true&disable_tls=true&timeout=10&retry_limit=1"

    def start(self) -> SmtpSink:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()


def body_text(message: EmailMessage) -> str:
    """A message's text (its HTML part as sent)."""
    part = message.get_body(preferencelist=("html", "plain"))
    return part.get_content() if part is not None else ""
