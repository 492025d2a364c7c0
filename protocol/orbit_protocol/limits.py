"""Limits of what travels between a node and its clients, in one place for both sides.

Pure constants, no imports: the node's validation (``orbit_node/rules.py``,
``task_query.py``, ``workers/protocol.py``, ``store/transitions.py``) and the SDK
(``orbit_sdk``) read them from here, so a limit cannot drift between the side that
enforces it and the side that keeps within it.
"""

# Submissions in one POST /v1/tasks/batch.
MAX_BATCH_TASKS = 1000
# Tasks named by one start/renew/finish/release message of the Worker protocol.
MAX_TASKS_PER_MESSAGE = 1000
# Characters of a Finish error's message (longer ones are refused by the protocol).
MAX_ERROR_MESSAGE_CHARS = 4096
# Characters of a Finish error's traceback: the SDK keeps the end of a longer one (where
# the exception was raised); the protocol refuses more.
MAX_TRACEBACK_CHARS = 4096
# Task ids one listing filter names, and tasks one bulk cancel or retry changes.
MAX_TASK_IDS = 1000
MAX_BULK = 1000
# Seconds one GET /v1/tasks/{id}?wait_s=N may wait for its task to finish (a longer
# request is refused); the SDK's waits ask for at most this.
MAX_TASK_WAIT_S = 30
