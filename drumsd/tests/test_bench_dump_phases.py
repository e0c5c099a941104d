"""`drumsd bench --saves`' split of a criu dump by its own log (bench/dump_phases.py)."""

from __future__ import annotations

import pytest
from drumsd.bench.dump_phases import START, dump_phases

pytestmark = pytest.mark.unit

LOG = """\
(00.000000) CRIU run id = x
(00.030000) Dumping processes (pid: 5 comm: desktop-init)
(00.031000) Seized task 5, state 1
(00.033000) net: Lock network
(00.040000) Dumping task (pid: 5 comm: desktop-init)
	a line without a stamp
(00.060000) Dumping pages (type: 59 pid: 5)
(00.070000) page-xfer: Transferring pages:
(00.100000) Pagemap generated: 3 pages (0 lazy) 0 holes
(00.110000) page-xfer: Transferring pages:
(00.120000) Dumping core (pid: 5)
(00.130000) mnt: Dumping mountpoints
(00.140000) Running post-dump scripts
(00.300000) Unfreezing tasks into 1
(00.301000) Dumping finished successfully
"""


def test_each_lines_time_goes_to_the_phase_its_last_marker_opened() -> None:
    got = dump_phases(LOG)
    assert got == {
        START: 0.031,
        "freeze": 0.002,
        "collect: mounts, sockets, namespaces": 0.007,
        "task: infect, files, registers": 0.02,
        "pages: scan, splice": 0.02,
        "pages: write": 0.04,
        "task: core, threads, cure": 0.01,
        "mounts (tmpfs content), shmem, namespaces": 0.01,
        "post-dump script (upper copy)": 0.16,
        "unfreeze, finish": 0.001,
        "total": 0.301,
    }
    assert sum(v for k, v in got.items() if k != "total") == pytest.approx(got["total"])


def test_a_log_without_stamps_has_no_phases() -> None:
    assert dump_phases("criu: not started\n") == {}
