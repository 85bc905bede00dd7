"""Diagnostics: the strategy check, replica equivalence, and the environment report."""
