"""Metrics where people already look: a run's and its trials' figures written to the
trackers teams compare runs in. Each tracker is an optional extra; nothing here is core."""
