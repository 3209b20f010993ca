"""Routes of the machines and their leases: node registration, heartbeats, cordons,
claim and the attempt lifecycle. Who may call each is in ``access.ROUTE_ACCESS``. A refusal
is an error of the ``flashruntime.errors`` family (``AuthFailure``, ``NotFound``, a
``LeaseError`` of a lease that is gone ...), which ``app.py`` answers with its status."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from flashruntime.coordinator.auth import Identity, join_code_valid, require_acting_node, require_node
from flashruntime.coordinator.core import Coordinator
from flashruntime.coordinator.guard import Guard, StrictJSONRoute
from flashruntime.coordinator.lease_watch import MAX_WATCH_S, watch_standing
from flashruntime.coordinator.node_grants import grant_statement
from flashruntime.coordinator.nodes import node_id_problem
from flashruntime.coordinator.openapi import ERRORS
from flashruntime.errors import AuthFailure, InvalidRequest, NotFound
from flashruntime.protocol.api_v1alpha1 import (
    CompleteResult,
    CordonResult,
    FailResult,
    LeaseStanding,
    NodeRow,
    RegisterResult,
    ReleaseResult,
    StatusResult,
    UncordonResult,
)
from flashruntime.protocol.v1alpha1 import (
    AttemptHeartbeat,
    ClaimRequest,
    CompleteRequest,
    CordonRequest,
    FailRequest,
    Lease,
    NodeHeartbeat,
    NodeRegistration,
    ReleaseRequest,
    TaskState,
)

__all__ = ["JOIN_CODE_HEADER", "fleet_router"]

JOIN_CODE_HEADER = "X-FlashML-Join-Code"
logger = logging.getLogger("flashruntime.service")


def _lease_json(lease: Lease) -> JSONResponse:
    return JSONResponse(lease.model_dump(mode="json"))


def fleet_router(coordinator: Coordinator, guard: Guard) -> APIRouter:
    router = APIRouter(route_class=StrictJSONRoute, dependencies=[guard.dependency()], responses=ERRORS)
    enforcing = coordinator.authenticator.enforcing
    caller = Depends(guard.caller)

    def held_lease(identity: Identity, lease_id: str) -> Lease:
        """The lease, if the caller may act on it: its holder must be the acting node when
        enforcing (an unknown id is then a 403 too, so ids cannot be probed); 404 in open mode."""
        lease = coordinator.lease(lease_id)
        if enforcing:
            acting = require_acting_node(identity)
            if lease is None or lease.node_id != acting:
                raise AuthFailure(403, f"lease {lease_id} is not held by node {acting!r}")
            return lease
        if lease is None:
            raise NotFound(f"unknown lease id {lease_id!r}")
        return lease

    @router.post("/v1alpha1/nodes/register", response_model=RegisterResult, response_model_exclude_none=True)
    def register(registration: NodeRegistration, request: Request, identity: Identity = caller) -> dict[str, Any]:
        if not join_code_valid(coordinator.settings.join_code, request.headers.get(JOIN_CODE_HEADER)):
            raise AuthFailure(403, f"missing or wrong join code: send the coordinator's code in {JOIN_CODE_HEADER}")
        if enforcing:
            registration = registration.model_copy(update={"node_id": require_acting_node(identity)})
        problem = node_id_problem(registration.node_id)
        if problem is not None:
            raise InvalidRequest(f"node_id {registration.node_id[:64]!r}: {problem}")
        granted = coordinator.nodes.register(registration, coordinator.node_grants.for_node(registration.node_id))
        answer: dict[str, Any] = {"node_id": registration.node_id, "status": "registered"}
        if granted.withheld:
            detail = coordinator.node_grants.describe_withheld(registration.node_id, granted)
            logger.warning("registration: %s", detail)
            answer.update(withheld_pools=granted.withheld_pools,
                          withheld_unsandboxed_argv=granted.withheld_unsandboxed_argv, detail=detail)
        return answer

    @router.post("/v1alpha1/nodes/{node_id}/heartbeat", response_model=StatusResult)
    def node_heartbeat(node_id: str, heartbeat: NodeHeartbeat, identity: Identity = caller) -> dict[str, str]:
        if enforcing:
            require_node(identity, node_id)
        grant = coordinator.node_grants.for_node(node_id)
        if heartbeat.pools is not None:
            granted = grant_statement(heartbeat.pools, False, grant)
            if granted.withheld:
                logger.warning("heartbeat: %s", coordinator.node_grants.describe_withheld(node_id, granted))
        if not coordinator.nodes.heartbeat(node_id, heartbeat, grant):
            raise NotFound(f"node {node_id!r} is not registered; register it again")
        return {"status": "ok"}

    @router.get("/v1alpha1/nodes", response_model=list[NodeRow])
    def nodes() -> list[dict[str, Any]]:
        now = coordinator.now()
        return coordinator.nodes.views(coordinator.manager.cordoned(now), now)

    @router.post("/v1alpha1/nodes/{node_id}/cordon", response_model=CordonResult)
    def cordon(node_id: str, body: CordonRequest) -> dict[str, Any]:
        if coordinator.nodes.get(node_id) is None:
            raise NotFound(f"node {node_id!r} is not registered")
        now = coordinator.now()
        if body.seconds is not None and body.until is not None:
            raise InvalidRequest("give either seconds or until, not both")
        until = body.until
        if body.seconds is not None:
            if not body.seconds > 0:
                raise InvalidRequest(f"seconds must be > 0, got {body.seconds}")
            try:
                until = now + timedelta(seconds=body.seconds)
            except OverflowError:  # beyond timedelta's range, or past year 9999
                raise InvalidRequest(
                    f"seconds {body.seconds:g} puts the cordon's end past the last date the coordinator can hold "
                    "(year 9999); give fewer seconds, or neither seconds nor until to cordon until uncordoned",
                ) from None
        if until is not None and until <= now:
            raise InvalidRequest(f"until {until.isoformat()} is not in the future")
        coordinator.manager.cordon(node_id, until=until, reason=body.reason, now=now)
        return {"node_id": node_id, "cordoned_until": until.isoformat() if until else None, "reason": body.reason}

    @router.delete("/v1alpha1/nodes/{node_id}/cordon", response_model=UncordonResult)
    def uncordon(node_id: str) -> dict[str, Any]:
        return {"node_id": node_id, "uncordoned": coordinator.manager.uncordon(node_id)}

    @router.post("/v1alpha1/leases/claim", response_model=Lease,
                 responses={204: {"description": "nothing eligible for this node now (or it is cordoned)"}})
    def claim(body: ClaimRequest, identity: Identity = caller) -> Response:
        node_id = body.node_id
        if enforcing:
            node_id = require_acting_node(identity)
        view = coordinator.nodes.claim_view(node_id, coordinator.node_grants.for_node(node_id))
        if view is None:
            raise AuthFailure(403, f"node {node_id!r} is not registered; register before claiming")
        view["gang_jobs"] = coordinator.gang_jobs_held(node_id)
        lease = coordinator.manager.claim(
            node_id, job_id=body.job_id, now=coordinator.now(), policy=coordinator.placement, node=view
        )
        if lease is None:
            coordinator.metrics.count_claim("empty")
            return Response(status_code=204)
        coordinator.metrics.count_claim("leased")
        return _lease_json(coordinator.join_gang(lease))

    @router.post("/v1alpha1/attempts/{lease_id}/heartbeat", response_model=Lease)
    def lease_heartbeat(lease_id: str, body: AttemptHeartbeat | None = None, identity: Identity = caller) -> Response:
        lease = held_lease(identity, lease_id)
        # A lease no longer live raises LeaseError: 410, its attempt ends (here and in fail, release).
        renewed = _lease_json(coordinator.manager.heartbeat(lease_id, now=coordinator.now()))
        if body is not None and body.stragglers:
            coordinator.record_stragglers(lease, body.stragglers)
        return renewed

    @router.get("/v1alpha1/attempts/{lease_id}/watch", response_model=LeaseStanding,
                response_model_exclude_none=True,
                description="Where the lease stands, answered as soon as it stops being live (its job "
                            "cancelled: the worker stops the task now) or after wait_s, whichever is first.")
    async def watch(lease_id: str, identity: Identity = caller,
                    wait_s: float = Query(0.0, ge=0.0, le=MAX_WATCH_S,
                                          description="how long to wait for the lease to stop being live")
                    ) -> dict[str, Any]:
        await run_in_threadpool(held_lease, identity, lease_id)

        def read() -> tuple[str, str | None]:
            # An id held_lease found was issued, so it has a standing.
            return coordinator.manager.lease_standing(lease_id, now=coordinator.now()) or ("ended", None)

        standing, reason = await watch_standing(read, coordinator.standing_changes, wait_s)
        return {"lease_id": lease_id, "standing": standing, "reason": reason}

    @router.post("/v1alpha1/attempts/{lease_id}/complete", response_model=CompleteResult,
                 response_model_exclude_none=True)
    def complete(lease_id: str, body: CompleteRequest, identity: Identity = caller) -> dict[str, Any]:
        return coordinator.complete(held_lease(identity, lease_id), body)

    @router.post("/v1alpha1/attempts/{lease_id}/fail", response_model=FailResult)
    def fail(lease_id: str, body: FailRequest, identity: Identity = caller) -> dict[str, str]:
        coordinator.fail_attempt(held_lease(identity, lease_id), body.reason, body.exit_code, hung=body.hung)
        return {"status": "requeued-or-exhausted"}

    @router.post("/v1alpha1/attempts/{lease_id}/release", response_model=ReleaseResult)
    def release(lease_id: str, body: ReleaseRequest, identity: Identity = caller) -> dict[str, str]:
        """A lease given back for a cause that is not the task's: its worker is shutting down
        (requeued, no budget spent), or died (``abandoned``: counted as an expiry)."""
        held_lease(identity, lease_id)
        now = coordinator.now()
        if body.abandoned:
            state = coordinator.manager.abandon(lease_id, body.reason, now=now)
        else:
            coordinator.manager.release(lease_id, body.reason, now=now)
            state = TaskState.PENDING
        return {"status": "requeued" if state is TaskState.PENDING else "exhausted"}

    return router
