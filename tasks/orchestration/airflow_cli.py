"""Airflow CLI commands one after the other in one process, each run as the ``airflow`` executable runs it
(``airflow.__main__.main``: Airflow's parser, then the command's function), so that the imports of Airflow and of
the libraries its tasks load are paid once, not once per command. ``hpd demo`` runs its chain this way.

Before each command a line ``STEP`` + ``{"label": ..., "command": ...}`` on stdout marks where its output starts.
A failing command ends the process with its exit status, as the executable would; the commands after it do not run.
"""

from __future__ import annotations

import json
import sys

STEP = "hpd-airflow-step "


def step_line(label: str, argv: list[str]) -> str:
    """The line that marks the start of the command ``argv`` (``airflow`` left out), known as ``label``."""
    words = argv[: argv.index("--conf")] if "--conf" in argv else argv  # a run's JSON conf is left out
    return STEP + json.dumps({"label": label, "command": " ".join(["airflow", *words])})


def run(commands: dict[str, list[str]]) -> None:
    """Each command of ``commands`` (label: the ``airflow`` arguments), in order, in this process."""
    from airflow.__main__ import main

    for label, argv in commands.items():
        print(step_line(label, argv), flush=True)
        sys.argv = ["airflow", *argv]
        main()
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
