"""Every ``FLASHML_*`` environment variable the project reads or sets, with what it means,
and the ``MLFLOW_*`` ones of MLflow it honours as MLflow does.

The coordinator's settings are described by their typed model
(``flashruntime.coordinator.settings.RuntimeSettings``); this table names them too, so
one list holds them all, and the reference page is generated from it. A test checks that
every ``FLASHML_*`` / ``MLFLOW_*`` name in the code is here and every name here is in the code.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["VARIABLES", "Variable"]


@dataclass(frozen=True)
class Variable:
    name: str
    read_by: str  # who reads it ("set for the job" when the project sets it for the user's command)
    default: str
    meaning: str


_JOB = "set for the job"
_COORDINATOR = "the coordinator (RuntimeSettings)"

VARIABLES: tuple[Variable, ...] = (
    # The environment contract of every attempt of a user's command.
    Variable("FLASHML_OUTPUT_DIR", _JOB, "", "the attempt's own directory: write metrics.json and outputs here"),
    Variable("FLASHML_CKPT_DIR", _JOB, "", "the job's checkpoint directory, shared by its attempts: resume from here"),
    Variable("FLASHML_JOB_ID", _JOB, "", "the job's id"),
    Variable("FLASHML_ATTEMPT_ID", _JOB, "", "this attempt's id (on a worker: the lease id)"),
    Variable("FLASHML_TASK_ID", f"{_JOB} (worker)", "", "the task's id within its job"),
    Variable("FLASHML_INPUTS_FILE", f"{_JOB} (worker)", "", "a JSON file: input name -> local path"),
    Variable("FLASHML_MAX_WORLD_SIZE", f"{_JOB} (elastic)", "",
             "the most ranks an elastic run (ranks=(min, max)) may be relaunched with; flashruntime.torch's "
             "checkpoints list every size up to it as one they load at"),
    Variable("FLASHML_PLAN_ID", f"{_JOB} (flash.run)", "", "the plan this run carries out"),
    Variable("FLASHML_STRATEGY_FAMILY", f"{_JOB} (flash.run)", "", "the plan's strategy family"),
    Variable("FLASHML_PROFILE_WARMUP_STEPS", f"{_JOB} (profiler)", "",
             "steps flashruntime.torch runs before it times any, when the profiler launched the script"),
    Variable("FLASHML_PROFILE_MEASURED_STEPS", f"{_JOB} (profiler)", "",
             "steps flashruntime.torch times before it measures a checkpoint and ends the profiled process"),
    Variable("FLASHML_CHECKPOINT_MTBF_S", "flashruntime.torch (checkpoint every='auto')", "86400",
             "mean seconds between failures for the Young/Daly checkpoint interval (mtbf_s= wins)"),
    # Local runs.
    Variable("FLASHML_RUNS_DIR", "flash.submit, flashruntime submit / runs", "~/.local/share/flashruntime/runs",
             "where runs without an output directory are kept (else the platform's user data directory)"),
    Variable("FLASHML_TENSORBOARD_DIR", "flash.submit, flashruntime submit, the coordinator", "",
             "when a run ends, its metrics and every trial's are written there as TensorBoard event files "
             "(tensorboard_dir= and --tensorboard win; needs the tensorboard extra); on the coordinator, every "
             "committed task's, under <job name>-<job id>/<task>/, from the files its worker uploaded"),
    Variable("MLFLOW_TRACKING_URI", "flash.submit, flashruntime submit", "",
             "MLflow's own: when a run ends, it is logged to this MLflow tracking store, a sweep as a parent run "
             "with one run per trial (mlflow_uri= and --mlflow win; needs the mlflow extra); the coordinator "
             "reads FLASHML_MLFLOW_URI instead"),
    Variable("MLFLOW_EXPERIMENT_NAME", "flash.submit, flashruntime submit", "flashruntime",
             "MLflow's own: the experiment a run is logged in, made when missing (mlflow_experiment= wins)"),
    Variable("FLASHML_CONTAINMENT", "flash.submit, the worker", "auto",
             "what holds each attempt's processes: auto (a cgroup v2 per attempt where one can be made, else a "
             "child subreaper), cgroup, subreaper or process-group"),
    Variable("FLASHML_PREEMPT_SIGNAL", "flash.submit, flashruntime.torch, the worker", "SIGTERM",
             "the signals to flash.submit that are a preemption notice, forwarded to the ranks (comma-separated, "
             "e.g. SIGTERM,SIGUSR1); none: a SIGTERM cancels the run. A worker that stops forwards the first "
             "to its task's ranks and hands their checkpoint to the coordinator"),
    Variable("FLASHML_PREEMPT_GRACE_S", "flash.submit, flashruntime.torch, the worker", "25",
             "seconds the ranks get after a preemption notice to save and end before what is left is killed"),
    Variable("FLASHML_HANG_TIMEOUT_S", "flash.submit, flashruntime submit / chaos, the worker", "",
             "seconds without progress after which an attempt counts as hung, its stacks are dumped and it is "
             "relaunched (hang_timeout_s= wins); unset: max(10 x the median step time, 60 s) once steps are "
             "timed; 0: no hang watch"),
    Variable("FLASHML_CALIBRATION_LEDGER", "flash.run, flashruntime plan",
             "<runs root>/calibration.sqlite",
             "the calibration ledger runs of a plan are recorded into and plan reads; off: record nothing"),
    # Clients.
    Variable("FLASHML_RUNTIME_API", "the CLI, the worker, flash.run", "http://localhost:8100",
             "the coordinator's URL (--api wins)"),
    Variable("FLASHML_TOKEN", "the CLI's job commands, flash.run", "",
             "a submitter's or operator's bearer token (--token wins)"),
    Variable("FLASHML_NODE_TOKEN", "the worker", "",
             "this machine's node token (--token and a token file win); dropped from the worker's environment "
             "at start, never passed to a task"),
    Variable("FLASHML_NODE_TOKEN_FILE", "the worker", "",
             "a file (mode 0600 or stricter) holding this machine's node token, masked in every task "
             "(--token-file wins)"),
    Variable("FLASHML_TRUSTED_SUBMITTER_KEYS", "the worker", "",
             "a .pub file or a directory of them: run only commands these submitter keys signed "
             "(--trusted-submitter-keys wins)"),
    Variable("FLASHML_JOIN_CODE", "the worker; the coordinator (RuntimeSettings)", "",
             "the registration code: the worker sends it, the coordinator requires it when set"),
    # The coordinator: credentials (read by flashruntime.coordinator.auth).
    Variable("FLASHML_NODE_TOKENS", "the coordinator", "", "node_id:token,... one token per machine"),
    Variable("FLASHML_SUBMITTER_TOKENS", "the coordinator", "", "name:token,... who submits and reads own jobs"),
    Variable("FLASHML_OPERATOR_TOKENS", "the coordinator", "", "name:token,... who may do everything"),
    Variable("FLASHML_ARGV_SUBMITTERS", "the coordinator", "",
             "name,... submitters and operators whose jobs may run commands on the fleet"),
    Variable("FLASHML_NODE_POOLS", "the coordinator", "",
             "node_id:pool|pool,... the team pools each node token may serve (none when unlisted)"),
    Variable("FLASHML_UNSANDBOXED_NODES", "the coordinator", "",
             "node_id,... node tokens that may run commands unsandboxed (--runner trusted)"),
    Variable("FLASHML_JOIN_CODE_POOLS", "the coordinator", "",
             "pool|pool: the team pools a node registering with the join code alone may serve"),
    Variable("FLASHML_JOIN_CODE_UNSANDBOXED", "the coordinator", "0",
             "1: a node registering with the join code alone may run commands unsandboxed"),
    # The coordinator: settings (RuntimeSettings).
    Variable("FLASHML_PROFILE", _COORDINATOR, "local", "a label for this deployment, shown by /healthz"),
    Variable("FLASHML_DATABASE_URL", _COORDINATOR, "unset: the SQLite file at FLASHML_LEDGER_PATH",
             "the database as a URL: sqlite:///absolute/path or postgresql://user:password@host:port/database "
             "(--database-url wins)"),
    Variable("FLASHML_LEDGER_PATH", _COORDINATOR, "/data/flashruntime.db (serve: ./flashruntime-data)",
             "the SQLite database when FLASHML_DATABASE_URL is unset"),
    Variable("FLASHML_LOCAL_ARTIFACTS_DIR", _COORDINATOR, "/data/artifacts (serve: ./flashruntime-data/artifacts)",
             "where artifacts are stored"),
    Variable("FLASHML_MAX_ARTIFACT_MB", _COORDINATOR, "256", "the largest artifact upload, in MiB"),
    Variable("FLASHML_MAX_JSON_KB", _COORDINATOR, "1024", "the largest JSON request body, in KiB"),
    Variable("FLASHML_MAX_TASKS_PER_JOB", _COORDINATOR, "10000", "the most tasks one job may expand into"),
    Variable("FLASHML_MAX_JOB_MB", _COORDINATOR, "64", "the most bytes one job's task payloads may come to, in MiB"),
    Variable("FLASHML_MAX_JOBS_IN_FLIGHT", _COORDINATOR, "100", "the most unfinished jobs one submitter may have"),
    Variable("FLASHML_MAX_PENDING_TASKS", _COORDINATOR, "100000",
             "the most queued tasks one submitter's jobs may have"),
    Variable("FLASHML_SWEEP_INTERVAL_S", _COORDINATOR, "2", "how often silent leases are expired, in seconds"),
    Variable("FLASHML_MLFLOW_URI", _COORDINATOR, "",
             "the MLflow tracking store every committed task is logged to, from the files its worker uploaded: one "
             "run per task under one parent run per job (needs the mlflow extra); unset: none"),
    Variable("FLASHML_MLFLOW_EXPERIMENT", _COORDINATOR, "flashruntime",
             "the MLflow experiment of FLASHML_MLFLOW_URI's runs, made when missing"),
    Variable("FLASHML_HANG_CORDON_AFTER", _COORDINATOR, "3",
             "a node whose attempts hang this many times within FLASHML_HANG_CORDON_WINDOW_S is cordoned for that "
             "long (0: never)"),
    Variable("FLASHML_HANG_CORDON_WINDOW_S", _COORDINATOR, "3600",
             "the window in which a node's hung attempts are counted, and the length of the cordon they cause"),
    Variable("FLASHML_RATE_LIMIT", _COORDINATOR, "100 with tokens, off without",
             "requests per second per credential (0: off)"),
    Variable("FLASHML_METRICS_PUBLIC", _COORDINATOR, "0", "1: /metrics without a token"),
    Variable("FLASHML_REQUIRE_NODE_AUTH", _COORDINATOR, "0", "1: refuse to start without tokens"),
    Variable("FLASHML_MIN_FREE_BYTES", _COORDINATOR, str(64 * 1024 * 1024),
             "free space the data and artifacts directories keep: below it /readyz and uploads answer 503 (0: none)"),
    Variable("FLASHML_MAX_CONNECTIONS", _COORDINATOR, "10000",
             "the most connections a server process holds (also capped by its open-file limit)"),
    Variable("FLASHML_KEEP_ALIVE_S", _COORDINATOR, "5", "seconds a connection may sit idle before it is closed"),
    Variable("FLASHML_ACCEPT_ERROR_LOG_INTERVAL_S", _COORDINATOR, "60",
             "accepts failed for want of descriptors are logged once per this many seconds, with a count"),
    Variable("FLASHML_AUTH_FAILURE_LIMIT", _COORDINATOR, "20",
             "unknown tokens one address may send per window before its requests get 429 (0: off)"),
    Variable("FLASHML_AUTH_FAILURE_WINDOW_S", _COORDINATOR, "60", "the window of FLASHML_AUTH_FAILURE_LIMIT, in seconds"),
    Variable("FLASHML_TRUSTED_PROXIES", _COORDINATOR, "unset: no proxy",
             "IP addresses or networks of the reverse proxies whose X-Forwarded-For names the client (from anyone "
             "else forwarded headers are ignored)"),
    Variable("FLASHML_RAY_ADDRESS", f"{_COORDINATOR}; flash.submit(executor='ray')",
             "unset: no Ray backend (flash.submit: an embedded local Ray)",
             "a Ray cluster: local, auto, ray://host:port or host:port; the coordinator then runs backend 'ray' "
             "jobs there, and makes 'ray' the default backend (--ray-address / ray_address= win)"),
    Variable("FLASHML_RENDEZVOUS_PORT", "flashruntime serve", "unset: multi-node jobs refused",
             "the port of the c10d rendezvous store serve hosts for multi-node jobs (parameters.nodes), on every "
             "interface without authentication; needs PyTorch on the coordinator's machine (--rendezvous-port wins)"),
    Variable("FLASHML_RAY_WORK_DIR", "a Ray node running coordinator tasks", "<tmp>/flashruntime-ray",
             "where the node keeps the work directories of the attempts it runs"),
    Variable("FLASHML_RAY_DATASETS", "a Ray node running coordinator tasks", "",
             "NAME=PATH,...: where the node's local datasets are (a task's local_inputs run on nodes declaring "
             "the Ray resource dataset:NAME)"),
    Variable("FLASHML_ALLOW_UNSANDBOXED_ARGV", "the coordinator, at each command job's expansion", "0",
             "1: admit command jobs whose isolation tier is standard"),
    Variable("FLASHML_SERVICE_AUTOINIT", "flashruntime.coordinator.app", "1",
             "1: build the module's lazy ``app`` on first access (uvicorn module:app); 0: leave it None"),
)
