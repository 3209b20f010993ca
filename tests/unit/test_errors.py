"""The error family of SPEC §15: one root, documented built-in bases kept."""

from __future__ import annotations

import pytest

from flashruntime import errors

EXPECTED_BASES = {
    "LeaseError": (),
    "CheckpointError": (),
    "LaunchError": (),
    "CompileError": (),
    "WeightShapeMismatch": (ValueError,),
    "NonFiniteWeights": (ValueError,),
    "QuorumNotMet": (RuntimeError,),
    "CoordinatorUnavailable": (RuntimeError,),
    "ArtifactNotFound": (LookupError,),
    "ExpansionError": (ValueError,),
    "AuthConfigError": (ValueError,),
}


def test_root() -> None:
    assert issubclass(errors.FlashRuntimeError, Exception)
    assert errors.FlashRuntimeError.__bases__ == (Exception,)


@pytest.mark.parametrize("name, builtins", sorted(EXPECTED_BASES.items()))
def test_each_error_is_rooted_and_keeps_its_builtin(name: str, builtins: tuple[type, ...]) -> None:
    cls = getattr(errors, name)
    assert cls.__bases__ == (errors.FlashRuntimeError, *builtins)
    with pytest.raises(errors.FlashRuntimeError, match="why and how to fix"):
        raise cls("why and how to fix")
    for builtin in builtins:
        with pytest.raises(builtin):
            raise cls("caught by existing except clauses")


def test_all_lists_exactly_the_family() -> None:
    assert sorted(errors.__all__) == sorted([*EXPECTED_BASES, "FlashRuntimeError"])


def test_docstring_draws_the_tree() -> None:
    doc = errors.__doc__ or ""
    for name in EXPECTED_BASES:
        assert f"── {name}" in doc
