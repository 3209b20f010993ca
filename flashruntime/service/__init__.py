"""Surfaces: the ``flashruntime`` CLI, the coordinator service (extra ``service``) and the worker agent.

Only ``flashruntime.service.app`` needs the ``service`` extra; everything else here
imports with the standard library and pydantic.
"""
