"""The report plugin as Airflow loads it in every process: loading it imports neither FastAPI nor the API server's
security stack; the API server's read of ``fastapi_apps`` builds the report app, once, behind Airflow's access
check for the DAG whose tasks write each kind of report."""

import subprocess
import sys

PROBE = """
import sys
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
assert not errors, errors
(plugin,) = [p for p in plugins if p.name == "hpd_reports"]
heavy = ("fastapi", "airflow.api_fastapi.core_api.security", "tasks.serve.reports")
print("loaded:", sorted(name for name in heavy if name in sys.modules))
(mounted,) = plugin.fastapi_apps
assert plugin.fastapi_apps[0]["app"] is mounted["app"] and mounted["url_prefix"] == "/hpd/reports"
print("read:", sorted(name for name in heavy if name in sys.modules))
print("routes:", sorted({route.path for route in mounted["app"].routes if "{" in route.path}))
"""


def test_loading_the_plugin_builds_no_app_and_reading_its_apps_builds_one():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded, read, routes = done.stdout.splitlines()[-3:]
    assert loaded == "loaded: []"
    assert read == "read: ['airflow.api_fastapi.core_api.security', 'fastapi', 'tasks.serve.reports']"
    assert routes.startswith("routes: ['/") and "{" in routes
