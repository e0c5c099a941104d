"""The generator version: in every task's metadata, in index.json, in the verifier's name."""

GENERATOR_VERSION = "0.3.0"
# The generated verifier module's import name; it changes with the version so that two installed
# task sets built by different generators never shadow each other's checkers.
VERIFIER_MODULE = "drums_verifier_" + GENERATOR_VERSION.replace(".", "_")
