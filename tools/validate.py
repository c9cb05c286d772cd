#!/usr/bin/env python
"""``python tools/validate.py --help``: the command line of :mod:`ppma.bench.validate`, whose docstring is the usage
(also ``python -m ppma.bench.validate``)."""
from ppma.bench.validate import main

if __name__ == "__main__":
    main()
