"""``[core] hostname_callable`` for the Celery workers of the integration test.

Airflow records ``hostname_callable()`` as a task instance's ``hostname`` (default: the machine's FQDN, the same
for every worker on one machine). Each test worker sets ``HPD_TEST_WORKER_HOSTNAME`` to its Celery hostname, so
the task instances it runs name it, as they would name separate hosts; processes without it report the FQDN.
"""

import os
import socket


def hostname() -> str:
    return os.environ.get("HPD_TEST_WORKER_HOSTNAME") or socket.getfqdn()
