"""The ``headprobe`` command line: argument parsing, progress, files; the work is in ``headprobe``."""
