from airflow.providers.smtp.notifications.smtp import SmtpNotifier

from tasks.orchestration import alerts


def test_no_recipients_no_notifier(monkeypatch):
    monkeypatch.delenv("HPD_ALERT_EMAIL", raising=False)
    assert alerts.failure_notifiers() == []


def test_the_smtp_notifier_is_configured_from_the_deployment(monkeypatch):
    monkeypatch.setenv("HPD_ALERT_EMAIL", "ml-oncall@example.com, data@example.com")
    monkeypatch.setenv("HPD_SMTP_CONN_ID", "smtp_alerts")
    (notifier,) = alerts.failure_notifiers()
    assert isinstance(notifier, SmtpNotifier)
    assert notifier.to == ["ml-oncall@example.com", "data@example.com"]
    assert notifier.smtp_conn_id == "smtp_alerts"
    assert "{{ exception }}" in notifier.html_content and "{{ ti.task_id }}" in notifier.subject
