"""``hpd`` run as a command ends without the interpreter's last garbage collections (its objects frozen at exit);
``tasks.cli.main`` called from Python leaves its caller's exit as it is."""

import subprocess
import sys

import pytest

# An exit handler registered first runs last: it sees whether anything froze the objects before the interpreter
# finalises.
PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
from tasks import cli
sys.argv = ["hpd", "--version"]
cli.main({argv})
"""


@pytest.mark.parametrize(("argv", "frozen"), [("", True), ('["--version"]', False)], ids=["command", "library"])
def test_the_command_freezes_its_objects_at_exit_and_a_library_call_does_not(argv, frozen):
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"frozen at exit: {frozen}"
