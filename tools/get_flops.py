#!/usr/bin/env python
"""``python tools/get_flops.py --help``: the command line of :mod:`ppma.mm.get_flops`, whose docstring is the usage
(also ``python -m ppma.mm.get_flops``)."""
from ppma.mm.get_flops import main

if __name__ == "__main__":
    main()
