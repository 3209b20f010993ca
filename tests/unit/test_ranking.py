"""The one rule for which way a sweep's metric ranks."""

from __future__ import annotations

import pytest

from flashruntime.workloads.ranking import default_mode, mode_reason, resolve_mode


@pytest.mark.parametrize("metric", ["loss", "final_loss", "eval_loss", "val/error", "trainRuntime", "rmse",
                                    "perplexity", "train_samples_per_second_seconds", "inertia", "MSE"])
def test_a_metric_named_like_a_cost_is_minimised(metric: str) -> None:
    assert default_mode(metric) == "min"


@pytest.mark.parametrize("metric", ["accuracy", "accuracy_mean", "f1", "eval_auc", "score", "reward", "glossary",
                                    None])
def test_any_other_metric_is_maximised(metric: str | None) -> None:
    assert default_mode(metric) == "max"


def test_a_mode_given_outright_wins_then_maximize_then_the_name() -> None:
    assert resolve_mode("loss", "max", False) == "max"
    assert resolve_mode("loss", None, True) == "max"
    assert resolve_mode("accuracy", None, False) == "min"
    assert resolve_mode("loss") == "min"
    with pytest.raises(ValueError, match="mode must be 'min' or 'max', got 'lowest'"):
        resolve_mode("loss", "lowest")


def test_the_reason_names_the_rule_that_chose() -> None:
    assert mode_reason("loss") == "min ('loss' reads as a cost; pass mode='max' / --mode max if higher is better)"
    assert mode_reason("loss", "max") == "max (as asked)"
    assert mode_reason("acc", None, False) == "min (OutputSpec.maximize=False)"
