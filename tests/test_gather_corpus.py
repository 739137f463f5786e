"""`python -m apps.train gather-corpus`: what it copies, what it skips, and its refusals."""

from pathlib import Path

from apps.train import gather_corpus


def make_tree(root: Path) -> None:
    for rel, size in {
        "a.py": 10,
        "sub/b.py": 20,
        "tests/t.py": 5,
        "big.py": 400_000,
        "notes.txt": 7,
        "__pycache__/c.py": 3,
    }.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x" * size)


def test_copies_python_source_and_skips_tests_caches_and_big_files(tmp_path):
    src = tmp_path / "pkg"
    make_tree(src)
    per_root = gather_corpus.gather(tmp_path / "out", [src], cap_bytes=1e6)
    got = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.*"))
    assert got == ["pkg/a.py", "pkg/sub/b.py"]
    assert per_root == {"pkg": 30}


def test_cap_stops_adding_files(tmp_path):
    src = tmp_path / "pkg"
    make_tree(src)
    assert gather_corpus.gather(tmp_path / "out", [src], cap_bytes=15) == {"pkg": 10}


def test_refusals_are_one_line_and_exit_2(tmp_path, capsys):
    assert gather_corpus.main(["--out", str(tmp_path / "o"), "--packages", "no_such_pkg_xyz"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not installed" in err[0]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    assert gather_corpus.main(["--out", str(tmp_path / "full"), "--packages", ""]) == 2
    assert "not empty" in capsys.readouterr().err
