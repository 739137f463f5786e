"""`python -m apps.server` in a subprocess for the tests that drive it through the real `openai`
client: started on a free port, waited for, and stopped afterwards."""

import re
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def served(args: list[str], timeout: float = 120):
    """Yields the base URL (http://127.0.0.1:PORT) of `python -m apps.server ARGS --port 0`;
    the server is killed if it has not said where it listens within `timeout` s."""
    cmd = [sys.executable, "-m", "apps.server", *args, "--port", "0"]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    timer = threading.Timer(timeout, proc.kill)  # never hang the suite on a server that hangs
    timer.start()
    try:
        first = proc.stdout.readline().rstrip("\n")
        timer.cancel()
        m = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)", first)
        assert m, f"server did not start: {first or proc.stderr.read()}"
        yield f"http://127.0.0.1:{m.group(1)}"
    finally:
        timer.cancel()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def openai_client(url: str, api_key: str = "unused", timeout: float = 60):
    """The real `openai` client on a served URL, without retries."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=timeout)
