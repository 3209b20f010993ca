"""authenticators, env parsing, and the identity/scope rules the app maps to HTTP codes."""

from __future__ import annotations

import hmac

import pytest

from flashruntime import errors
from flashruntime.coordinator import auth
from flashruntime.coordinator.auth import (
    AuthConfigError,
    AuthFailure,
    Identity,
    NodeAuthenticator,
    OpenAuthenticator,
    StaticTokenAuthenticator,
    authenticator_from_env,
    join_code_valid,
    require_acting_node,
    require_node,
    require_operator,
    resolve_identity,
    task_write_allowed,
    write_allowed,
)

NODE_A, NODE_B, OPERATOR = "tok-node-a-5f1e", "tok-node-b-77c0", "tok-operator-9aa2"


@pytest.fixture()
def static() -> StaticTokenAuthenticator:
    return StaticTokenAuthenticator({NODE_A: "node-a", NODE_B: "node-b"}, {OPERATOR: "reducer"})


def _status(call: object, *args: object) -> int:
    with pytest.raises(AuthFailure) as info:
        call(*args)  # type: ignore[operator]
    return info.value.status_code


# --- authenticators ------------------------------------------------------------------------------


def test_auth_config_error_is_the_errors_module_class() -> None:
    assert auth.AuthConfigError is errors.AuthConfigError
    assert issubclass(AuthConfigError, ValueError)
    assert issubclass(AuthFailure, errors.FlashRuntimeError)


def test_open_authenticator_authenticates_nobody() -> None:
    open_auth = OpenAuthenticator()
    assert isinstance(open_auth, NodeAuthenticator)
    assert open_auth.enforcing is False
    assert open_auth.authenticate(NODE_A) is None
    assert open_auth.is_operator(OPERATOR) is False


def test_static_authenticator_maps_tokens_to_their_class(static: StaticTokenAuthenticator) -> None:
    assert isinstance(static, NodeAuthenticator)
    assert static.enforcing is True
    assert static.authenticate(NODE_A) == "node-a"
    assert static.authenticate(NODE_B) == "node-b"
    assert static.is_operator(NODE_A) is False
    assert static.authenticate(OPERATOR) is None  # operators have no node identity
    assert static.is_operator(OPERATOR) is True
    assert static.authenticate("tok-node-a-5f1") is None  # a prefix is not the token
    assert static.authenticate(NODE_A + "x") is None


@pytest.mark.parametrize("token", ["", "tök-node-a", None, 7, b"tok-node-a-5f1e", ["tok-node-a-5f1e"]])
def test_tokens_that_are_not_non_empty_ascii_strings_simply_fail(static: StaticTokenAuthenticator,
                                                                  token: object) -> None:
    assert static.authenticate(token) is None
    assert static.is_operator(token) is False


def test_comparison_is_constant_time_against_every_candidate(
    static: StaticTokenAuthenticator, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    # The candidates are compared in configuration order, so NODE_A matches the first one.
    for token, expected_node, expected_operator in [
        (NODE_A, "node-a", False), (NODE_B, "node-b", False), (OPERATOR, None, True), ("tok-unknown", None, False),
    ]:
        calls.clear()
        assert static.authenticate(token) == expected_node
        assert len(calls) == 3, f"authenticate({token!r}) compared {len(calls)} of 3 candidates"
        assert len({a for a, _ in calls}) == 3  # each configured token once
        calls.clear()
        assert static.is_operator(token) is expected_operator
        assert len(calls) == 3, f"is_operator({token!r}) compared {len(calls)} of 3 candidates"
    # Fixed-length digests are compared, so a token's length cannot leak through the comparison.
    assert {len(a) for a, _ in calls} == {len(b) for _, b in calls} == {32}


@pytest.mark.parametrize(
    "tokens, operators, match",
    [
        ({"": "node-a"}, None, "empty"),
        ({NODE_A: "node-a"}, {"": "reducer"}, "empty"),
        ({"tök": "node-a"}, None, "not ASCII"),
        ({NODE_A: ""}, None, "non-empty node id"),
        ({NODE_A: "node-a"}, {OPERATOR: ""}, "non-empty operator name"),
        ({NODE_A: "node-a"}, {NODE_A: "reducer"}, "also configured as a node token"),
    ],
)
def test_bad_static_configuration_is_refused_at_construction(
    tokens: dict[str, str], operators: dict[str, str] | None, match: str
) -> None:
    with pytest.raises(AuthConfigError, match=match) as info:
        StaticTokenAuthenticator(tokens, operators)
    assert NODE_A not in str(info.value) and OPERATOR not in str(info.value)


def test_static_authenticator_wants_mappings() -> None:
    with pytest.raises(TypeError, match="mapping"):
        StaticTokenAuthenticator([(NODE_A, "node-a")])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="operator_tokens"):
        StaticTokenAuthenticator({}, [OPERATOR])  # type: ignore[arg-type]


