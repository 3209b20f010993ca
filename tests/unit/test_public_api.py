"""The top-level ``flashruntime`` namespace: pinned names, lazy resolution."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import flashruntime

# Grows as capabilities land; every name here must resolve to a real object.
EXPECTED_ALL = [
    "__version__",
    "plan",
    "render",
    "run",
    "PLANNER_VERSION",
    "PlanRequest",
    "PlanReport",
    "StrategyPlan",
    "TransformerFineTune",
    "PyTorchTraining",
    "ClassicalML",
    "IndependentTasks",
    "Resources",
    "Objective",
    "submit",
    "CommandWorkload",
    "OutputSpec",
    "Source",
    "ChaosPlan",
    "Fault",
    "integrations",
]


def test_all_is_pinned() -> None:
    assert flashruntime.__all__ == EXPECTED_ALL


def test_version() -> None:
    assert flashruntime.__version__ == "0.5.0"


@pytest.mark.parametrize("name", [n for n in EXPECTED_ALL if n != "__version__"])
def test_every_lazy_name_resolves_to_its_defining_object(name: str) -> None:
    module_name, attribute = flashruntime._LAZY[name]
    module = importlib.import_module(module_name)
    expected = module if attribute is None else getattr(module, attribute)
    assert getattr(flashruntime, name) is expected
    assert name in vars(flashruntime)  # cached after first access


def test_dir_lists_every_public_name() -> None:
    assert set(EXPECTED_ALL) <= set(dir(flashruntime))


def test_unknown_name_raises_attribute_error_naming_the_module() -> None:
    with pytest.raises(AttributeError, match="module 'flashruntime' has no attribute 'no_such_thing'"):
        flashruntime.no_such_thing  # noqa: B018


def test_import_defines_no_model_until_touched() -> None:
    code = (
        "import sys, flashruntime; "
        "assert 'flashruntime.protocol.plan_v1alpha1' not in sys.modules; "
        "assert 'pydantic' not in sys.modules, 'import flashruntime loaded pydantic eagerly'; "
        "flashruntime.PlanRequest; assert 'flashruntime.protocol.plan_v1alpha1' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
