"""Adapters for other RL frameworks: verl 0.9.1 (a tool and an agent loop) and SkyRL (an env, and
wrappers for its generator and trainer).

Both give one desktop per trajectory and apply the verifier contract in the trainer's own terms:
a valid episode's checker score is the reward; one that may not be trained on (invalid, checker
or desktop failure, a failed sample) is dropped or masked and kept out of its GRPO group's
statistics (verl: `invalid_episode: drop`, or `drums_grpo`; SkyRL: `drums_generator` and
`drums_trainer`). See docs/verifiers.md.
"""
