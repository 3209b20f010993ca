"""Hot-path helpers shared by the manager and the stores: fast model building,
time normalisation, lease ids and the lease JSON codec.

Leases, specs and events built here come from values that were already validated
(a ``TaskSpec`` accepted at ``add_task``, a deadline computed from an aware UTC
``now``), so they skip pydantic validation the way ``model_construct`` does, only
cheaper: the claim -> heartbeat -> complete cycle builds two leases.
"""

from __future__ import annotations

import copy
import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_json

from flashruntime.protocol.v1alpha1 import SCHEMA_VERSION, Event, EventType, Lease, TaskSpec

UTC = timezone.utc
EVENT_SOURCE = "flashruntime.leases"

_new_object = object.__new__
# The per-instance slots every pydantic model carries; model_construct sets the same four.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__pydantic_fields_set__.__set__  # type: ignore[attr-defined]
_set_extra = BaseModel.__pydantic_extra__.__set__  # type: ignore[attr-defined]
_set_private = BaseModel.__pydantic_private__.__set__  # type: ignore[attr-defined]

# Every field is "set" on the models built here, so one shared fields-set serves them all:
# pydantic only ever adds an existing field name to it (a no-op) and copies it on model_copy.
_LEASE_FIELDS = set(Lease.model_fields)
_SPEC_FIELDS = set(TaskSpec.model_fields)
_EVENT_FIELDS = set(Event.model_fields)


def make_lease(
    lease_id: str,
    task_id: str,
    job_id: str,
    node_id: str,
    attempt_number: int,
    deadline: datetime,
    payload: dict[str, Any],
    lease_seconds: float,
) -> Lease:
    """A ``Lease`` from validated values (``deadline`` aware UTC), without validation."""
    lease = _new_object(Lease)
    _set_dict(
        lease,
        {
            "schema_version": SCHEMA_VERSION,
            "lease_id": lease_id,
            "task_id": task_id,
            "job_id": job_id,
            "node_id": node_id,
            "attempt_number": attempt_number,
            "deadline": deadline,
            "payload": payload,
            "lease_seconds": lease_seconds,
        },
    )
    _set_fields_set(lease, _LEASE_FIELDS)
    _set_extra(lease, None)
    _set_private(lease, None)
    return lease


_SHARED_AS_IS = frozenset((str, int, float, bool, type(None)))


def copy_payload(value: Any) -> Any:
    """A deep copy of a JSON-shaped value (dicts, lists, scalars), fast for those shapes;
    anything else goes through ``copy.deepcopy``. A lease's payload is such a copy of its
    task's, so that changing the payload of a lease never changes the task."""
    cls = value.__class__
    if cls in _SHARED_AS_IS:
        return value
    if cls is dict:
        return {key: copy_payload(item) for key, item in value.items()}
    if cls is list:
        return [copy_payload(item) for item in value]
    return copy.deepcopy(value)


def renewed(lease: Lease, deadline: datetime) -> Lease:
    """A copy of ``lease`` with a new deadline (what ``model_copy(update=...)`` does, cheaper)."""
    copy = _new_object(Lease)
    values = lease.__dict__.copy()
    values["deadline"] = deadline
    _set_dict(copy, values)
    _set_fields_set(copy, _LEASE_FIELDS)
    _set_extra(copy, None)
    _set_private(copy, None)
    return copy


def make_event(event_type: EventType, job_id: str, now: datetime, message: str, data: dict[str, Any]) -> Event:
    """An ``Event`` of the lease source from validated values, without validation."""
    event = _new_object(Event)
    _set_dict(
        event,
        {
            "schema_version": SCHEMA_VERSION,
            "job_id": job_id,
            "type": event_type,
            "timestamp": now,
            "source": EVENT_SOURCE,
            "message": message,
            "data": data,
        },
    )
    _set_fields_set(event, _EVENT_FIELDS)
    _set_extra(event, None)
    _set_private(event, None)
    return event


# --- time --------------------------------------------------------------------


def coerce_now(now: object) -> datetime:
    """``now`` as an aware UTC datetime: ``None`` = the clock, naive = UTC."""
    if now is None:
        return datetime.now(UTC)
    if not isinstance(now, datetime):
        raise TypeError(f"now must be a datetime or None, got {type(now).__name__}")
    if now.tzinfo is None:
        return now.replace(tzinfo=UTC)
    if now.tzinfo is UTC:
        return now
    return now.astimezone(UTC)


def coerce_instant(value: object, name: str) -> datetime:
    """A caller-supplied datetime (``until``, a deadline) as aware UTC."""
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    return coerce_now(value)


_DELTAS: dict[float, timedelta] = {}


