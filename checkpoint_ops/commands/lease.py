"""``checkpoint-ops lease``: who holds a checkpoint (or sink output, or backup destination), and breaking
a lease by hand."""

from __future__ import annotations

from ..cli import Parents, emit, run_operation, storage_options
from ..errors import EXIT_OK


def cmd_lease_show(args) -> int:
    from ..lease import read_lease
    from ..operation import Site, require_directory, require_objects_under
    from ..storage import open_file_manager

    fm, root = open_file_manager(args.url, storage_options(args))
    require_directory(Site(fm, root, args.url))  # a typo is not "lease free"; a file has no lease
    state = read_lease(fm, root)
    if not state.present and fm.strategy == "direct-put":
        require_objects_under(fm, root, args.url)  # a typo (a prefix, a bucket) is not "lease free"
    emit(args, state.to_dict(), f"{fm.url(root)}: lease {state.describe()}")
    return EXIT_OK


def cmd_lease_break(args) -> int:
    from ..lease_break import LeaseBreakOperation

    return run_operation(args, LeaseBreakOperation(args.url, storage_options(args)))


def register(sub, parents: Parents) -> None:
    p = sub.add_parser("lease", help="the lease that lets one writer at a time change a checkpoint, a sink output "
                       "or a backup destination")
    lsub = p.add_subparsers(dest="lease_command", required=True, metavar="ACTION")
    q = lsub.add_parser("show", parents=parents.reading, help="who holds the lease, since when, and whether it is "
                        "stale")
    q.add_argument("url", metavar="CHECKPOINT_OR_PATH")
    q.set_defaults(func=cmd_lease_show)
    q = lsub.add_parser("break", parents=[*parents.reading, parents.mutating],
                        help="remove a lease by hand (journaled); a stale one is taken over without this")
    q.add_argument("url", metavar="CHECKPOINT_OR_PATH")
    q.set_defaults(func=cmd_lease_break)
