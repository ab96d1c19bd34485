"""Reproductions of the paper's experiments (THEORY.md §7), one module per figure."""
