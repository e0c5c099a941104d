"""Every family's checkers on locally simulated outcomes: the oracle's file scores 1, doing
nothing and every near miss score 0, check and check_alt agree, and the scope rule flags only
the probe. (Pure checks of the checker logic; the live validator runs the same on a desktop.)"""

from __future__ import annotations

import pytest
from drums_tasks import FAMILIES, load_all
from drums_tasks.build import generate
from drums_tasks.offline import evaluate
from drums_tasks.spec import scope_probe, task_json

load_all()
# Index 0 of every family is in the fast tier; indices 1-3 (the same checks on other seeds, about
# 60 s more) run with the slow tests (the full command).
MORE_INDICES = range(1, 4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_checkers_separate_oracle_from_near_misses(family: str, require_check_libs) -> None:
    check_family(family, [0], require_check_libs)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_checkers_on_more_seeds(family: str, require_check_libs) -> None:
    check_family(family, MORE_INDICES, require_check_libs)


def check_family(family: str, indices, require_check_libs) -> None:
    for index in indices:
        tid, spec = generate(5, family, index)
        require_check_libs(spec.check, spec.check_alt)
        seeded = task_json(spec, tid, 5, index)["evaluator"]["scope"]["seeded"]
        where = f"{family}[{index}]"

        oracle = evaluate(spec, seeded, spec.oracle)
        assert (oracle.score, oracle.score_alt) == (1.0, 1.0), where
        assert oracle.scope_violations == [], where

        noop = evaluate(spec, seeded, None)
        assert (noop.score, noop.score_alt) == (0.0, 0.0), where
        assert noop.scope_violations == [], where

        for near in spec.near_misses:
            assert near.simulate is not None, f"{where} {near.name} cannot be simulated"
            r = evaluate(spec, seeded, near)
            assert (r.score, r.score_alt) == (0.0, 0.0), f"{where} near miss {near.name}"

        probe = evaluate(spec, seeded, scope_probe(spec))
        assert probe.score == probe.score_alt == 1.0, where
        assert probe.scope_violations == [spec.decoy], where


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_near_misses_have_distinct_names_and_actions(family: str) -> None:
    _, spec = generate(9, family, 0)
    names = [s.name for s in spec.near_misses]
    assert len(set(names)) == len(names)
    assert "oracle" not in names
    assert all(s.actions for s in spec.near_misses)
    assert all(s.actions != spec.oracle.actions for s in spec.near_misses)


def _leaves(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_task_json_does_not_carry_a_text_answer(family: str) -> None:
    """Issue 36: a one-line answer the oracle writes must not be a value of the task's evaluator
    (the exploit suite's `forge` typed such values and scored 1 without solving the task)."""
    tid, spec = generate(5, family, 0)
    evaluator = task_json(spec, tid, 5, 0)["evaluator"]
    leaves = {v for v in _leaves(evaluator) if isinstance(v, str)}
    effects = spec.oracle.simulate(dict(spec.files)) if spec.oracle.simulate else {}
    for path, _dest in spec.results:
        data = effects.get(path)
        if data is None or len(data) > 200 or path in spec.files:
            continue
        try:
            answer = data.decode().strip()
        except UnicodeDecodeError:
            continue
        if "\n" not in answer:
            assert answer not in leaves, f"{family}: the answer {answer!r} is in the task's JSON"
