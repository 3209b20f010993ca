"""The three roles without HTTP: submitter and code-execution configuration, role checks,
the access table and each role's scope over jobs, artifacts and checkpoints, the worker's
own check of a command's grant, strict JSON bodies and the rate limiter."""

from __future__ import annotations

import json

import pytest

from flashruntime.coordinator.access import (
    ROUTE_ACCESS,
    LiveLease,
    artifact_read_allowed,
    artifact_write_allowed,
    checkpoint_read_allowed,
    owns_job,
)
from flashruntime.coordinator.auth import (
    AuthConfigError,
    AuthFailure,
    Credential,
    Identity,
    OpenAuthenticator,
    Role,
    StaticTokenAuthenticator,
    authenticator_from_env,
    require_role,
    resolve_identity,
)
from flashruntime.protocol.v1alpha1 import SubmittedBy

ALICE = Identity(None, False, "alice", submitter=True, may_run_code=True)
BOB = Identity(None, False, "bob", submitter=True)
ROOT = Identity(None, True, "root")
NODE_A = Identity("node-a", False)
OPEN = Identity(None, False)
LIVE = [LiveLease("j1", "t1", frozenset({"users/alice/in.csv"}))]


def owned_by_alice(job_id: str) -> bool:
    return job_id == "j1"


# --- configuration -------------------------------------------------------------------------------


def test_submitter_tokens_and_the_code_execution_grant_from_the_environment() -> None:
    auth = authenticator_from_env({
        "FLASHML_SUBMITTER_TOKENS": "alice:tok-a, bob:tok-b,",
        "FLASHML_OPERATOR_TOKENS": "root:tok-r",
        "FLASHML_ARGV_SUBMITTERS": " alice , root",
    })
    assert auth.enforcing
    assert auth.credential("tok-a") == Credential(Role.SUBMITTER, "alice", may_run_code=True)
    assert auth.credential("tok-b") == Credential(Role.SUBMITTER, "bob", may_run_code=False)
    assert auth.credential("tok-r") == Credential(Role.OPERATOR, "root", may_run_code=True)
    assert auth.authenticate("tok-a") is None and not auth.is_operator("tok-a")  # a submitter is neither
    assert "tok-" not in repr(auth) and "<2 submitter tokens>" in repr(auth)


@pytest.mark.parametrize(("env", "match"), [
    ({"FLASHML_ARGV_SUBMITTERS": "alice"}, "grants code execution but no tokens are configured"),
    ({"FLASHML_SUBMITTER_TOKENS": "alice:t", "FLASHML_ARGV_SUBMITTERS": "alcie"},
     r"FLASHML_ARGV_SUBMITTERS: code execution is granted to 'alcie', which is no configured submitter"),
    ({"FLASHML_NODE_TOKENS": "box:t1", "FLASHML_SUBMITTER_TOKENS": "a:t2", "FLASHML_ARGV_SUBMITTERS": "box"},
     "'box', which is no configured submitter or operator"),
    ({"FLASHML_SUBMITTER_TOKENS": "alice:same", "FLASHML_NODE_TOKENS": "box:same"}, "repeats the token"),
    ({"FLASHML_SUBMITTER_TOKENS": "alice"}, "FLASHML_SUBMITTER_TOKENS entry 1 has no ':'"),
    ({"FLASHML_NODE_TOKENS": "box/1:t"}, "node id 'box/1': a node id holds only letters"),
])
def test_bad_role_configuration_is_refused_naming_the_variable(env: dict[str, str], match: str) -> None:
    with pytest.raises(AuthConfigError, match=match) as info:
        authenticator_from_env(env)
    assert "same" not in str(info.value)  # a message names the entry, never the token


def test_a_submitter_token_gives_a_submitter_identity_and_ignores_delegation() -> None:
    auth = StaticTokenAuthenticator({}, submitter_tokens={"tok-a": "alice"}, code_runners={"alice"})
    assert resolve_identity(auth, "Bearer tok-a", ["node-x"]) == ALICE
    assert ALICE.role is Role.SUBMITTER and ROOT.role is Role.OPERATOR and NODE_A.role is Role.NODE
    assert Identity("node-a", True, "root").role is Role.NODE  # an operator acting as a node
    assert OPEN.role is None


def test_an_authenticator_without_credential_lookup_still_works() -> None:
    class Legacy:
        enforcing = True

        def authenticate(self, token: str) -> str | None:
            return "box" if token == "n" else None

        def is_operator(self, token: str) -> bool:
            return token == "o"

    assert resolve_identity(Legacy(), "Bearer n", []) == Identity("box", False)
    assert resolve_identity(Legacy(), "Bearer o", []).role is Role.OPERATOR
    with pytest.raises(AuthFailure) as info:
        resolve_identity(Legacy(), "Bearer x", [])
    assert info.value.status_code == 401


