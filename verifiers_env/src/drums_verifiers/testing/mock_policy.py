"""A scripted stand-in for a model: OpenAI-compatible chat completions streaming tool calls.

Tests and CI point `vf-eval --client.base-url` at it. Which script a conversation follows is chosen
by a marker in its first user message (`[policy:<name>]`, usually placed in the task instruction);
the step is the number of assistant turns already in the request, so the server keeps no
per-conversation state and concurrent rollouts never interfere. Every request is appended to a
JSONL log (image parts counted, not stored) so tests can check what the model saw.

Script file (JSON): {"<name>": [{"tool": "computer_click", "arguments": {...}}, {"text": "..."}]}.
A step may hold several calls: {"calls": [{"tool": ..., "arguments": ...}, ...]}. When a script
runs out, the policy answers with plain text, which ends the chat loop.

Run: python -m drums_verifiers.testing.mock_policy --scripts S.json [--port 0] [--port-file F]
Loopback only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MARKER = re.compile(r"\[policy:([A-Za-z0-9_.-]+)\]")
DEFAULT_SCRIPT = "default"


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def count_images(message: dict[str, Any]) -> int:
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image_url")


def image_types(message: dict[str, Any]) -> list[str]:
    """The media type of each image part (from its data URL), e.g. ["image/png"]."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    urls = [
        str((p.get("image_url") or {}).get("url", ""))
        for p in content
        if isinstance(p, dict) and p.get("type") == "image_url"
    ]
    return [u[5:].split(";", 1)[0] if u.startswith("data:") else "url" for u in urls]


def choose_script(messages: list[dict[str, Any]], scripts: dict[str, list]) -> str:
    for message in messages:
        if message.get("role") == "user":
            if found := MARKER.search(message_text(message)):
                return found.group(1)
            break
    return DEFAULT_SCRIPT


def next_step(messages: list[dict[str, Any]], scripts: dict[str, list]) -> dict[str, Any]:
    """The scripted reply for this conversation: step = assistant turns so far."""
    name = choose_script(messages, scripts)
    script = scripts.get(name, scripts.get(DEFAULT_SCRIPT, []))
    step = sum(1 for m in messages if m.get("role") == "assistant")
    if step < len(script):
        return script[step]
    return {"text": f"script {name!r} finished after {len(script)} steps"}


def step_calls(step: dict[str, Any]) -> list[dict[str, Any]]:
    if "calls" in step:
        return list(step["calls"])
    if "tool" in step:
        return [{"tool": step["tool"], "arguments": step.get("arguments", {})}]
    return []


def completion_chunks(model: str, step: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed chunks of one scripted reply, ending with a finish_reason and usage."""
    ident = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    calls = step_calls(step)
    if step.get("text"):
        chunks.append(chunk({"content": step["text"]}))
    for i, call in enumerate(calls):
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": f"call_{uuid.uuid4().hex[:10]}",
                            "type": "function",
                            "function": {
                                "name": call["tool"],
                                "arguments": json.dumps(call.get("arguments", {})),
                            },
                        }
                    ]
                }
            )
        )
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
    chunks.append(
        {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
    )
    return chunks


def completion_body(model: str, step: dict[str, Any]) -> dict[str, Any]:
    calls = step_calls(step)
    message: dict[str, Any] = {"role": "assistant", "content": step.get("text") or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:10]}",
                "type": "function",
                "function": {"name": c["tool"], "arguments": json.dumps(c.get("arguments", {}))},
            }
            for c in calls
        ]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
    }


class MockPolicy:
    """Holds the scripts and the request log; `serve()` runs the HTTP server in a thread."""

    def __init__(self, scripts: dict[str, list], log_path: Path | None = None) -> None:
        self.scripts = scripts
        self.log_path = log_path
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None

    def record(self, body: dict[str, Any]) -> None:
        messages = body.get("messages", [])
        entry = {
            "script": choose_script(messages, self.scripts),
            "messages": len(messages),
            "images": [count_images(m) for m in messages],
            "image_types": [t for m in messages for t in image_types(m)],
            "roles": [m.get("role") for m in messages],
            "tools": [t.get("function", {}).get("name") for t in body.get("tools") or []],
        }
        with self._lock:
            self.requests.append(entry)
            if self.log_path is not None:
                with self.log_path.open("a") as f:
                    f.write(json.dumps(entry) + "\n")

    def handler(self) -> type[BaseHTTPRequestHandler]:
        policy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet by default
                return

            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._json(
                        200,
                        {
                            "object": "list",
                            "data": [
                                {"id": "mock-policy", "object": "model", "max_model_len": 131072}
                            ],
                        },
                    )
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._json(400, {"error": {"message": "body is not JSON"}})
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                policy.record(body)
                step = next_step(body.get("messages", []), policy.scripts)
                model = body.get("model", "mock-policy")
                if not body.get("stream"):
                    self._json(200, completion_body(model, step))
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for item in completion_chunks(model, step):
                    self.wfile.write(f"data: {json.dumps(item)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler

    def serve(self, port: int = 0) -> int:
        """Start on 127.0.0.1 in a daemon thread; return the bound port."""
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self.handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self._server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--log", type=Path, help="append one JSON line per request")
    args = parser.parse_args(argv)
    policy = MockPolicy(json.loads(args.scripts.read_text()), args.log)
    port = policy.serve(args.port)
    if args.port_file:
        args.port_file.write_text(str(port))
    print(f"mock policy on http://127.0.0.1:{port}/v1", file=sys.stderr, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
