"""The REST client of the local Airflow against a real HTTP server on 127.0.0.1: a 503 (SQLite's "Database is
locked" while the scheduler writes) is tried again until it answers, other errors and a lasting 503 are raised."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tasks.orchestration import local_airflow
from tasks.orchestration.local_airflow import AirflowFailed, rest_call


class Scripted(ThreadingHTTPServer):
    """Answers each POST with the next status of ``script`` (the last one repeats) and records the bodies."""

    def __init__(self, script: list[int]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.script, self.bodies = script, []


class Handler(BaseHTTPRequestHandler):
    server: Scripted

    def do_POST(self) -> None:  # noqa: N802 (the http.server name)
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        status = self.server.script.pop(0) if len(self.server.script) > 1 else self.server.script[0]
        answer = json.dumps({"status": status}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def serve(monkeypatch) -> Iterator:
    monkeypatch.setattr(local_airflow, "UNAVAILABLE_RETRY_PAUSES", (0.01, 0.01, 0.01))
    servers: list[Scripted] = []

    def start(script: list[int]) -> tuple[Scripted, str]:
        server = Scripted(script)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, f"http://127.0.0.1:{server.server_address[1]}/api/v2/backfills"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_503_is_tried_again_with_the_same_body_until_it_answers(serve):
    server, url = serve([503, 503, 200])
    assert rest_call(url, "POST", {"dag_id": "d"}, "token") == {"status": 200}
    assert server.bodies == [{"dag_id": "d"}] * 3


def test_a_lasting_503_is_raised_after_the_last_try(serve):
    server, url = serve([503])
    with pytest.raises(AirflowFailed, match="503"):
        rest_call(url, "POST", {"dag_id": "d"}, "token")
    assert len(server.bodies) == len(local_airflow.UNAVAILABLE_RETRY_PAUSES) + 1


def test_another_error_is_raised_at_once(serve):
    server, url = serve([409, 200])
    with pytest.raises(AirflowFailed, match="409"):
        rest_call(url, "POST", {"dag_id": "d"}, "token")
    assert len(server.bodies) == 1