# --- role checks -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("identity", "roles", "status"), [
    (ALICE, {Role.SUBMITTER, Role.OPERATOR}, None),
    (NODE_A, {Role.SUBMITTER, Role.OPERATOR}, 403),
    (ALICE, {Role.OPERATOR}, 403),
    (ROOT, {Role.NODE}, 401),  # a header-less operator must name the node it acts as
    (Identity("node-a", True, "root"), {Role.NODE}, None),
    (Identity("node-a", True, "root"), {Role.OPERATOR}, 403),
    (OPEN, {Role.OPERATOR}, 401),
])
def test_require_role(identity: Identity, roles: set[Role], status: int | None) -> None:
    if status is None:
        require_role(identity, roles, enforcing=True)
        return
    with pytest.raises(AuthFailure) as info:
        require_role(identity, roles, enforcing=True)
    assert info.value.status_code == status
    if status == 403:
        assert "this route needs a" in info.value.detail and "FLASHML_TOKEN" in info.value.detail


def test_open_mode_checks_no_role() -> None:
    require_role(OPEN, {Role.OPERATOR}, enforcing=False)
    assert isinstance(OpenAuthenticator().credential("x"), type(None))


def test_the_access_table_names_real_roles_and_opens_only_the_probes_and_the_page() -> None:
    opened = {key for key, access in ROUTE_ACCESS.items() if access.open}
    assert opened == {("GET", "/healthz"), ("GET", "/livez"), ("GET", "/readyz"), ("GET", "/")}
    for access in ROUTE_ACCESS.values():
        assert access.roles <= set(Role)


# --- scopes ----------------------------------------------------------------------------------------


def test_job_ownership() -> None:
    mine = SubmittedBy(role="submitter", name="alice")
    assert owns_job(ALICE, mine) and not owns_job(BOB, mine)
    assert owns_job(ROOT, mine) and owns_job(OPEN, mine)
    assert not owns_job(NODE_A, mine)
    assert not owns_job(ALICE, None)  # a job from open mode belongs to no submitter
    assert not owns_job(ALICE, SubmittedBy(role="operator", name="alice"))  # same name, other role


@pytest.mark.parametrize(("identity", "key", "write", "read"), [
    (ALICE, "users/alice/in.csv", True, True),
    (ALICE, "users/alice/", False, False),
    (ALICE, "users/alicex/in.csv", False, False),
    (ALICE, "jobs/j1/round-000/weights.json", True, True),
    (ALICE, "jobs/j2/t/metrics.json", False, False),
    (BOB, "users/alice/in.csv", False, False),
    (NODE_A, "jobs/j1/t1/metrics.json", True, True),
    (NODE_A, "jobs/j1/t2/metrics.json", False, False),
    (NODE_A, "users/alice/in.csv", False, True),  # an input of its live lease: read, never write
    (NODE_A, "users/alice/other.csv", False, False),
    (ROOT, "anything/at/all", True, True),
    (OPEN, "jobs/j1/t1/x", False, False),  # open mode is decided by the caller; the rule fails closed
])
def test_artifact_scopes(identity: Identity, key: str, write: bool, read: bool) -> None:
    assert artifact_write_allowed(identity, key, live=LIVE, job_owned=owned_by_alice) is write
    assert artifact_read_allowed(identity, key, live=LIVE, job_owned=owned_by_alice) is read


def test_checkpoint_reads() -> None:
    assert checkpoint_read_allowed(NODE_A, "j1", "t1", live=LIVE, job_owned=owned_by_alice)
    assert not checkpoint_read_allowed(NODE_A, "j1", "t2", live=LIVE, job_owned=owned_by_alice)
    assert checkpoint_read_allowed(ALICE, "j1", "t9", live=[], job_owned=owned_by_alice)
    assert not checkpoint_read_allowed(BOB, "j1", "t1", live=[], job_owned=lambda job: False)
    assert checkpoint_read_allowed(ROOT, "j9", "t9", live=[], job_owned=lambda job: False)


# --- the worker's own check ------------------------------------------------------------------------


