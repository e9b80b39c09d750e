"""Failure alerts: Airflow's SMTP notifier, on every task that fails for good (after its retries; a failed
quality gate and the other permanent errors fail at once: ``defaults.FailPermanentErrors``), with the DAG, run,
task, the try it failed on, the error (a gate's reasons, scores and report URI) and the log's address.
Configured by the deployment: ``HPD_ALERT_EMAIL`` (recipients, comma-separated; unset: no alerts),
``HPD_ALERT_FROM`` (else the connection's from address) and the SMTP connection ``HPD_SMTP_CONN_ID`` (default
``smtp_default``, e.g. from ``AIRFLOW_CONN_SMTP_DEFAULT``)."""

from __future__ import annotations

from typing import Any

from tasks.core import settings

SUBJECT = "[hpd] {{ dag.dag_id }}.{{ ti.task_id }} failed (run {{ run_id }})"
BODY = (
    "<p>Task <b>{{ ti.task_id }}</b> of DAG <b>{{ dag.dag_id }}</b> failed on try {{ ti.try_number }}.</p>"
    "<ul><li>run: {{ run_id }} ({{ dag_run.run_type }})</li><li>partition: {{ dag_run.partition_key or '-' }}</li></ul>"
    "<p><b>Error</b></p><pre>{{ exception }}</pre>"
    '<p><a href="{{ ti.log_url }}">Task log</a></p>'
)


def failure_notifiers() -> list[Any]:
    """The notifiers every task's ``on_failure_callback`` holds: none unless ``HPD_ALERT_EMAIL`` is set."""
    hpd = settings.current()
    if not hpd.alert_email:
        return []
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    return [
        SmtpNotifier(
            to=hpd.alert_email,
            from_email=hpd.alert_from,
            smtp_conn_id=hpd.smtp_conn_id,
            subject=SUBJECT,
            html_content=BODY,
        )
    ]
