"""The training subcommands take their loop flags from one place (apps/train/args.py)."""

import importlib
import re
from pathlib import Path

import pytest

from apps.train.__main__ import SUBCOMMANDS
from apps.train.args import LOOP_FLAGS, REQUIRED, add_loop_args, loop_help

TRAIN = Path(__file__).resolve().parents[1] / "apps" / "train"
# the training commands: `python -m apps.train` itself and the subcommands that run the loop
COMMANDS = ["__main__"] + [m for m, _ in SUBCOMMANDS.values() if m not in ("bins", "gather_corpus")]


def _loop_actions(module):
    ap = module.build_parser()
    return [a for a in ap._actions if a.dest in LOOP_FLAGS]


@pytest.mark.parametrize("name", COMMANDS)
def test_loop_flags_come_from_add_loop_args(name):
    module = importlib.import_module(f"apps.train.{name}")
    actions = _loop_actions(module)
    assert {a.dest for a in actions} >= {"threads"}  # every training command has a few
    helps = getattr(module, "HELPS", None)
    for a in actions:
        flag = LOOP_FLAGS[a.dest]
        assert a.option_strings == ["--" + a.dest.replace("_", "-")]
        assert a.help == loop_help(a.dest, a.default, helps), (name, a.dest)
        if "type" in flag.kind:
            assert a.type is flag.kind["type"], (name, a.dest)
        if "choices" in flag.kind:
            assert list(a.choices) == flag.kind["choices"], (name, a.dest)
    # and no module spells a loop flag itself
    declared = re.findall(r'add_argument\(\s*"(--[a-z-]+)"', (TRAIN / f"{name}.py").read_text())
    spelled = {"--" + d.replace("_", "-") for d in LOOP_FLAGS} & set(declared)
    assert not spelled, f"{name}.py declares {sorted(spelled)} itself; use add_loop_args"


def test_every_subcommand_has_help_and_a_module():
    for module, text in SUBCOMMANDS.values():
        assert text and importlib.import_module(f"apps.train.{module}").main


def test_add_loop_args_keeps_order_defaults_and_help():
    import argparse

    ap = argparse.ArgumentParser()
    add_loop_args(ap, out=REQUIRED, steps=None, lr=2e-3, fresh=False, helps={"out": "dir"})
    acts = {a.dest: a for a in ap._actions}
    assert [a.dest for a in ap._actions][1:] == ["out", "steps", "lr", "fresh"]
    assert acts["out"].required and acts["out"].help == "dir"
    assert acts["steps"].help == "planned steps (default: as many as --time-budget-min allows)"
    assert acts["lr"].default == 2e-3 and acts["lr"].help == "peak learning rate (default 2e-3)"
    assert ap.parse_args(["--out", "o", "--fresh"]).fresh is True
    with pytest.raises(TypeError):
        add_loop_args(ap, epochs=3)
