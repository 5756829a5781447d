"""The command groups of ``checkpoint-ops``: each module registers its subcommands from the shared
parent parsers (``cli.Parents``) and turns arguments into library calls or operations."""

from . import backup, checkpoint, compat, ledger, lease, operations, sink

COMMANDS = [checkpoint.register, compat.register, operations.register, sink.register, backup.register,
            ledger.register, lease.register]
