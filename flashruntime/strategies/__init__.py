"""Strategies turn a plan or workload into a ``LaunchSpec``: argv, environment,
files and world size. Compilers register by family; none is registered by default.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from flashruntime.errors import CompileError

__all__ = ["CompileError", "LaunchSpec", "StrategyCompiler", "compiler_for", "register_compiler"]


class LaunchSpec(BaseModel):
    model_config = ConfigDict(defer_build=True)

    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)  # relative name -> text, written into the attempt dir
    world_size: int = Field(default=1, ge=1)
    gpus_per_process: int = Field(default=0, ge=0)
    rendezvous: dict[str, str] = Field(default_factory=dict)
    workdir_hint: str = ""
    notes: list[str] = Field(default_factory=list)


class StrategyCompiler(ABC):
    family: ClassVar[str] = ""

    @abstractmethod
    def supports(self, plan: Any) -> bool: ...

    def validate(self, plan: Any) -> list[str]:
        if self.supports(plan):
            return []
        return [f"unsupported plan: compiler {self.family!r} cannot compile family "
                f"{getattr(plan, 'strategy_family', '?')!r}"]

    @abstractmethod
    def compile(self, plan: Any) -> LaunchSpec: ...


_REGISTRY: list[StrategyCompiler] = []


def register_compiler(compiler: StrategyCompiler) -> None:
    """Register ``compiler``, replacing one of the same family."""
    _REGISTRY[:] = [c for c in _REGISTRY if c.family != compiler.family]
    _REGISTRY.append(compiler)


def compiler_for(plan: Any) -> StrategyCompiler:
    for compiler in _REGISTRY:
        if compiler.supports(plan):
            return compiler
    registered = ", ".join(repr(c.family) for c in _REGISTRY) or "none"
    raise LookupError(
        f"no strategy compiler supports family {getattr(plan, 'strategy_family', '?')!r} "
        f"(registered: {registered}); register one with register_compiler()"
    )
