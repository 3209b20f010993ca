"""A torchrun job whose ranks fail with a deterministic bug (a missing module)."""

import flashruntime_e2e_missing_module  # noqa: F401
