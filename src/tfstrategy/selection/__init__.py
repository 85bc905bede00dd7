"""Choosing and building a strategy: devices, host facts, the CPU split, ``choose``, ``build`` and ``select``."""
