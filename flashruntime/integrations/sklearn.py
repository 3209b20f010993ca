"""``sweep`` and ``hpo``: one script, many parameter sets, one trial each.

The script receives every parameter as ``--<key> <value>`` and writes ``metrics.json``;
``Run.best_trial`` then picks the best by ``metric``. scikit-learn is never imported here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flashruntime.workloads.command import CommandWorkload, OutputSpec, Source

__all__ = ["hpo", "sweep"]


def sweep(
    script: str,
    task_params: Sequence[Mapping[str, Any]],
    *,
    source: str = ".",
    metric: str = "accuracy_mean",
    maximize: bool = True,
    python: str = "python",
) -> CommandWorkload:
    """An ``independent_tasks`` workload: ``python script --<key> {<key>} ...`` over the
    sorted union of the parameter keys, fanned out over ``task_params``. Every parameter
    set must have every key (``ValueError`` otherwise, before anything runs)."""
    params = [dict(p) for p in task_params]
    keys = sorted({key for p in params for key in p})
    for index, p in enumerate(params):
        missing = [key for key in keys if key not in p]
        if missing:
            raise ValueError(
                f"task_params[{index}] {p!r} has no {missing[0]!r}: every parameter set needs the same keys "
                f"({', '.join(map(str, keys))}), since each becomes --<key> <value> on the command line; "
                f"give it {missing[0]!r} (the script's default, say) or sweep it separately"
            )
    argv = [python, script]
    for key in keys:
        argv += [f"--{key}", "{" + key + "}"]
    return CommandWorkload(
        command=argv,
        source=Source(path=source),
        outputs=OutputSpec(collect=["metrics.json"], primary_metric=metric, maximize=maximize),
        mode="independent_tasks",
        task_params=params,
    )


def hpo(script: str, grid: Mapping[str, Iterable[Any]], **kwargs: Any) -> CommandWorkload:
    """Grid search: the cartesian product over the sorted ``grid`` keys, as a ``sweep``."""
    keys = sorted(grid)
    combos = itertools.product(*(list(grid[key]) for key in keys))
    return sweep(script, [dict(zip(keys, combo)) for combo in combos], **kwargs)
