"""The model tests' fixtures."""
from official_ppma import official_layout  # noqa: F401  (the fixture; setup.cfg puts tests/ on sys.path)
