"""Shell completion for ``hpd`` through argcomplete: ``hpd completion bash|zsh|fish`` prints the shell's hook
(argcomplete's own), which asks ``hpd`` itself for the completions of the line typed so far; :func:`commands`
walks the parser for the generated reference."""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish")


def script(shell: str) -> str:
    """The completion hook of ``shell`` for the ``hpd`` command."""
    import argcomplete

    return argcomplete.shellcode(["hpd"], shell=shell)


def commands(parser: argparse.ArgumentParser, key: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command path (``""``, ``"runs"``, ``"runs/list"``) and its parser."""
    found = {key: parser}
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its actions there
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                found.update(commands(sub, f"{key}/{name}".lstrip("/")))
    return found
