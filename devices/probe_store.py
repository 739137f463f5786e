"""`--method auto`'s measurements kept on disk, so a one-shot run does not probe again.

What `devices.pair_probe` measures on a pair (stage times, window passes, the trial runs'
rates, the pooled accepted runs τ(γ) is read from) and what the chosen runs corrected
(`method_choice.Corrections`) lived only as long as the process; every `runtime.generate`
paid the probe again (about 7 s on a 2-core CPU). The store writes them to one small JSON
file per pair and machine, and a later process restores them before its first choice.

The file's name is a digest of everything the figures depend on, so a changed input is a
new file, never a stale answer:
  the machine   host name, OS, architecture, CPU model and count;
  the software  STORE_VERSION (raised when the laws or the keys change), Python, numpy,
                torch, onnxruntime, mlx and duet's versions;
  each model    its class and backend (with any emulation label), the load spec (path,
                backend, options) and, for every file in the checkpoint, its name, size and
                modification time.
A model with no load spec (in memory: a test's random model, an adapter view) has no file,
and auto measures as before; an emulated model is keyed by the model it wraps and the
emulation's label. A file first measured more than MAX_AGE_DAYS ago is measured again (a
machine's load and clocks drift; later runs add to a file but do not renew it), as is every
one with `--reprobe`. The folder is the cache's `auto` (runtime/paths.py): $DUET_CACHE_DIR/auto,
else $XDG_CACHE_HOME/duet/auto, else ~/.cache/duet/auto. A file that cannot be read or written is
named in one line on stderr and auto measures as if it were absent: a cache never stops a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from runtime import paths

STORE_VERSION = 4  # raise when the stored keys or what the laws read from them change
# (4: corrections became step-rate ratios, and the pooled mirror branch hits were added)
MAX_AGE_DAYS = 7.0
_PACKAGES = ("numpy", "torch", "onnxruntime", "mlx", "duet")


def cache_dir() -> Path:
    """Where the files live: the cache's `auto` folder (runtime/paths.py)."""
    return paths.cache_dir("auto")


def _cpu_model() -> str:
    try:
        if sys.platform == "darwin":
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=2,
            )
            return out.stdout.strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, ValueError, subprocess.SubprocessError):  # an unknown CPU is still a key
        pass
    return platform.processor()


def machine_key() -> dict:
    return {
        "host": platform.node(),
        "os": platform.system(),
        "arch": platform.machine(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
    }


def _versions() -> dict:
    out = {"store": STORE_VERSION, "python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def files_key(path) -> list | None:
    """[(name, size, mtime)] of the files at `path` (a checkpoint folder's, or the one file),
    None when it cannot be read: what a model's figures are keyed by."""
    p = Path(path)
    try:
        found = sorted(p.iterdir()) if p.is_dir() else [p]
        return [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in found if f.is_file()]
    except OSError:
        return None


def model_key(model) -> dict | None:
    """What identifies `model`'s figures: None for a model that was not loaded from a path."""
    # an emulated draft keeps no load spec of its own: its wrapped model's, with the label
    spec = getattr(model, "load_spec", None) or getattr(
        getattr(model, "model", None), "load_spec", None
    )
    if spec is None:
        return None
    path, backend, kw = spec[0], spec[1], spec[2]
    p, files = Path(path), files_key(path)
    if files is None:
        return None
    emu = getattr(model, "emu", None)
    return {
        "class": type(model).__name__,
        "backend": str(getattr(model, "backend", backend)),
        "emulated": getattr(emu, "label", None),
        "path": str(p.resolve()),
        "spec_backend": backend,
        "options": repr(sorted(dict(kw).items())),
        "files": files,
    }


class ProbeStore:
    """One pair's file (module docstring): `load()` the saved state, `save(state)` it."""

    def __init__(self, path: Path, *, refresh: bool = False):
        self.path, self.refresh = Path(path), refresh
        self.restored = False  # True once load() returned a state from the file
        self.measured = time.time()  # when the kept figures were first measured

    @classmethod
    def for_pair(cls, target, draft, *, refresh: bool = False) -> ProbeStore | None:
        """The pair's store, or None when a model was not loaded from files (nothing to key)."""
        keys = [model_key(target), model_key(draft)]
        if None in keys:
            return None
        return cls._keyed("pair", {"target": keys[0], "draft": keys[1]}, refresh)

    @classmethod
    def for_target(cls, target, kind: str, *, refresh: bool = False) -> ProbeStore | None:
        """A store of what auto measured on the target alone (`kind`: what for), keyed as a
        pair's is; None for a target not loaded from files."""
        key = model_key(target)
        return None if key is None else cls._keyed(kind, {"target": key, "kind": kind}, refresh)

    @classmethod
    def for_checkpoint(cls, tdir, kind: str, extra, *, refresh: bool = False) -> ProbeStore | None:
        """A store of what was measured on the checkpoint folder `tdir` before any model loads
        (`kind`: what for; `extra`: what else the figures depend on), None when unreadable."""
        files = files_key(tdir)
        if files is None:
            return None
        ident = {"path": str(Path(tdir).resolve()), "files": files, "extra": extra, "kind": kind}
        return cls._keyed(kind, {"checkpoint": ident}, refresh)

    @classmethod
    def _keyed(cls, prefix: str, models: dict, refresh: bool) -> ProbeStore:
        """The file of these models' figures on this machine under these package versions."""
        ident = {"machine": machine_key(), "versions": _versions(), **models}
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
        return cls(cache_dir() / f"{prefix}-{digest}.json", refresh=refresh)

    def load(self) -> dict | None:
        """The saved state, or None: no file, --reprobe, too old, or unreadable (said once)."""
        if self.refresh or not self.path.exists():
            return None
        try:
            doc = json.loads(self.path.read_text())
            if doc.get("store") != STORE_VERSION:
                return None
            measured = float(doc["measured"])
            if time.time() - measured > MAX_AGE_DAYS * 86400:  # measure again: drift
                return None
            state = doc["state"]
            if not isinstance(state, dict):
                raise ValueError("its state is not an object")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(
                f"[auto: ignoring the unreadable measurement cache {self.path}: {e}; measuring "
                "again]",
                file=sys.stderr,
            )
            return None
        self.restored, self.measured = True, measured
        return state

    def restore(self, apply) -> bool:
        """`apply(state)` to the saved state, if any; a state it cannot read (a hand-edited or
        truncated file) is said once and then measured again. True when it was applied."""
        state = self.load()
        if state is None:
            return False
        try:
            apply(state)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            self.restored = False
            print(
                f"[auto: ignoring the measurement cache {self.path}: {type(e).__name__}: {e}; "
                "measuring again]",
                file=sys.stderr,
            )
            return False
        return True

    def save(self, state: dict) -> None:
        """Write `state` atomically (a reader never sees half a file); a failure is said once.
        A state equal to the one this store last wrote is not written again (auto keeps after
        every choice and every run: 0.9 ms a write on a 2-core CPU, where most choices change
        nothing)."""
        same = json.dumps(state, sort_keys=True)
        if same == getattr(self, "_written", None):
            return
        doc = {"store": STORE_VERSION, "measured": self.measured, "saved": time.time(),
               "state": state}  # fmt: skip
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.path)
            self._written = same
        except OSError as e:
            if not getattr(self, "_warned", False):
                self._warned = True
                print(
                    f"[auto: could not keep the measurements in {self.path}: {e}]", file=sys.stderr
                )
            tmp.unlink(missing_ok=True)
