"""The forgotten-slot archive lives with the other OS effects in `drumsd.linux.forgotten` (blocking
file work the supervisor runs in a worker thread); this name stays for the supervisor's import."""

from drumsd.linux.forgotten import (
    delete_archives,
    scan_forgotten,
    write_checkpoint_record,
    write_forgotten,
)

__all__ = ["delete_archives", "scan_forgotten", "write_checkpoint_record", "write_forgotten"]