def test_operator_tokens_alone_enforce() -> None:
    only_ops = StaticTokenAuthenticator({}, {OPERATOR: "reducer"})
    assert only_ops.enforcing and only_ops.is_operator(OPERATOR) and only_ops.authenticate(OPERATOR) is None


def test_repr_never_shows_a_token(static: StaticTokenAuthenticator) -> None:
    text = repr(static)
    assert "2 node tokens" in text and "1 operator tokens" in text
    assert all(token not in text for token in (NODE_A, NODE_B, OPERATOR))


# --- authenticator_from_env ------------------------------------------------------------------------


def test_neither_variable_set_is_open() -> None:
    assert isinstance(authenticator_from_env({}), OpenAuthenticator)
    blank = {"FLASHML_NODE_TOKENS": " , ,", "FLASHML_OPERATOR_TOKENS": ""}
    assert isinstance(authenticator_from_env(blank), OpenAuthenticator)


def test_env_parsing_tolerates_whitespace_and_trailing_commas() -> None:
    env = {
        "FLASHML_NODE_TOKENS": f"  node-a : {NODE_A} ,node-b:{NODE_B},, node-a:second:token:with:colons , ",
        "FLASHML_OPERATOR_TOKENS": f" reducer:{OPERATOR},",
    }
    got = authenticator_from_env(env)
    assert got.enforcing
    assert got.authenticate(NODE_A) == "node-a"
    assert got.authenticate(NODE_B) == "node-b"
    assert got.authenticate("second:token:with:colons") == "node-a"  # a node may hold two tokens
    assert got.authenticate(f" {NODE_A} ") is None  # the stripped token is the token
    assert got.is_operator(OPERATOR) and not got.is_operator(NODE_A)


def test_operator_variable_alone_enforces() -> None:
    got = authenticator_from_env({"FLASHML_OPERATOR_TOKENS": f"reducer:{OPERATOR}"})
    assert got.enforcing and got.is_operator(OPERATOR) and got.authenticate(OPERATOR) is None
    assert got.authenticate(NODE_A) is None


def test_env_none_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHML_OPERATOR_TOKENS", raising=False)
    monkeypatch.setenv("FLASHML_NODE_TOKENS", f"node-a:{NODE_A}")
    assert authenticator_from_env().authenticate(NODE_A) == "node-a"
    monkeypatch.delenv("FLASHML_NODE_TOKENS")
    assert isinstance(authenticator_from_env(), OpenAuthenticator)


@pytest.mark.parametrize(
    "env, match",
    [
        ({"FLASHML_NODE_TOKENS": f"node-a:{NODE_A},{NODE_B}"}, r"FLASHML_NODE_TOKENS entry 2 has no ':'"),
        ({"FLASHML_NODE_TOKENS": f" :{NODE_A}"}, r"FLASHML_NODE_TOKENS entry 1 has an empty node_id"),
        ({"FLASHML_NODE_TOKENS": f"node-a:{NODE_A},node-b: "}, r"entry 2 \(node_id 'node-b'\) has an empty token"),
        ({"FLASHML_OPERATOR_TOKENS": "reducer:tök-9aa2"}, r"FLASHML_OPERATOR_TOKENS entry 1 \(name 'reducer'\).*ASCII"),
        ({"FLASHML_OPERATOR_TOKENS": OPERATOR}, r"FLASHML_OPERATOR_TOKENS entry 1 has no ':'"),
        ({"FLASHML_NODE_TOKENS": f"node-a:{NODE_A}, node-b:{NODE_A}"},
         r"FLASHML_NODE_TOKENS entry 2 \(node_id 'node-b'\) repeats the token of FLASHML_NODE_TOKENS entry 1"),
        ({"FLASHML_NODE_TOKENS": f"node-a:{NODE_A}", "FLASHML_OPERATOR_TOKENS": f"reducer:{NODE_A}"},
         r"FLASHML_OPERATOR_TOKENS entry 1 \(name 'reducer'\) repeats the token of FLASHML_NODE_TOKENS entry 1"),
        ({"FLASHML_OPERATOR_TOKENS": f"r1:{OPERATOR},r2:{OPERATOR}"}, r"entry 2 \(name 'r2'\) repeats"),
    ],
)
def test_malformed_env_names_variable_and_entry_never_the_token(env: dict[str, str], match: str) -> None:
    with pytest.raises(AuthConfigError, match=match) as info:
        authenticator_from_env(env)
    message = str(info.value)
    for secret in (NODE_A, NODE_B, OPERATOR, "tök-9aa2"):
        assert secret not in message, f"the message leaks a token: {message}"