@pytest.mark.parametrize(("stamp", "problem"), [
    ({"role": "submitter", "name": "alice", "may_run_code": True}, None),
    ({"role": "operator", "name": "root", "may_run_code": True}, None),
    ({"role": "submitter", "name": "bob", "may_run_code": False}, "does not hold the code-execution permission"),
    ({"role": "anonymous", "name": None, "may_run_code": True}, "open mode"),
    ({"role": "submitter", "name": "alice", "may_run_code": "yes"}, "does not hold"),
    (None, "does not say who submitted its job"),
    ("alice", "does not say who submitted its job"),
])
def test_a_worker_with_a_token_runs_only_granted_commands(stamp: object, problem: str | None) -> None:
    from flashruntime.agent.lease_run import code_grant_problem

    payload = {"argv": ["true"]} if stamp is None else {"argv": ["true"], "submitted_by": stamp}
    found = code_grant_problem(payload)
    assert (found is None) if problem is None else (problem in (found or ""))


# --- strict JSON and the rate limiter --------------------------------------------------------------


@pytest.mark.parametrize(("body", "loc", "words"), [
    (b'{"a": NaN}', ["a"], "not a finite number"),
    (b'{"a": [1, -Infinity]}', ["a", 1], "not a finite number"),
    (b'{"a": 1e999}', ["a"], "not a finite number"),
    (b'{"h": "\\ud800"}', ["h"], "not valid Unicode"),
    (b'{"\\udfff": 1}', [], "a key of this object is not valid Unicode"),
    (b"[" * 70 + b"]" * 70, list(range(0)), "nested more than 64 deep"),
])
def test_strict_json_names_where_the_problem_is(body: bytes, loc: list[object], words: str) -> None:
    pytest.importorskip("fastapi")
    from flashruntime.coordinator.guard import BodyProblem, parse_strict_json

    with pytest.raises(BodyProblem) as info:
        parse_strict_json(body)
    assert words in str(info.value)
    if loc:
        assert info.value.loc == loc


def test_the_quick_check_and_the_walk_agree_at_the_depth_bound_and_on_every_problem() -> None:
    pytest.importorskip("fastapi")
    from flashruntime.coordinator.guard import _certainly_clean, _walk_problem

    for depth in (63, 64, 65):
        nested: object = 1
        for level in range(depth):
            nested = [nested] if level % 2 else {"k": nested}
        assert _certainly_clean(nested) is (_walk_problem(nested) is None) is (depth <= 64)
    for bad in ({"a": float("nan")}, [1, float("inf")], {"s": "\ud800"}, {"\udfff": 1}):
        assert not _certainly_clean(bad) and _walk_problem(bad) is not None
    wide = {"trials": [{"lr": index / 7, "name": f"t{index}", "tags": [None, True]} for index in range(1000)]}
    assert _certainly_clean(wide) and _walk_problem(wide) is None


def test_strict_json_passes_ordinary_json_and_refuses_broken_json() -> None:
    pytest.importorskip("fastapi")
    from flashruntime.coordinator.guard import parse_strict_json

    value = {"a": [1, 2.5, "\U0001f600", None, {"b": True}]}  # sent as an escaped surrogate pair
    assert parse_strict_json(json.dumps(value).encode()) == value
    with pytest.raises(json.JSONDecodeError):
        parse_strict_json(b'{"a": ')
    with pytest.raises(json.JSONDecodeError, match="not UTF-8"):
        parse_strict_json(b'{"a": "\xff"}')


def test_the_rate_limiter_allows_a_burst_then_the_rate_per_key() -> None:
    from flashruntime.coordinator.rate_limit import RateLimiter

    now = [0.0]
    limiter = RateLimiter(2.0, clock=lambda: now[0])  # 2 per second, bursts of 4
    assert [limiter.acquire("a") for _ in range(4)] == [None] * 4
    assert limiter.acquire("a") == pytest.approx(0.5)
    assert limiter.acquire("b") is None  # every key has its own bucket
    now[0] += 0.5
    assert limiter.acquire("a") is None and limiter.acquire("a") is not None
    now[0] += 100
    assert [limiter.acquire("a") for _ in range(5)].count(None) == 4  # refilled to the burst, no more
    with pytest.raises(ValueError, match="per_second must be a finite number > 0"):
        RateLimiter(0)


def test_the_security_page_documents_exactly_the_access_table() -> None:
    from tests._support import REPO_ROOT

    text = (REPO_ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    section = text.split("## Every route", 1)[1].split("\n## ", 1)[0]
    documented: dict[tuple[str, str], frozenset[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        method, path = cells[0].strip("`").split(" ", 1)
        roles = frozenset() if cells[1] == "open" else frozenset(r.strip() for r in cells[1].split(","))
        documented[(method, path)] = roles
    assert documented == {key: frozenset(role.value for role in access.roles) for key, access in ROUTE_ACCESS.items()}
