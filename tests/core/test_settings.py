"""The settings model: each ``HPD_*`` variable typed, defaulted and validated, read from the environment as it is."""

from pathlib import Path

import pytest

from tasks.core import config, progress, settings
from tasks.core.settings import SettingsError, current
from tasks.serve import client


def test_defaults_where_nothing_is_set(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    found = current({})
    assert found.store == config.DEFAULT_STORE == "var/store"
    assert found.s3_max_attempts == 8 and found.s3_part_size == 8 * settings.MIB
    assert found.model_cache == tmp_path / ".cache" / "hpd-pipeline" / "models"  # the home of now, not of import
    assert found.alert_email == [] and found.aws_conn_id is None and found.default_min_stsb is None
    assert found.serve_url == "http://127.0.0.1:8765"


def test_values_are_typed_and_an_empty_variable_is_unset():
    found = current(
        {
            "HPD_DEFAULT_K": "64",
            "HPD_DEFAULT_MIN_STSB": "0.7",
            "HPD_MODEL_CACHE": "/models",
            "HPD_ALERT_EMAIL": " a@example.com, ,b@example.com ",
            "HPD_GPU_QUEUE": "",
            "HPD_AWS_CONN_ID": "  ",
            "HPD_SERVE_URL": "http://search:8765/",
            "OTHER": "ignored",
        }
    )
    assert found.default_k == 64 and found.default_min_stsb == 0.7 and found.model_cache == Path("/models")
    assert found.alert_email == ["a@example.com", "b@example.com"]
    assert found.gpu_queue == "default" and found.aws_conn_id is None
    assert found.serve_url == "http://search:8765/"


@pytest.mark.parametrize("off", ["", "off", " off "])
def test_an_empty_or_off_service_url_turns_the_service_off(off, monkeypatch):
    monkeypatch.setenv("HPD_SERVE_URL", off)
    assert client.service_url() is None
    monkeypatch.setenv("HPD_SERVE_URL", "http://search:8765/")
    assert client.service_url() == "http://search:8765"


def test_every_wrong_variable_is_named_with_its_value():
    with pytest.raises(SettingsError) as err:
        current({"HPD_DEFAULT_K": "many", "HPD_LOG_EVERY_S": "-1", "HPD_ENCODE_POOL_SLOTS": "0", "HPD_STORE": "x"})
    message = str(err.value)
    assert "HPD_DEFAULT_K='many'" in message and "HPD_LOG_EVERY_S='-1'" in message
    assert "HPD_ENCODE_POOL_SLOTS='0'" in message and "HPD_STORE" not in message


def test_the_code_reads_the_environment_as_it_is_now(monkeypatch, tmp_path):
    monkeypatch.setenv("HPD_LOG_EVERY_S", "2.5")
    assert progress.default_every_s() == 2.5
    monkeypatch.setenv("HPD_STORE", str(tmp_path / "there"))
    assert config.default_store() == f"file://{tmp_path}/there"
    monkeypatch.setenv("HPD_S3_MAX_ATTEMPTS", "nine")
    with pytest.raises(config.ConfigError, match="HPD_S3_MAX_ATTEMPTS='nine'"):
        config.default_store()  # a wrong setting is a configuration error of the stage that reads it


def test_settings_read_once_follow_each_change_of_what_they_are_read_from(monkeypatch, tmp_path):
    """Read once per environment (every S3 call reads them), yet a changed variable, home or ``.env`` file (the
    same size, rewritten at once) is seen at the next read."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HPD_DEFAULT_K", raising=False)
    monkeypatch.delenv("HPD_MODEL_CACHE", raising=False)
    assert current() is current()
    monkeypatch.setenv("HPD_DEFAULT_K", "16")
    assert current().default_k == 16
    monkeypatch.delenv("HPD_DEFAULT_K")
    for k in (32, 64, 32):
        (tmp_path / ".env").write_text(f"HPD_DEFAULT_K={k}\n")
        assert current().default_k == k
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    assert current().model_cache == tmp_path / "elsewhere" / ".cache" / "hpd-pipeline" / "models"
    (tmp_path / ".env").write_text("HPD_DEFUALT_K=32\n")
    with pytest.raises(SettingsError, match="HPD_DEFUALT_K"):  # a wrong read is not kept either
        current()
    (tmp_path / ".env").unlink()
    assert current().default_k == 128


def test_each_connection_is_named_by_a_setting():
    for connection in settings.CONNECTIONS:
        assert connection.setting in settings.Settings.model_fields
    assert current({"HPD_SMTP_CONN_ID": "smtp_alerts"}).smtp_conn_id == "smtp_alerts"


def test_a_dot_env_file_in_the_working_directory_sets_what_the_environment_does_not(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HPD_DEFAULT_K", raising=False)
    monkeypatch.setenv("HPD_GPU_QUEUE", "from-the-environment")
    (tmp_path / ".env").write_text("HPD_DEFAULT_K=32\nHPD_GPU_QUEUE=from-the-file\nOTHER_TOOL=ignored\n")
    found = current()
    assert found.default_k == 32 and found.gpu_queue == "from-the-environment"
    assert current({}).default_k == 128  # given variables alone: no file


def test_a_dot_env_name_that_is_no_setting_is_refused(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("HPD_DEFUALT_K=32\n")
    with pytest.raises(SettingsError, match="HPD_DEFUALT_K='32'"):
        current()