# --- resolve_identity ------------------------------------------------------------------------------


def test_open_mode_checks_nothing() -> None:
    open_auth = OpenAuthenticator()
    assert resolve_identity(open_auth, None, []) == Identity(None, False)
    assert resolve_identity(open_auth, "Bearer whatever", ["a", "b"]) == Identity(None, False)
    assert resolve_identity(open_auth, "garbage", [""]) == Identity(None, False)
    require_operator(open_auth, Identity(None, False))  # nothing raised


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer   ", f"Basic {NODE_A}", NODE_A, f"Token {NODE_A}"])
def test_no_bearer_token_is_401(static: StaticTokenAuthenticator, header: str | None) -> None:
    with pytest.raises(AuthFailure) as info:
        resolve_identity(static, header, [])
    assert info.value.status_code == 401
    assert info.value.headers == {"WWW-Authenticate": "Bearer"}


def test_unknown_token_is_401_without_echoing_it(static: StaticTokenAuthenticator) -> None:
    with pytest.raises(AuthFailure) as info:
        resolve_identity(static, "Bearer tok-guess-1234", [])
    assert info.value.status_code == 401 and "tok-guess-1234" not in str(info.value)


def test_node_token_identifies_the_node_and_ignores_delegation(static: StaticTokenAuthenticator) -> None:
    assert resolve_identity(static, f"Bearer {NODE_A}", []) == Identity("node-a", False)
    assert resolve_identity(static, f"bearer   {NODE_A} ", []) == Identity("node-a", False)  # scheme is case-free
    for values in (["node-b"], ["x", "y"], [""]):
        assert resolve_identity(static, f"Bearer {NODE_A}", values) == Identity("node-a", False)


def test_operator_token_with_and_without_delegation(static: StaticTokenAuthenticator) -> None:
    assert resolve_identity(static, f"Bearer {OPERATOR}", []) == Identity(None, True, "reducer")
    assert resolve_identity(static, f"Bearer {OPERATOR}", [" node-b "]) == Identity("node-b", True, "reducer")
    # Not checked against any registry: lease liveness is the authority.
    assert resolve_identity(static, f"Bearer {OPERATOR}", ["never-registered"]) == Identity(
        "never-registered", True, "reducer")


@pytest.mark.parametrize("values, status", [(["node-a", "node-b"], 400), (["node-a", "node-a"], 400),
                                            (["node-a,node-b"], 400), ([""], 403), (["   "], 403)])
def test_delegation_header_errors(static: StaticTokenAuthenticator, values: list[str], status: int) -> None:
    assert _status(resolve_identity, static, f"Bearer {OPERATOR}", values) == status


def test_delegation_values_must_be_a_list(static: StaticTokenAuthenticator) -> None:
    with pytest.raises(TypeError, match="not a single string"):
        resolve_identity(static, f"Bearer {OPERATOR}", "node-a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a str"):
        resolve_identity(static, f"Bearer {OPERATOR}", [b"node-a"])  # type: ignore[list-item]


# --- acting node, write scope, operator-only ---------------------------------------------------------


def test_require_acting_node() -> None:
    assert require_acting_node(Identity("node-a", False)) == "node-a"
    assert require_acting_node(Identity("node-b", True)) == "node-b"  # delegated operator acts as the node
    assert _status(require_acting_node, Identity(None, True)) == 401  # header-less operator
    assert _status(require_acting_node, Identity(None, False)) == 401


