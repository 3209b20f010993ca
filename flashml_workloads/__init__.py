"""Task modules runnable as ``python -m flashml_workloads.<name>``, and federated averaging.

Standard library first: numpy and torch are optional and imported where needed.
"""
