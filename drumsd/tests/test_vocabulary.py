"""One action vocabulary and one gate list: every user imports the SDK's `drums.vocabulary`, and
the guest's stdlib-only copy (it runs inside the desktop image) is kept equal to it here."""

from __future__ import annotations

from typing import get_args

from drums import models, vocabulary
from drums_verifiers.testing import fake_drumsd
from drumsd.core import gates
from drumsd.core import vocabulary as core_vocabulary
from drumsd.guest import protocol
from drumsd.runtime import ops_episode


def test_the_guest_copy_of_the_action_types_equals_the_shared_one() -> None:
    assert protocol.ACTION_TYPES == vocabulary.ACTION_TYPES
    assert set(protocol._FIELDS) == set(vocabulary.ACTION_TYPES)
    # A field the daemon requires is one the guest accepts for that type.
    for kind, required in vocabulary.ACTION_REQUIRES.items():
        needed, optional = protocol._FIELDS[kind]
        assert set(required) <= needed | optional, kind


def test_every_user_holds_the_same_objects_not_copies() -> None:
    assert core_vocabulary.ACTION_TYPES is vocabulary.ACTION_TYPES
    assert gates.GATES is vocabulary.GATES and gates.START_GATES is vocabulary.START_GATES
    assert fake_drumsd.GATES is vocabulary.GATES
    assert ops_episode.ACTION_REQUIRES is vocabulary.ACTION_REQUIRES
    assert ops_episode.TERMINAL_ACTIONS is vocabulary.TERMINAL_ACTIONS
    assert models.ACTION_TYPES is vocabulary.ACTION_TYPES
    assert get_args(models.Action.model_fields["type"].annotation) == vocabulary.ACTION_TYPES


def test_the_lists_are_well_formed() -> None:
    assert len(set(vocabulary.ACTION_TYPES)) == len(vocabulary.ACTION_TYPES)
    assert len(set(vocabulary.GATES)) == len(vocabulary.GATES)
    assert set(vocabulary.START_GATES) < set(vocabulary.GATES)
    assert set(vocabulary.TERMINAL_ACTIONS) | set(vocabulary.POINTER_ACTIONS) <= set(
        vocabulary.ACTION_TYPES
    )
    assert set(vocabulary.ACTION_REQUIRES) <= set(vocabulary.ACTION_TYPES)
