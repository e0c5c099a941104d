"""A video of a desktop: screenshots sampled by a background thread, encoded to an mp4 by ffmpeg.

What OSWorld's `env.controller.start_recording()` / `end_recording(path)` give (its VM records the
X display with ffmpeg); here the frames come through the daemon's screenshot route, so the same
code records any desktop from wherever the SDK runs. The encoder is the first of `ffmpeg` on
PATH and the binary of the `imageio-ffmpeg` wheel (`pip install imageio-ffmpeg`: no root, any
host with PyPI); frames are held to wall-clock time (a slow grab repeats the last frame), so the
video lasts as long as the episode did.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from typing import IO, Callable, List, Optional

log = logging.getLogger("desktopenv.drums.recording")

DEFAULT_FPS = 2.0
STOP_TIMEOUT_S = 60.0


class RecordingUnavailable(RuntimeError):
    """No encoder: neither ffmpeg on PATH nor the imageio-ffmpeg wheel."""


def ffmpeg_binary() -> str:
    found = shutil.which("ffmpeg")
    if found:
        return found
    try:
        import imageio_ffmpeg  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise RecordingUnavailable(
            "recording needs ffmpeg: install it (apt-get install ffmpeg) or the imageio-ffmpeg "
            "wheel (pip install imageio-ffmpeg)"
        ) from None
    return str(imageio_ffmpeg.get_ffmpeg_exe())


def frame_codec(frame: bytes) -> str:
    """ffmpeg's decoder for a frame's bytes (named: its probe misreads small JPEGs in a pipe)."""
    if frame.startswith(b"\x89PNG"):
        return "png"
    if frame.startswith(b"\xff\xd8"):
        return "mjpeg"
    if frame[:4] == b"RIFF" and frame[8:12] == b"WEBP":
        return "webp"
    raise ValueError(f"not a PNG, JPEG or WebP frame: {frame[:12]!r}")


def encoder_command(ffmpeg: str, fps: float, codec: str, out: str) -> List[str]:
    """`codec` frames on stdin -> H.264 (yuv420p, sides rounded up to even) in an mp4 that any
    player opens."""
    return [
        ffmpeg, "-hide_banner", "-loglevel", "error", "-y",
        "-f", "image2pipe", "-framerate", f"{fps:g}", "-c:v", codec, "-i", "pipe:0",
        "-vf", "scale=ceil(iw/2)*2:ceil(ih/2)*2", "-c:v", "libx264", "-preset", "veryfast",
        "-pix_fmt", "yuv420p", "-movflags", "+faststart", out,
    ]  # fmt: skip


class ScreenRecorder:
    """Records `grab()` (an image's bytes) at `fps` from start() until stop(dest)."""

    def __init__(self, grab: Callable[[], bytes], fps: float = DEFAULT_FPS) -> None:
        if fps <= 0:
            raise ValueError(f"fps must be > 0, not {fps!r}")
        self.grab = grab
        self.fps = fps
        self.frames = 0  # frames written, repeats included
        self.grabs = 0  # screenshots taken
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._ffmpeg = ""
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._dir: Optional[str] = None
        self._error: Optional[str] = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self.running:
            raise RuntimeError("a recording is already in progress")
        self._ffmpeg = ffmpeg_binary()
        self._dir = tempfile.mkdtemp(prefix="drums-recording-")
        self._proc = None  # started on the first frame, whose format names the decoder
        self._stop.clear()
        self.frames = self.grabs = 0
        self._error = None
        self._thread = threading.Thread(target=self._run, name="drums-recorder", daemon=True)
        self._thread.start()

    def _encoder(self, first: bytes) -> subprocess.Popen[bytes]:
        out = os.path.join(self._dir or "", "recording.mp4")
        return subprocess.Popen(
            encoder_command(self._ffmpeg, self.fps, frame_codec(first), out),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def _run(self) -> None:
        started = time.monotonic()
        last: Optional[bytes] = None
        while True:
            stopping = self._stop.is_set()
            try:
                last = self.grab()
                self.grabs += 1
            except Exception as exc:  # a grab that fails (load, a closing env): repeat the last
                log.warning("recording: screenshot failed (%s); repeating the last frame", exc)
            due = int((time.monotonic() - started) * self.fps) + 1
            if last is not None:
                if self._proc is None:
                    try:
                        self._proc = self._encoder(last)
                    except (ValueError, OSError) as exc:
                        self._error = f"cannot start ffmpeg: {exc}"
                        return
                assert self._proc.stdin is not None
                if not self._write(self._proc.stdin, last, max(due - self.frames, 0)):
                    return
            if stopping:
                return
            self._stop.wait(max(0.0, started + due / self.fps - time.monotonic()))

    def _write(self, pipe: IO[bytes], frame: bytes, times: int) -> bool:
        try:
            for _ in range(times):
                pipe.write(frame)
                self.frames += 1
            return True
        except (BrokenPipeError, OSError) as exc:
            self._error = f"ffmpeg stopped taking frames: {exc}"
            return False

    def cancel(self) -> None:
        """End the recording and drop the video (an env closed mid-recording)."""
        thread, proc = self._thread, self._proc
        self._stop.set()
        if thread is not None:
            thread.join(STOP_TIMEOUT_S)
        self._thread = self._proc = None
        if proc is not None:
            proc.kill()
            proc.communicate()
        shutil.rmtree(self._dir or "", ignore_errors=True)
        self._dir = None

    def stop(self, dest: str) -> str:
        """End the recording and move the mp4 to `dest`; returns dest."""
        thread = self._thread
        if thread is None:
            raise RuntimeError("no recording in progress: call start() first")
        self._stop.set()
        thread.join(STOP_TIMEOUT_S)
        self._thread = None
        proc = self._proc
        if proc is None:
            shutil.rmtree(self._dir or "", ignore_errors=True)
            raise RuntimeError(f"recording failed: no frame was grabbed. {self._error or ''}")
        try:  # closes ffmpeg's stdin: it finishes the file
            _, err = proc.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        out = os.path.join(self._dir or "", "recording.mp4")
        try:
            if proc.returncode != 0 or not os.path.isfile(out) or self.frames == 0:
                raise RuntimeError(
                    f"recording failed ({self.frames} frames, ffmpeg exit {proc.returncode}): "
                    f"{self._error or ''} {err.decode(errors='replace').strip()[-2000:]}"
                )
            parent = os.path.dirname(os.path.abspath(dest))
            os.makedirs(parent, exist_ok=True)
            shutil.move(out, dest)
            return dest
        finally:
            shutil.rmtree(self._dir or "", ignore_errors=True)
            self._dir = None
            self._proc = None
