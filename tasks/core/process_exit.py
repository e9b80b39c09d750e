"""A command's process ends without the interpreter's last garbage collections.

With torch, transformers, great-expectations or Airflow imported, a process holds millions of objects, and the
collections CPython runs as it finalises traverse them all for seconds, only to free memory the operating system
takes back at exit anyway. Moving every object to the permanent generation (``gc.freeze``) as the process exits
makes those collections skip them. Objects are still released by reference counting and the exit handlers run as
before; only garbage in reference cycles is left to the operating system, and the pipeline closes its files and
connections explicitly (context managers), never through a finalizer. For a process's entry point only: a library
caller keeps its interpreter's exit as it is.
"""

from __future__ import annotations

import atexit
import gc


def end_without_final_collection() -> None:
    """At exit, freeze every object out of the interpreter's last collections; registered at a command's start, so
    it runs after the exit handlers registered later (LIFO), which may still leave garbage to collect."""
    atexit.register(gc.freeze)
