#!/usr/bin/env python
"""``python tools/export.py --help``: the command line of :mod:`ppma.deploy.export`, whose docstring is the usage
(also ``python -m ppma.deploy.export``)."""
import sys

from ppma.deploy.export import main

if __name__ == "__main__":
    sys.exit(main())
