"""The drums-verifiers harness's chat program under every openai the supported verifiers allow.

verifiers 0.4 allows openai 2.x, prime-rl's pinned commit 2.9 and up; PyPI also has 3.x, which
an unpinned header resolved to and which refused the program's `httpx.Timeout` (every rollout of
the default harness ended `HarnessError`). The program as the harness builds it is run through
`uv run --script` with its openai requirement swapped for one version at a time, against the
scripted policy (no tools: the `probe` script's calls come back as unknown-tool errors).
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from drums_verifiers.harness import PROGRAM, failure_cause

OPENAI = re.compile(r'"openai[^"]*"')


@pytest.mark.parametrize("version", ["2.9.0", "2.38.0", "3.63.0"])
def test_program_talks_to_the_model_under_openai(version, policy, tmp_path):
    source = OPENAI.sub(f'"openai=={version}"', PROGRAM, count=1)
    assert f'"openai=={version}"' in source.partition("# ///\n")[0], "the header names openai"
    script = tmp_path / "program.py"
    script.write_text(source)
    proc = subprocess.run(
        ["uv", "run", "--quiet", "--script", str(script), f"--base-url={policy.base_url}",
         "--api-key=not-a-secret", "--model=mock-policy", "--prompt=[policy:probe] hi",
         "--max-steps=3"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, failure_cause(proc.stderr)
    requests = [json.loads(line) for line in (tmp_path / "policy-requests.jsonl").open()]
    assert len(requests) == 3, requests  # two scripted calls answered, then the plain reply


def test_the_cause_of_a_failure_is_the_traceback_last_line():
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "/x/program.py", line 88, in main\n'
        "    client = AsyncOpenAI(\n"
        "             ^^^^^^^^^^^^\n"
        "TypeError: Invalid timeout: expected a number, got <class 'httpx.Timeout'>.\n"
        "Exception ignored in: <function AsyncHttpxClientWrapper.__del__ at 0x7f>\n"
        "AttributeError: 'AsyncHttpxClientWrapper' object has no attribute '_state'\n"
    )
    assert failure_cause(stderr) == (
        "TypeError: Invalid timeout: expected a number, got <class 'httpx.Timeout'>."
    )
    assert failure_cause("") == "no output"


pytestmark = pytest.mark.integration
