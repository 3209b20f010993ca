"""flashruntime: a fault-tolerant runtime for the ML jobs you already have.

Used as ``import flashruntime as flash``. Every public name except ``__version__``
resolves lazily on first access, so ``import flashruntime`` loads nothing but the
standard library and each user pays only for what they touch.
"""

import importlib as _importlib

__version__ = "0.5.0"

# public name -> (defining module, attribute); attribute None = the module itself.
_LAZY: dict[str, tuple[str, str | None]] = {
    "plan": ("flashruntime.planner", "plan"),
    "render": ("flashruntime.planner", "render"),
    "run": ("flashruntime.local.flash_run", "run"),
    "PLANNER_VERSION": ("flashruntime.planner", "PLANNER_VERSION"),
    "PlanRequest": ("flashruntime.protocol.plan_v1alpha1", "PlanRequest"),
    "PlanReport": ("flashruntime.protocol.plan_v1alpha1", "PlanReport"),
    "StrategyPlan": ("flashruntime.protocol.plan_v1alpha1", "StrategyPlan"),
    "TransformerFineTune": ("flashruntime.protocol.plan_v1alpha1", "TransformerFineTune"),
    "PyTorchTraining": ("flashruntime.protocol.plan_v1alpha1", "PyTorchTraining"),
    "ClassicalML": ("flashruntime.protocol.plan_v1alpha1", "ClassicalML"),
    "IndependentTasks": ("flashruntime.protocol.plan_v1alpha1", "IndependentTasks"),
    "Resources": ("flashruntime.protocol.plan_v1alpha1", "Resources"),
    "Objective": ("flashruntime.protocol.plan_v1alpha1", "Objective"),
    "submit": ("flashruntime.local.submit", "submit"),
    "CommandWorkload": ("flashruntime.workloads.command", "CommandWorkload"),
    "OutputSpec": ("flashruntime.workloads.command", "OutputSpec"),
    "Source": ("flashruntime.workloads.command", "Source"),
    "ChaosPlan": ("flashruntime.local.chaos", "ChaosPlan"),
    "Fault": ("flashruntime.local.chaos", "Fault"),
    "integrations": ("flashruntime.integrations", None),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> object:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'flashruntime' has no attribute {name!r}") from None
    module = _importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
