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
    processes_of,
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


def footprint(machine: MachineLike, target: Target, slot_id: str) -> tuple[list, list]:
    """Everything on the host naming a slot: mounts under the state dir, processes by cgroup."""
    return mounts_under(machine, target.state_dir, slot_id), processes_of(machine, slot_id)


def instance_mounts(machine: MachineLike, target: Target, slot_id: str) -> list[str]:
    """The mounts of the slot's running instance. The Linux runtime names its directory
    slot-<slot id>-<suffix>; beside it, warm-<slot id>-* is a cache the daemon may drop."""
    return mounts_under(machine, target.state_dir, f"/slot-{slot_id}-")


def check_adopted(machine: MachineLike, target: Target, slot_id: str, before: tuple) -> None:
    """Adopted as it ran: the same processes (pids) and the same instance mounts."""
    pids = processes_of(machine, slot_id)
    check(pids == before[1], f"{slot_id}: processes {before[1]} -> {pids}")
    mounts = instance_mounts(machine, target, slot_id)
    check(mounts == before[0], f"{slot_id}: instance mounts {before[0]} -> {mounts}")


def wait_gone(
    machine: MachineLike, target: Target, slot_ids: set[str], timeout_s: float = 60
) -> None:
    """Destroyed slots leave no mount or process (a background kill may take a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = {s: footprint(machine, target, s) for s in slot_ids}
        left = {s: f for s, f in left.items() if f != ([], [])}
        if not left:
            return
        check(time.monotonic() < deadline, f"destroyed slots left mounts or processes: {left}")
        time.sleep(0.5)


def run(machine: MachineLike, target: Target = Target(), subtest: Subtest = plain_subtest) -> None:
    api = DrumsHttp(machine, target)
    machine.wait_for_unit(target.unit)
    api.wait_healthy()
    created: set[str] = set()

    with subtest("two live slots, one destroyed"):
        kept = [api.create_slot()["id"] for _ in range(2)]
        gone = api.create_slot()["id"]
        created |= {*kept, gone}
        api.destroy(gone)
        records = {s: stable(api.slot(s).body) for s in kept}
        footprints = {
            s: (instance_mounts(machine, target, s), processes_of(machine, s)) for s in kept
        }
        wait_gone(machine, target, {gone})

    with subtest("kill -9 of the daemon at rest: restarted, records and slots intact"):
        kill_main_and_wait_restart(machine, api, target.unit)
        for slot_id, record in records.items():
            reply = api.slot(slot_id)
            check(reply.status == 200, f"{slot_id} lost after kill -9: {reply.status} {reply.raw}")
            check(stable(reply.body) == record, f"{slot_id} changed: {reply.body} vs {record}")
            check_adopted(machine, target, slot_id, footprints[slot_id])
        check(api.slot(gone).status == 410, f"destroyed {gone} came back")
        wait_gone(machine, target, {gone}, timeout_s=5)
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
            created.add(extra)
            body = api.slot(extra).body
            check(body["state"] in ("ready", "failed", "quarantined"), f"half-made {extra}: {body}")
            api.destroy(extra)

    with subtest("a stop and start (KillMode=process) keeps the slots too"):
        status, out = machine.systemctl(f"restart {target.unit}")
        check(status == 0, f"systemctl restart failed: {out}")
        machine.wait_for_unit(target.unit)
        api.wait_healthy()
        for slot_id, record in records.items():
            reply = api.slot(slot_id)
            check(reply.status == 200 and stable(reply.body) == record, f"{slot_id}: {reply.raw}")
            check_adopted(machine, target, slot_id, footprints[slot_id])

    with subtest("destroying the adopted slots leaves no mount or process behind"):
        for slot_id in kept:
            api.destroy(slot_id)
        check(not (api.live_slot_ids() & created), f"slots left: {api.live_slot_ids()}")
        wait_gone(machine, target, created)
