"""The planner's version: part of every request digest and report, bumped
whenever a model, constant or menu changes what a request plans to."""

PLANNER_VERSION = "0.2.0"
