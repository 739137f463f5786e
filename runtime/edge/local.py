"""`--server local`: start a cloud verifier subprocess on 127.0.0.1 and stop it at exit.

It launches the command `python -m apps.cloud serve` (a process, not an import: the runtime
does not depend on apps) with a fresh random token in a private temp file, and reads the
`listening on HOST:PORT` line the server prints first.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from runtime.errors import DuetError


class LocalVerifier:
    """A verifier subprocess; `host`, `port`, `token`; `stop()` (or `with`) ends it."""

    def __init__(
        self,
        target_dir: str | Path | None = None,
        *,
        target_backend: str = "auto",
        extra_args: tuple[str, ...] = (),
        start_timeout_s: float = 120.0,
    ):
        self.token = secrets.token_hex(16).encode()
        self._tmp = tempfile.TemporaryDirectory(prefix="duet-cloud-")
        tok = Path(self._tmp.name) / "token"
        tok.write_bytes(self.token)
        os.chmod(tok, 0o600)
        cmd = [sys.executable, "-m", "apps.cloud", "serve", "--host", "127.0.0.1", "--port", "0",
               "--token-file", str(tok), "--target-backend", target_backend,
               *extra_args]  # fmt: skip
        if target_dir is not None:
            cmd += ["--target", str(target_dir)]
        root = Path(__file__).resolve().parents[2]  # the checkout, so `apps` imports
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
        )
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root
        )
        line = [None]
        t = threading.Thread(target=lambda: line.__setitem__(0, self.proc.stdout.readline()))
        t.start()
        t.join(start_timeout_s)
        first = line[0] or ""
        if not first.startswith("listening on "):
            self.proc.kill()
            err = (self.proc.stderr.read() or "").strip().splitlines()
            self.stop()
            raise DuetError(
                "the local cloud verifier did not start: " + (err[-1] if err else "no output")
            )
        host, _, port = first.split()[-1].rpartition(":")
        self.host, self.port = host, int(port)

    def stop(self) -> None:
        """Terminate the subprocess and remove the token file."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            if f:
                f.close()
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
