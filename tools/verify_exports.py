#!/usr/bin/env python
"""``python tools/verify_exports.py --help``: the command line of :mod:`ppma.deploy.verify_exports`, whose docstring is the usage
(also ``python -m ppma.deploy.verify_exports``)."""
import sys

from ppma.deploy.verify_exports import main

if __name__ == "__main__":
    sys.exit(main())
