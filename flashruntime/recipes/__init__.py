"""Workload recipes: how a job's ``workload.type`` expands into lease tasks.

``WorkloadRecipe`` is the contract; ``register_recipe``/``recipe_for`` the registry.
The command recipe lives in ``flashruntime.recipes.command`` and registers itself
when that module is imported (the coordinator service imports it).
"""

from flashruntime.recipes.base import WorkloadRecipe, recipe_for, register_recipe

__all__ = ["WorkloadRecipe", "recipe_for", "register_recipe"]
