#!/usr/bin/env python
"""``python tools/train.py --help``: the command line of :mod:`ppma.mm.train`, whose docstring is the usage
(also ``python -m ppma.mm.train``)."""
from ppma.mm.train import main

if __name__ == "__main__":
    main()
