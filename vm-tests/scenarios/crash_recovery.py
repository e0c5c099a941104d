"""Scenario: kill -9 of the daemon, with and without a request in flight; it comes back (systemd's
Restart=on-failure), every record survives, live slots are adopted, and nothing is left over.

Runs against any runtime: with the Linux runtime the slots are real process trees and mounts.
"""

from __future__ import annotations

import time

from drums_http import (
    DrumsHttp,
    MachineLike,
    Subtest,
    Target,
    check,
    mounts_under,
    plain_subtest,
    processes_rooted_under,
)

# Fields of a slot record that a restart must not change (a live slot is adopted as it was, so
# its state too: ready stays ready, quarantined stays quarantined).
STABLE_FIELDS = ("id", "state", "checkpoint", "created_at", "episode", "parent")


def main_pid(machine: MachineLike, unit: str) -> int:
    status, out = machine.systemctl(f"show -p MainPID --value {unit}")
    check(status == 0, f"systemctl show {unit} failed: {out}")
    return int(out.strip() or 0)


def kill_main_and_wait_restart(machine: MachineLike, api: DrumsHttp, unit: str) -> None:
    before = main_pid(machine, unit)
    check(before > 0, f"{unit} has no main process")
    # Only the main process: slots live in the unit's delegated cgroup and must survive.
    status, out = machine.systemctl(f"kill --signal=KILL --kill-whom=main {unit}")
    check(status == 0, f"systemctl kill failed: {out}")
    deadline = time.monotonic() + 60
    while True:
        now = main_pid(machine, unit)
        if now not in (0, before):
            break
        check(time.monotonic() < deadline, f"{unit} was not restarted after kill -9 of {before}")
        time.sleep(0.2)
    machine.wait_for_unit(unit)
    api.wait_healthy()


def stable(record: dict) -> dict:
    return {k: record.get(k) for k in STABLE_FIELDS}


def run(machine: MachineLike, target: Target = Target(), subtest: Subtest = plain_subtest) -> None:
    api = DrumsHttp(machine, target)
    machine.wait_for_unit(target.unit)
    api.wait_healthy()
    base_mounts = mounts_under(machine, target.state_dir)
    base_procs = processes_rooted_under(machine, target.state_dir)

    with subtest("two live slots, one destroyed"):
        kept = [api.create_slot()["id"] for _ in range(2)]
        gone = api.create_slot()["id"]
        api.destroy(gone)
        records = {s: stable(api.slot(s).body) for s in kept}
        mounts = mounts_under(machine, target.state_dir)
        procs = processes_rooted_under(machine, target.state_dir)

    with subtest("kill -9 of the daemon at rest: restarted, records and slots intact"):
        kill_main_and_wait_restart(machine, api, target.unit)
        for slot_id, record in records.items():
            reply = api.slot(slot_id)
            check(reply.status == 200, f"{slot_id} lost after kill -9: {reply.status} {reply.raw}")
            check(stable(reply.body) == record, f"{slot_id} changed: {reply.body} vs {record}")
        check(api.slot(gone).status == 410, f"destroyed {gone} came back")
        check(
            mounts_under(machine, target.state_dir) == mounts,
            "mounts under the state dir changed across the restart (leaked or lost)",
        )
        check(
            processes_rooted_under(machine, target.state_dir) == procs,
            "slot processes changed across the restart",
        )
        machine.succeed(f"test -s {target.journal_dir}/events.jsonl")

    with subtest("kill -9 during a create: the restart reconciles, nothing half-made stays"):
        machine.succeed(
            "(curl -s --max-time 60 -X POST "
            f'-H "Authorization: Bearer $(cat {target.token_file})" '
            f"-H 'Content-Type: application/json' --data-binary '{{}}' "
            f"{target.base_url}/v1/slots > /dev/null 2>&1 &)"
        )
        kill_main_and_wait_restart(machine, api, target.unit)
        live = api.live_slot_ids()
        check(set(kept) <= live, f"kept slots lost: {set(kept) - live}")
        for extra in live - set(kept):
            body = api.slot(extra).body
            check(body["state"] in ("ready", "failed"), f"half-made slot {extra}: {body}")
            api.destroy(extra)

    with subtest("a stop and start (KillMode=process) keeps the slots too"):
        status, out = machine.systemctl(f"restart {target.unit}")
        check(status == 0, f"systemctl restart failed: {out}")
        machine.wait_for_unit(target.unit)
        api.wait_healthy()
        for slot_id, record in records.items():
            reply = api.slot(slot_id)
            check(reply.status == 200 and stable(reply.body) == record, f"{slot_id}: {reply.raw}")

    with subtest("destroying the adopted slots leaves no mount or process behind"):
        for slot_id in kept:
            api.destroy(slot_id)
        check(not api.live_slot_ids(), f"slots left: {api.live_slot_ids()}")
        check(
            mounts_under(machine, target.state_dir) == base_mounts,
            "mounts under the state dir remain after every slot was destroyed",
        )
        check(
            processes_rooted_under(machine, target.state_dir) == base_procs,
            "processes inside slot roots remain after every slot was destroyed",
        )
