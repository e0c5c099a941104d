"""drums desktops as environments for verifiers (v1 API, 0.4.x) and prime-rl.

`vf-eval drums-verifiers ...` finds the taskset, its fork-group env and its chat harness here.
"""

from drums_verifiers.env import DrumsEnv as DrumsEnv
from drums_verifiers.harness import DrumsChatHarness as DrumsChatHarness
from drums_verifiers.taskset import DrumsTaskset as DrumsTaskset

__all__ = ["DrumsChatHarness", "DrumsEnv", "DrumsTaskset"]
