"""Adapters for other RL frameworks: verl (a tool and an agent loop) and SkyRL (an environment).

Both give one desktop per trajectory and apply the same verifier contract as the verifiers
taskset: a valid episode's score is the reward; an invalid one raises DrumsInvalidEpisode
(the framework must skip it, never train on a made-up reward); checker or daemon failures raise.
"""
