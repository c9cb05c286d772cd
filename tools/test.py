#!/usr/bin/env python
"""``python tools/test.py --help``: the command line of :mod:`ppma.mm.test`, whose docstring is the usage
(also ``python -m ppma.mm.test``)."""
from ppma.mm.test import main

if __name__ == "__main__":
    main()
