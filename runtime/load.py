"""Resolve and load a target/draft pair the way every command does."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.backends import backend_for_path, load_model
from runtime.errors import DuetError
from runtime.tokenizer import Tokenizer, check_pair


@dataclass
class Pair:
    target: object
    draft: object | None
    tokenizer: Tokenizer | None
    target_dir: Path
    draft_path: Path | None
    settings: dict  # backends and thread counts, for reports


def resolve(path: str | None, role: str) -> Path | None:
    """A local path, or a Hub id fetched with huggingface_hub (when online)."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if p.exists():
        return p
    if path.count("/") == 1 and not path.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return Path(
                snapshot_download(
                    path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]
                )
            )
        except Exception as e:  # offline, unknown repo, ...: one line, not a traceback
            raise DuetError(
                f"--{role} {path}: not a local path, and fetching it from the Hub failed "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            ) from None
    raise DuetError(f"--{role} {path}: no such file or directory")


def load_pair(
    target: str | None,
    draft: str | None,
    *,
    need_draft: bool,
    target_backend: str = "mlx",
    draft_backend: str | None = None,
    draft_threads: int = 1,
    provider: str = "cpu",
) -> Pair:
    """Load target (and draft when `need_draft`); the embedded pair when neither is given."""
    if target is None and draft is None:
        from runtime.assets import default_pair

        tdir, ddir = default_pair()
    elif target is None:
        raise DuetError(
            "--draft given without --target; pass both, or neither for the embedded pair"
        )
    else:
        tdir, ddir = resolve(target, "target"), resolve(draft, "draft")
    if need_draft and ddir is None:
        raise DuetError("this method needs a draft model: pass --draft PATH")
    t = load_model(tdir, target_backend)
    d = None
    settings = {"target_backend": target_backend}
    if need_draft:
        db = draft_backend or (
            "onnx" if backend_for_path(ddir) in ("mlx", "onnx") else backend_for_path(ddir)
        )
        kw = {"intra_threads": draft_threads, "provider": provider} if db == "onnx" else {}
        d = load_model(ddir, db, **kw)
        check_pair(tdir, ddir, t.config, d.config)
        settings.update(
            draft_backend=db,
            draft_threads=draft_threads if db == "onnx" else None,
            draft_provider=provider if db == "onnx" else None,
        )
    tok = Tokenizer(tdir) if (Path(tdir) / "tokenizer.json").is_file() else None
    return Pair(t, d, tok, Path(tdir), ddir, settings)
