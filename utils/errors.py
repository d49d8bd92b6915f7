"""The one exception type for problems the user can fix (bad arguments, data, files).

run.py prints its message as a single line on rank 0 and exits non-zero on every rank,
instead of showing a traceback from deep inside pandas or torch.
"""


class UserError(Exception):
    """A problem with the user's input; the message says what is wrong and what to do."""


def require(condition, message):
    if not condition:
        raise UserError(message)


class NodeError(UserError):
    """A problem of one machine (its GPUs), found before the processes can talk to each other: the
    first process of every machine that has it prints the line (run.py), not global rank 0 alone."""
