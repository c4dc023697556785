"""Every tunable of the sandbox host, once, with its unit and the reason for it.

Wire limits (pre-auth bytes, frame size, output cap) live in ``protocol`` because both
sides must agree on them; what only the host decides lives here.
"""

# Timeouts
# How long stop_run waits for a killed sandbox to be gone before answering (SIGKILL is
# asynchronous; a dying process tree takes milliseconds, a loaded machine longer).
DEFAULT_RUN_STOP_WAIT_S = 5.0
# A client has this long from its first byte to authenticate. Long enough for a worker
# on a loaded machine, short enough that idle half-open sockets cannot pile up.
DEFAULT_AUTH_TIMEOUT_S = 10.0
# SIGTERM grace: in-flight executions get this long to finish before they are killed.
# Executions are seconds long; 60 s covers the longest we allow with room to spare.
DEFAULT_DRAIN_GRACE_S = 60.0
# After a close frame, wait this long for the client's close before dropping the socket.
DEFAULT_CLOSE_TIMEOUT_S = 2.0
# A client that does not read its results for this long is dropped (socket send timeout).
DEFAULT_SEND_TIMEOUT_S = 30.0
# How often blocking loops wake to look at deadlines and the drain flag.
DEFAULT_POLL_INTERVAL_S = 0.1
# After a child exits, keep reading its pipes this long for output still in flight
# (a grandchild that escaped the group could otherwise hold them open forever).
DEFAULT_PIPE_DRAIN_S = 1.0
# The start-up isolation probe runs one trivial child for at most this long.
DEFAULT_PROBE_TIMEOUT_S = 10.0
# An exited run's record, log and status file are kept this long, then removed (at
# start-up and at most hourly on a launch). The control plane finishes with a run long
# before (reconcile, receipts); a week leaves room to read a log after an incident.
DEFAULT_RUN_RECORD_RETENTION_S = 7 * 24 * 3600
DEFAULT_RUN_PRUNE_INTERVAL_S = 3600
# CPU seconds a run's processes may each use (RLIMIT_CPU). Runs last hours; the job's own
# wall clock (at most a day, the control plane's RUNS_MAX_TIMEOUT_S) is enforced by the
# runner, and this is the backstop for a runner that loses track: a day and an hour.
DEFAULT_RUN_CPU_S = 25 * 3600