def seconds(value: float) -> timedelta:
    """``timedelta(seconds=value)``, memoised: a queue usually holds a handful of lease lengths."""
    delta = _DELTAS.get(value)
    if delta is None:
        delta = timedelta(seconds=value)
        if len(_DELTAS) < 1024:
            _DELTAS[value] = delta
    return delta


def epoch(value: datetime) -> float:
    """Epoch seconds of an aware datetime; exact to the microsecond for any realistic date."""
    return value.timestamp()


def from_epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def parse_instant(text: str) -> datetime:
    """ISO 8601 (with ``Z`` or an offset; naive = UTC) to aware UTC, on every supported Python."""
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    return coerce_now(datetime.fromisoformat(text))


# --- lease ids ---------------------------------------------------------------

_fork_epoch = 0


def _after_fork_in_child() -> None:
    global _fork_epoch
    _fork_epoch += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class LeaseIds:
    """``"ls-" + 12 lowercase hex`` from the OS's random source, drawn in batches.

    Not thread-safe on its own: the manager calls it inside a transaction. A
    forked child discards the batch it inherited, so two processes never hand
    out the same ids.
    """

    __slots__ = ("_batch", "_epoch")

    _BATCH = 256

    def __init__(self) -> None:
        self._batch: list[str] = []
        self._epoch = -1

    def __call__(self) -> str:
        return self.next()

    def next(self) -> str:
        """The next id (bind it: a bound method call is cheaper than ``__call__``)."""
        batch = self._batch
        if not batch or self._epoch != _fork_epoch:
            digits = os.urandom(6 * self._BATCH).hex(" ", -6)  # 12 hex digits per group
            batch[:] = ("ls-" + digits.replace(" ", " ls-")).split(" ")
            self._epoch = _fork_epoch
        return batch.pop()


# --- JSON codec of leases and specs (SQLite store) ---------------------------


_quote = json.encoder.encode_basestring  # type: ignore[attr-defined]  (C-accelerated)
_scan_once = json.decoder.JSONDecoder().scan_once  # the C scanner json.loads ends in


def loads(text: str) -> Any:
    """``json.loads`` for the compact JSON this module writes, minus the three Python-level
    layers in front of the C scanner; anything else (whitespace, bad input) takes
    ``json.loads`` itself, with its errors."""
    try:
        value, end = _scan_once(text, 0)
    except (StopIteration, TypeError):
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


def lease_to_json(lease: Lease) -> str:
    """The stored form of a lease (a JSON object). The payload is not stored: it is
    always the task's own, supplied again when the lease is read back."""
    values = lease.__dict__
    deadline = values["deadline"]
    if deadline.tzinfo is not UTC:
        deadline = coerce_now(deadline)
    return (
        f'{{"lease_id":{_quote(values["lease_id"])},"task_id":{_quote(values["task_id"])},'
        f'"job_id":{_quote(values["job_id"])},"node_id":{_quote(values["node_id"])},'
        f'"attempt_number":{int(values["attempt_number"])},"deadline":"{deadline.isoformat()}",'
        f'"lease_seconds":{float(values["lease_seconds"])!r}}}'
    )


def lease_from_json(text: str, payload: dict[str, Any]) -> Lease:
    """A lease written by ``lease_to_json`` (or any JSON with the same keys), payload supplied."""
    raw = loads(text)
    return make_lease(
        str(raw["lease_id"]),
        str(raw["task_id"]),
        str(raw["job_id"]),
        str(raw["node_id"]),
        int(raw["attempt_number"]),
        parse_instant(raw["deadline"]),
        payload,
        float(raw.get("lease_seconds", 0.0)),
    )


def spec_to_json(spec: TaskSpec) -> str:
    """The spec as the SQLite store keeps it. A payload's NaN and infinities are written as
    JSON's ``NaN`` / ``Infinity`` extensions (which ``loads`` reads back), not as pydantic's
    ``null``: a task's payload comes back from the store as it was added."""
    if not spec.payload:
        return spec.model_dump_json()
    return to_json(spec.model_dump(), inf_nan_mode="constants").decode()


def spec_from_json(text: str) -> TaskSpec:
    """A spec written by ``spec_to_json`` at add time: already validated, so not validated again."""
    raw = loads(text)
    if raw.keys() != _SPEC_FIELDS or type(raw["lease_seconds"]) is not float:
        return TaskSpec.model_validate(raw)  # written by another version: validate and fill defaults
    spec = _new_object(TaskSpec)
    _set_dict(spec, raw)
    _set_fields_set(spec, _SPEC_FIELDS)
    _set_extra(spec, None)
    _set_private(spec, None)
    return spec
