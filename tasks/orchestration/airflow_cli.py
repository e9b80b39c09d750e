"""Airflow CLI commands one after the other in one process, each run as the ``airflow`` executable runs it
(``airflow.__main__.main``: Airflow's parser, then the command's function), so that the imports of Airflow and of
the libraries its tasks load are paid once, not once per command. ``hpd demo`` runs its chain this way.

Before each command its :class:`Step` line on stdout marks where its output starts.
A failing command ends the process with its exit status, as the executable would; the commands after it do not run.
"""

from __future__ import annotations

import json
import sys
from typing import NamedTuple

from tasks.core.process_exit import end_without_final_collection

STEP = "hpd-airflow-step "


class Step(NamedTuple):
    """A command of the run: its label and its command line (``airflow`` and its words, a run's JSON conf left out)."""

    label: str
    command: str

    @classmethod
    def of(cls, label: str, argv: list[str]) -> Step:
        words = argv[: argv.index("--conf")] if "--conf" in argv else argv
        return cls(label, " ".join(["airflow", *words]))

    @classmethod
    def read(cls, line: str) -> Step | None:
        """The step a line of the output starts (None: a line of a command's own)."""
        return cls(**json.loads(line.removeprefix(STEP))) if line.startswith(STEP) else None

    def line(self) -> str:
        return STEP + json.dumps(self._asdict())


def run(commands: dict[str, list[str]]) -> None:
    """Each command of ``commands`` (label: the ``airflow`` arguments), in order, in this process."""
    from airflow.__main__ import main

    for label, argv in commands.items():
        # One write, its newline with it: a thread of the previous command's (OpenLineage's client) may be writing
        # a line of its own, which ``print``'s separate write of the newline would let in before it.
        sys.stdout.write(Step.of(label, argv).line() + "\n")
        sys.stdout.flush()
        sys.argv = ["airflow", *argv]
        main()
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    end_without_final_collection()
    run(json.loads(sys.argv[1]))
