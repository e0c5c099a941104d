"""Scenario: fork a running desktop into 4 children that share its past and nothing after.

Needs the Linux runtime.
"""

from __future__ import annotations

from drums_http import DrumsHttp, MachineLike, Subtest, Target, check, gate_status, plain_subtest

CHILDREN = 4
PARENT_FILE = "/home/user/Desktop/from-parent.txt"
CHILD_FILE = "/home/user/Desktop/only-in-child-0.txt"


def run(machine: MachineLike, target: Target = Target(), subtest: Subtest = plain_subtest) -> None:
    api = DrumsHttp(machine, target)
    api.wait_healthy()

    with subtest("a parent with some state of its own"):
        parent = api.create_slot()["id"]
        check(api.wait_gates(parent)["valid"] is True, "the parent's gates failed")
        out = api.execute(parent, f"echo parent > {PARENT_FILE}")
        check(out["returncode"] == 0, f"writing in the parent failed: {out!r}")

    with subtest(f"fork {CHILDREN}: children with their own ids, every gate passes"):
        result = api.ok("POST", f"/v1/slots/{parent}/fork", {"n": CHILDREN})
        children = [c["id"] for c in result["children"]]
        check(len(children) == CHILDREN, f"the fork gave {len(children)} children")
        check(len(set(children) | {parent}) == CHILDREN + 1, f"ids repeat: {children}")
        for child in children:
            report = api.wait_gates(child)
            check(report["valid"] is True, f"child {child} gates failed: {report.get('failed')}")
            check(
                gate_status(report, "isolation") == "pass",
                f"child {child} isolation gate: {gate_status(report, 'isolation')}",
            )

    with subtest("every child inherited the parent's state"):
        for child in children:
            out = api.execute(child, f"cat {PARENT_FILE}")
            check(out["stdout"].strip() == "parent", f"{child} lacks the parent's file: {out!r}")

    with subtest("an action in one child is absent from the others and the parent"):
        out = api.execute(children[0], f"echo mine > {CHILD_FILE}")
        check(out["returncode"] == 0, f"writing in child 0 failed: {out!r}")
        for other in [parent, *children[1:]]:
            out = api.execute(other, f"test -e {CHILD_FILE}; echo $?")
            check(out["stdout"].strip() == "1", f"{CHILD_FILE} leaked into {other}")

    with subtest("each slot has its own network, pid and mount namespaces"):
        seen: dict[str, set[str]] = {"net": set(), "pid": set(), "mnt": set()}
        for slot in [parent, *children]:
            out = api.execute(
                slot, "readlink /proc/self/ns/net /proc/self/ns/pid /proc/self/ns/mnt"
            )
            net, pid, mnt = out["stdout"].split()
            for kind, value in (("net", net), ("pid", pid), ("mnt", mnt)):
                check(value not in seen[kind], f"{slot} shares its {kind} namespace {value}")
                seen[kind].add(value)
        host_net = machine.succeed("readlink /proc/self/ns/net").strip()
        check(host_net not in seen["net"], "a slot shares the host's network namespace")

    with subtest("destroy the family"):
        for slot in [*children, parent]:
            api.destroy(slot)
        live = api.live_slot_ids()
        check(not (live & {parent, *children}), f"still listed after destroy: {live}")