def test_require_node_matches_path_or_lease_holder() -> None:
    assert require_node(Identity("node-a", False), "node-a") == "node-a"
    assert require_node(Identity("node-a", True), "node-a") == "node-a"
    assert _status(require_node, Identity("node-a", False), "node-b") == 403
    assert _status(require_node, Identity("node-a", True), "node-b") == 403  # narrowing, never widening
    assert _status(require_node, Identity(None, True), "node-a") == 401


LIVE = [("job1", "task-000"), ("job2", "shard-001")]


@pytest.mark.parametrize(
    "key, allowed",
    [
        ("jobs/job1/task-000/metrics.json", True),
        ("jobs/job1/task-000/sub/dir/model.pt", True),
        ("jobs/job2/shard-001/out.bin", True),
        ("jobs/job1/task-000/", False),  # the prefix itself names no file
        ("jobs/job1/task-000", False),
        ("jobs/job1/task-0001/metrics.json", False),  # the trailing slash is significant
        ("jobs/job1/task-001/metrics.json", False),
        ("jobs/job1x/task-000/metrics.json", False),
        ("jobs/job1/task-000/../task-001/metrics.json", False),
        ("/jobs/job1/task-000/metrics.json", False),
        ("jobs/job1/task-000/a\\b", False),
        ("other/job1/task-000/metrics.json", False),
        ("", False),
    ],
)
def test_write_scope_for_a_node(key: str, allowed: bool) -> None:
    assert write_allowed(Identity("node-a", False), key, LIVE) is allowed
    assert write_allowed(Identity("node-a", True), key, iter(LIVE)) is allowed  # delegated: same scope


def test_write_scope_edges() -> None:
    anywhere = "jobs/someone-else/t/metrics.json"
    assert write_allowed(Identity(None, True), anywhere, []) is True  # header-less operator: unrestricted
    assert write_allowed(Identity("node-a", False), "jobs/job1/task-000/m.json", []) is False  # no live lease
    assert write_allowed(Identity(None, False), anywhere, LIVE) is False  # fail closed; open mode skips the check
    assert write_allowed(Identity("node-a", False), "jobs/a/b/c/x", [("a/b", "c")]) is False  # ids with '/' never scope


def test_checkpoint_writes_check_the_pair() -> None:
    assert task_write_allowed(Identity("node-a", False), "job1", "task-000", LIVE)
    assert not task_write_allowed(Identity("node-a", False), "job1", "shard-001", LIVE)
    assert not task_write_allowed(Identity("node-a", True), "job3", "task-000", LIVE)
    assert task_write_allowed(Identity(None, True), "job3", "task-000", [])
    assert not task_write_allowed(Identity(None, False), "job1", "task-000", LIVE)


def test_operator_only_routes(static: StaticTokenAuthenticator) -> None:
    require_operator(static, resolve_identity(static, f"Bearer {OPERATOR}", []))  # allowed
    assert _status(resolve_identity, static, None, []) == 401  # no token never reaches the route
    assert _status(require_operator, static, Identity(None, False)) == 401
    assert _status(require_operator, static, resolve_identity(static, f"Bearer {NODE_A}", [])) == 403
    assert _status(require_operator, static, resolve_identity(static, f"Bearer {OPERATOR}", ["node-a"])) == 403


def test_auth_failure_carries_status_and_detail() -> None:
    failure = AuthFailure(403, "write outside scope")
    assert (failure.status_code, failure.detail, str(failure)) == (403, "write outside scope", "write outside scope")
    assert failure.headers == {}


# --- join code ---------------------------------------------------------------------------------------


def test_join_code(monkeypatch: pytest.MonkeyPatch) -> None:
    assert join_code_valid(None, None) and join_code_valid(None, "anything")
    assert join_code_valid("join-42", "join-42")
    assert join_code_valid("jöin", "jöin")
    assert not join_code_valid("join-42", "join-43")
    assert not join_code_valid("join-42", "join-4")
    assert not join_code_valid("join-42", None)
    assert not join_code_valid("join-42", "")
    calls: list[int] = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    assert join_code_valid("join-42", "join-42") and calls == [1]
