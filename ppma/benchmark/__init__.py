"""Measuring tools shared by the scripts in ``tools/`` (counts and timings, no speed claims)."""
