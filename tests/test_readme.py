"""The README and docs/: every link stays inside the clone, the quick start is two commands,
and CI runs the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_link_is_a_file_in_the_clone():
    for doc in docs():
        for target in LINK.findall(doc.read_text()):
            assert not re.match(r"[a-z]+://", target), f"{doc.name}: {target} leaves the clone"
            path = (doc.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), f"{doc.name}: {target}"
        assert "shared/" not in doc.read_text(), f"{doc.name} points outside the repository"


def quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [ln for ln in block.splitlines() if ln.strip()]


def test_the_quick_start_is_two_commands_and_ci_runs_the_second():
    first, second = quick_start()
    assert first.startswith("pip install -e . && python -m runtime.generate")
    install, run = second.split(" && ")
    ci = (ROOT / ".ci" / "run").read_text()
    assert install.replace("pip install -e", "pip install -q -e") in ci
    assert re.search(rf"^{re.escape(run)}$", ci, re.M), "CI must run the README's test command"


def test_the_readme_holds_no_measurements():
    text = (ROOT / "README.md").read_text()
    assert not re.search(r"\d+(\.\d+)? ?tok/s", text), "measured figures go to docs/benchmarks.md"


def test_the_server_usage_lists_every_method_its_help_offers():
    from apps.server.__main__ import build_parser

    usage = (ROOT / "docs" / "serving.md").read_text()
    listed = re.search(r"--method ([a-z|]+)", usage).group(1).split("|")
    offered = next(a.choices for a in build_parser()._actions if a.dest == "method")
    assert listed == list(offered)
