"""Airflow CLI commands one after the other in one process, as ``hpd demo`` runs its chain
(:mod:`tasks.orchestration.airflow_cli`): Airflow and the tasks' libraries are imported once, each command's output
is kept apart."""

from __future__ import annotations

import json
import subprocess
import sys

from tasks.orchestration import airflow_cli


def run(commands: dict[str, list[str]], env: dict[str, str]) -> dict[str, str]:
    """The output (stdout and stderr) of each command of ``commands`` (label: the ``airflow`` arguments), by label;
    asserts that every one succeeded."""
    argv = [sys.executable, "-m", airflow_cli.__name__, json.dumps(commands)]
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    outputs: dict[str, str] = {}
    label = None
    for line in done.stdout.splitlines(keepends=True):
        if step := airflow_cli.Step.read(line):
            label = step.label
            outputs[label] = ""
        elif label is not None:
            outputs[label] += line
    assert list(outputs) == list(commands), done.stdout[-4000:]
    return outputs
