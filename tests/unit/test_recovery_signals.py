"""``from_local_launch`` and ``describe_launch`` against golden cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashruntime.protocol.v1alpha1 import FailureClass
from flashruntime.recovery import FailureSignals, classify, describe_launch, from_local_launch
from flashruntime.recovery.signals import LAUNCH_ERRORS, LogExcerpt, failure_excerpt

GOLDEN = json.loads((Path(__file__).parent / "golden" / "recovery_local_launch.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[case["name"] for case in GOLDEN["cases"]])
def test_golden_local_launch(case: dict) -> None:
    signals = from_local_launch(case["exit_code"], case["log_tail"])
    assert signals == FailureSignals(exit_code=case["exit_code"], exit_deterministic=case["exit_deterministic"])
    assert describe_launch(case["exit_code"], case["log_tail"]) == case["describe"]
    assert classify(signals) == FailureClass(case["failure_class"])


def test_spec_examples_of_describe_launch() -> None:
    assert describe_launch(1, "ModuleNotFoundError: No module named 'x'") == "ModuleNotFoundError at line start"
    assert (
        describe_launch(1, "Traceback (most recent call last):\nKeyError: 'x'") == "traceback without ChildFailedError"
    )
    assert describe_launch(-9, "") == "killed by SIGKILL"
    assert describe_launch(1, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:") == (
        "torchrun ChildFailedError"
    )


@pytest.mark.parametrize("exit_code", [None, 0, 1, -9, 137])
def test_only_exit_fields_are_set(exit_code: int | None) -> None:
    log = "NCCL error\nS3 SlowDown\nheartbeat lost\nXID 79\nTraceback (most recent call last):\nImportError: x\n"
    signals = from_local_launch(exit_code, log)
    assert signals.message == ""
    assert signals == FailureSignals(exit_code=exit_code, exit_deterministic=signals.exit_deterministic)


def test_none_log_tail_is_empty() -> None:
    assert from_local_launch(1, None) == FailureSignals(exit_code=1)  # type: ignore[arg-type]


def test_large_log_tail_is_scanned_quickly() -> None:
    # 1 MiB of noise (the drive loop passes launcher.log's last 1 MiB), real error at the end.
    noise = ("step 12 loss 0.123 lr 1e-4 " * 40 + "\n") * 1000
    log = noise[: 1 << 20] + "\n[rank3]: ImportError: cannot import name 'foo'\n"
    assert from_local_launch(1, log).exit_deterministic is True
    assert from_local_launch(1, noise[: 1 << 20]).exit_deterministic is False


def test_a_deterministic_error_interleaved_by_two_ranks_is_still_deterministic() -> None:
    """Two torchrun ranks print the same traceback to one stream at once."""
    tail = ("Traceback (most recent call last):\nTraceback (most recent call last):\n"
            "ModuleNotFoundErrorModuleNotFoundError: : No module named 'x'No module named 'x'\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n")
    assert from_local_launch(1, tail).exit_deterministic is True
    assert describe_launch(1, tail) == "ModuleNotFoundError at line start"
    assert from_local_launch(1, "ModuleNotFoundErrorish: no\nChildFailedError").exit_deterministic is False


@pytest.mark.parametrize("rule", LAUNCH_ERRORS, ids=[rule.words for rule in LAUNCH_ERRORS])
def test_each_launch_error_example_is_classified_deterministic(rule) -> None:
    assert from_local_launch(1, rule.example + "\n").exit_deterministic is True
    assert describe_launch(1, rule.example) == f"{rule.words}: exit 1"
    assert failure_excerpt(rule.example).exception == rule.example


def test_the_excerpt_names_the_failing_ranks_exception_not_torchruns_wrapper() -> None:
    log = "\n".join([
        "[default0]:step 1", "[default1]:Traceback (most recent call last):",
        '[default0]:step 2', '[default1]:  File "/w/train.py", line 4, in <module>',
        "[default1]:    import flash_attn", "[default1]:ModuleNotFoundError: No module named 'flash_attn'",
        "Traceback (most recent call last):", '  File "/bin/torchrun", line 8, in <module>',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    ])
    excerpt = failure_excerpt(log)
    assert excerpt == LogExcerpt(
        exception="ModuleNotFoundError: No module named 'flash_attn'",
        traceback=('  File "/w/train.py", line 4, in <module>', "    import flash_attn"),
        tag="[default1]:",
    )


def test_the_excerpt_without_rank_tags_skips_the_wrapper_and_strips_torchs_rank_blank() -> None:
    untagged = ("Traceback (most recent call last):\n  File \"a.py\", line 2, in <module>\n    f()\n"
                "KeyError: 'lr'\nTraceback (most recent call last):\n  File \"/bin/torchrun\", line 8\n"
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert failure_excerpt(untagged).exception == "KeyError: 'lr'"
    torch_tagged = "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"a.py\", line 3\n[rank1]: RuntimeError: x\n"
    assert failure_excerpt(torch_tagged) == LogExcerpt("RuntimeError: x", ('  File "a.py", line 3',), "[rank1]:")


def test_the_excerpt_of_a_syntax_error_keeps_the_lines_that_point_at_it() -> None:
    log = 'starting\n  File "train.py", line 3\n    def (\n        ^\nSyntaxError: invalid syntax\n'
    assert failure_excerpt(log) == LogExcerpt(
        "SyntaxError: invalid syntax", ('  File "train.py", line 3', "    def (", "        ^"), None)


def test_the_excerpt_of_a_chained_exception_is_the_last_one_and_a_quiet_log_gives_none() -> None:
    chained = ("Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'x'\n\n"
               "During handling of the above exception, another exception occurred:\n\n"
               "Traceback (most recent call last):\n  File \"a.py\", line 3\nValueError: bad\n")
    assert failure_excerpt(chained).exception == "ValueError: bad"
    assert failure_excerpt("step 1\nstep 2\n") == LogExcerpt(None, (), None)
    assert failure_excerpt(None) == LogExcerpt(None, (), None)


@pytest.mark.parametrize("text", [
    "ChildFailedError\n" + "Root Cause (first observed failure):\nrank: 1\n" * 20000,
    "Traceback (most recent call last):\n  File x\nRuntimeError: " + "RuntimeError gloo " * 60000,
    "usage: x\n" * 100000,
    ("Traceback (most recent call last):\n" + "  File x\n" * 5) * 20000,
], ids=["torchrun report", "gloo words", "usage lines", "tracebacks"])
def test_a_crafted_log_is_judged_without_delay(text: str) -> None:
    import time

    started = time.monotonic()
    for code in (1, 2):
        describe_launch(code, text)
        from_local_launch(code, text)
        failure_excerpt(text)
    assert time.monotonic() - started < 30  # a hang guard: backtracking once took hours on such text
