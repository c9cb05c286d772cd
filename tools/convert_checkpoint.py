#!/usr/bin/env python
"""``python tools/convert_checkpoint.py --help``: the command line of :mod:`ppma.deploy.convert_checkpoint`, whose docstring is the usage
(also ``python -m ppma.deploy.convert_checkpoint``)."""
import sys

from ppma.deploy.convert_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
