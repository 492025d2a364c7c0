"""Limits of what travels between a node and its clients, in one place for both sides.

Pure constants, no imports: the node's validation (``orbit_node/domain/rules.py``,
``domain/task_query.py``, ``store/transitions.py``), the Worker protocol's messages
(``orbit_protocol/messages.py``) and the SDK (``orbit_sdk``) read them from here, so a
limit cannot drift between the side that enforces it and the side that keeps within it.
"""

# Submissions in one POST /v1/tasks/batch.
MAX_BATCH_TASKS = 1000
# A task's parents: by id (depends_on), and by acceptance key (depends_on_keys, a batch's
# worth); a dispatch names them all.
MAX_PARENTS = 100
MAX_PARENT_KEYS = MAX_BATCH_TASKS
MAX_DISPATCHED_PARENTS = MAX_PARENTS + MAX_PARENT_KEYS
# Tasks named by one start/renew/finish/release message of the Worker protocol.
MAX_TASKS_PER_MESSAGE = 1000
# Characters of a Finish error's message (longer ones are refused by the protocol).
MAX_ERROR_MESSAGE_CHARS = 4096
# Characters of a Finish error's code.
MAX_ERROR_CODE_CHARS = 128
# Characters of a Finish error's traceback: the SDK keeps the end of a longer one (where
# the exception was raised); the protocol refuses more.
MAX_TRACEBACK_CHARS = 4096
# A Worker's hello: the most tasks it runs at once, queues it serves and capabilities
# (handler, handler version, payload version) it declares.
MAX_CAPACITY = 1000
MAX_QUEUES = 64
MAX_CAPABILITIES = 256
# Characters of a drain's reason.
MAX_DRAIN_REASON_CHARS = 64
# A task's highest priority (0, the default, is the lowest).
MAX_PRIORITY = 9
# Characters of a task's resource key, and of the W3C tracestate a task keeps (the W3C
# recommends that up to 512 be propagated; a longer one is dropped).
MAX_RESOURCE_KEY_CHARS = 255
MAX_TRACESTATE_CHARS = 512
# Task ids one listing filter names, and tasks one bulk cancel or retry changes.
MAX_TASK_IDS = 1000
MAX_BULK = 1000
# Seconds one GET /v1/tasks/{id}?wait_s=N may wait for its task to finish (a longer
# request is refused); the SDK's waits ask for at most this.
MAX_TASK_WAIT_S = 30
