"""``python -m headprobe``: the ``headprobe`` command (``torchrun -m headprobe`` starts one per rank)."""

import sys

from headprobe_cli.main import main

if __name__ == "__main__":
    sys.exit(main())