# Limits
# Executions running at once on this host (admission limit); beyond it the host answers
# ``not_started(at_capacity)`` so the pool can go elsewhere. Two cores run 32 short
# snippets at once without starving the server threads.
DEFAULT_MAX_CONCURRENT = 32
# Sandboxes kept started ahead of time, each waiting for one execution's code
# (reserve.py): an execution that finds one ready starts in well under a millisecond
# instead of tens. Each holds a uid slot (beyond --max-concurrent) and ~15 MiB while it
# waits; 4 covers a burst on a 2-core host, the refill keeps up with what one core spawns.
DEFAULT_RESERVE_SIZE = 4
# A prepared sandbox is started under these ceilings and lowered to its execution's
# limits when the code arrives (a hard limit can be lowered, never raised): requests
# above them get a fresh sandbox. The control plane's own maxima by default.
DEFAULT_RESERVE_MAX_MEMORY_MB = 1024
DEFAULT_RESERVE_MAX_TIMEOUT_MS = 300_000
# A prepared sandbox's memory group starts at the size the last execution asked for
# (reserve.py), but never below this: its interpreter and its setup need about 15 MiB,
# and a client asking 1 MiB must not leave every next sandbox dying as it is prepared.
# A smaller request has its bound set when its code arrives, as any other size does.
DEFAULT_RESERVE_MIN_GROUP_MEMORY_MB = 64
# Execution threads kept waiting for the next execution once theirs has ended
# (workers.py): starting a thread costs the path of every execution about 0.2 ms. A few
# cover one connection's steady trickle; a burst starts more, which then end after the
# idle time.
DEFAULT_IDLE_EXECUTION_THREADS = 8
DEFAULT_IDLE_EXECUTION_THREAD_S = 60.0
# Niceness of a sandbox while it is being prepared and waits (root hosts; restored to 0
# when its execution arrives): starting the next one never slows the one running now.
DEFAULT_RESERVE_NICE = 10
# The warm template (template.py, --template): how long its start (an interpreter and
# the warm imports, ~0.1 s here) may take before the host gives up on it; a busy 2-core
# machine is ten times slower than an idle one.
DEFAULT_TEMPLATE_START_TIMEOUT_S = 15.0
# One fork request's answer: a fork of the template takes about a millisecond, so a
# template silent this long is stuck and is restarted.
DEFAULT_TEMPLATE_REPLY_TIMEOUT_S = 5.0
# How long a request waits for a template that is being restarted (it is back in about
# its start time) before the execution is answered not_started and moves elsewhere.
DEFAULT_TEMPLATE_WAIT_S = 2.0
# Restart pause of a template that keeps dying young, doubling up to the max.
DEFAULT_TEMPLATE_RETRY_S = 0.1
DEFAULT_TEMPLATE_RETRY_MAX_S = 5.0
# Sandboxes an execution may lose to a SIGKILL from outside (an operator, a machine-wide
# OOM killer) that landed before they read its code: the code provably never ran, so it
# gets the next sandbox; the one after this many is not started and the execution is
# answered not_started, which the pool moves, rather than spin on a host that kills every
# sandbox it makes.
DEFAULT_UNREAD_SANDBOX_RETRIES = 3
# How often the refill looks for prepared sandboxes that died while waiting.
DEFAULT_RESERVE_CHECK_S = 1.0
# When the reserve starts the next prepared sandbox (reserve.py). Preparing one takes
# about 5 ms of CPU (the template's fork, the namespaces, the root), and on a 2-core
# machine that work slows whatever runs beside it, nice or not: with a reserve of 58,
# back-to-back execute() calls took 11.2 ms refilled after each result, 7.9 ms refilled
# in the pause before them (docs/benchmarks.md, seventh session). So a sandbox is
# started once the host has been quiet this long (no execution taken, no result sent):
# longer than the gap between the calls of a busy caller, shorter than a pause between
# occasional ones.
DEFAULT_RESERVE_QUIET_S = 0.05
# ... unless the reserve runs low: at or below this share of its size ready (and at
# least one), the next is started as soon as an execution's result is out (or at the
# refill's next timed check), so a long burst finds sandboxes ready and does not fall
# back to starting fresh ones.
DEFAULT_RESERVE_LOW_SHARE = 0.25
# The refill's pause after a sandbox would not start (no free slot, a failing spawn),
# doubling up to the max: a broken machine is retried, not spun on.
DEFAULT_RESERVE_RETRY_S = 0.1
DEFAULT_RESERVE_RETRY_MAX_S = 5.0
# Processes (threads included) a child may have: enough for a snippet that uses a pool
# of workers, few enough that a fork bomb hits the wall at once. Per uid, and each
# execution slot has its own uid when the host runs as root.
DEFAULT_MAX_PROCESSES = 64
# Largest file a child may write, in bytes: its temp dir is on the host's disk.
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
# Open file descriptors per child process.
DEFAULT_MAX_OPEN_FILES = 256
# The CPU-time limit is the wall-clock timeout plus this many seconds: the wall clock
# decides (``timed_out``); the CPU limit is the backstop if the host itself stalls.
DEFAULT_CPU_MARGIN_S = 1
# First uid of the unprivileged range children run under when the host is root; slot N
# runs as BASE + N, so RLIMIT_NPROC (counted per uid) is per execution. Hosts sharing a
# machine each claim their own block of max-concurrent uids (``uids.claim``).
DEFAULT_CHILD_UID_BASE = 61000
# Uids per block: every host's block has this fixed size whatever its max-concurrent
# (which must not exceed it), so blocks never overlap.
DEFAULT_UID_BLOCK_SIZE = 1000
# How many blocks are tried: hosts one machine can run side by side.
DEFAULT_UID_BLOCKS = 64
# Run sandboxes alive at once on this host (launched and not exited); beyond it a
# launch is answered ``not_started(at_capacity)`` and the control plane tries again.
# Runs mostly wait on their jobs' output, so many more than executions fit.
DEFAULT_MAX_RUNS = 64
# Address space of each process of a run (RLIMIT_AS): the runner, its threads and the
# job. 2 GiB holds an ordinary interpreter-based job with room; a hog fails alone.
DEFAULT_RUN_MEMORY_MB = 2048
# Uids for run sandboxes (root hosts): their own range, away from execution blocks
# (61000 + 64 * 1000 ends at 125000), because a run outlives the host that started it.
DEFAULT_RUN_UID_BASE = 200_000
DEFAULT_RUN_UIDS = 10_000
# Writable space of one execution, in bytes, as a whole: its one tmpfs (/tmp, which is
# also HOME, the working directory, /var/tmp and /dev/shm). tmpfs is RAM and counts
# against the execution's memory group; a snippet's scratch files are small.
DEFAULT_SCRATCH_BYTES = 64 * 1024 * 1024
# Writable space of one run's sandbox: a job that builds or downloads needs more than a
# snippet, and still must not fill the machine.
DEFAULT_RUN_SCRATCH_BYTES = 512 * 1024 * 1024
# CPUs one sandbox may keep busy at once (a cgroup CPU quota where the host has the cpu
# controller): one, so a snippet or a job spinning many processes slows itself, not
# its neighbours. Its total CPU time is then bounded by its wall clock.
DEFAULT_EXECUTION_CPUS = 1.0
DEFAULT_RUN_CPUS = 1.0
# Connections a run's relay carries at once (the runner's calls are sequential plus one
# long poll; more is a job hammering the control plane through it).
DEFAULT_RELAY_MAX_CONNECTIONS = 16
# Interpreters tried for user code under --isolation insecure-rlimits when the host's own
# is out of an unprivileged uid's reach (a venv under /root, mode 0700): the system's.
# (A sandbox binds the host's interpreter at its own path, so it needs none of these.)
DEFAULT_FALLBACK_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
# Shortest token a host accepts, in characters. The token grants code execution to
# whoever holds it; 32 characters of `secrets.token_urlsafe(32)` (43 characters, 256
# bits) cannot be guessed, a short word can (docs/operations.md says how to make one).
DEFAULT_MIN_TOKEN_CHARS = 32
# Connections that have not authenticated yet, host-wide: each holds a thread and up to
# PRE_AUTH_MAX_BYTES until its auth deadline. A worker's handshake takes milliseconds, so
# 256 at once is far more than honest clients need; beyond it new connections are
# refused at once and the authenticated ones keep being served.
DEFAULT_MAX_PRE_AUTH = 256
# The same per peer address: one address cannot take the whole host-wide budget. Behind
# a balancer that does not preserve client addresses every connection has its address,
# so raise this to DEFAULT_MAX_PRE_AUTH there (docs/operations.md).
DEFAULT_MAX_PRE_AUTH_PER_PEER = 64
