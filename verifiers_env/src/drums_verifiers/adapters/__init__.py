"""Adapters for other RL frameworks: verl 0.9.1 (a tool and an agent loop) and SkyRL (an env).

Both give one desktop per trajectory and apply the verifier contract in the trainer's own terms:
a valid episode's checker score is the reward; one that may not be trained on (invalid, checker
or desktop failure) is masked or dropped (verl) or ends with `invalid_reward` and
`drums_valid = 0` (SkyRL, whose generator has no way to drop a trajectory). See docs/verifiers.md.
"""
