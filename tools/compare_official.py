#!/usr/bin/env python
"""``python tools/compare_official.py --help``: the command line of :mod:`ppma.bench.compare_official`, whose docstring is the usage
(also ``python -m ppma.bench.compare_official``)."""
from ppma.bench.compare_official import main

if __name__ == "__main__":
    main()
