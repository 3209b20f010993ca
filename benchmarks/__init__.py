"""Benchmarks of flashruntime, each side by side with a named comparator.

Run with ``python -m benchmarks run [--all | --scenario NAME ...] [--repeats N] [--smoke] [--out PATH]``.
Not part of the wheel.
"""
