"""Every command that takes a decoding method takes the same method flags (runtime/
cli_args_methods.py's add_method_args, made from the methods' Options): the same names, dests,
defaults, types, choices and help, so a flag cannot drift between generate, chat, server,
bench and profile again."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from runtime.cli_args_methods import method_flags
from runtime.decoding import METHODS, method_module, method_options
from runtime.decoding.flags import is_flag
from runtime.errors import DuetError


def parsers() -> dict[str, argparse.ArgumentParser]:
    from apps.bench.__main__ import build_parser as bench
    from apps.profile.__main__ import build_parser as profile
    from apps.server.__main__ import build_parser as server
    from runtime.chat import build_parser as chat
    from runtime.generate import build_parser as generate

    return {
        "generate": generate(),
        "chat": chat(),
        "server": server(),
        "bench": bench(),
        "profile": profile(),
    }


def method_actions(ap: argparse.ArgumentParser) -> dict[str, tuple]:
    """flag -> (dest, default, type, choices, help) of the method flags (and --gamma)."""
    names = {"--gamma"} | {f"--{n.replace('_', '-')}" for n in method_flags()}
    out = {}
    for act in ap._actions:
        for opt in act.option_strings:
            if opt in names:
                out[opt] = (act.dest, act.default, act.type, act.choices, act.help)
    return out


def test_every_command_takes_the_same_method_flags():
    got = {name: method_actions(ap) for name, ap in parsers().items()}
    want = got["generate"]
    assert {
        "--gamma",
        "--kappa",
        "--exit-layer",
        "--tree-k",
        "--expand",
        "--top-n",
        "--depth",
        "--bins",
        "--exit-head",
        "--branches",
        "--draft-branches",
    } <= set(want)
    for name, flags in got.items():
        assert flags == want, name


def test_a_flags_default_is_its_methods_default():
    """--kappa defaults to mirror's κ (8) everywhere; tree's flags to tree's Options."""
    ap = parsers()["bench"]
    a = ap.parse_args([])
    for m in METHODS:
        for f in fields(method_module(m).Options):
            if is_flag(f):
                assert getattr(a, f.name) == f.default, (m, f.name)
    assert a.kappa == 8 and a.tree_k == 2 and a.gamma is None


def test_flags_are_grouped_by_the_methods_that_take_them():
    ap = parsers()["generate"]
    titles = {g.title: {a.dest for a in g._group_actions} for g in ap._action_groups}
    assert titles["--method tree / heterospec"] == {"tree_k", "top_n", "depth", "expand"}
    assert titles["--method heterospec"] == {"bins"}
    assert "kappa" in titles["--method mirror"]
    assert "server" in titles["edge-cloud (--method flexspec)"]  # the edge flags: their own group


@pytest.mark.parametrize(
    "method,options,needle",
    [
        ("sd", {"gamma": 0}, "--gamma must be at least 1 for --method sd"),
        ("mirror", {"gamma": 0}, "--gamma must be at least 1 for --method mirror"),
        ("mirror", {"kappa": 0}, "--kappa must be at least 1"),
        ("mirror", {"draft_branches": 99}, "--draft-branches must be in 0..32"),
        ("tree", {"depth": 0}, "--depth must be at least 1"),
        ("heterospec", {"top_n": 0}, "--top-n must be at least 1"),
        ("flexspec", {"k_max": 0}, "--k-max must be at least 1"),
    ],
)
def test_each_method_checks_its_own_options(method, options, needle):
    mod = method_module(method)
    mod.check(method_options(method))  # the defaults pass
    with pytest.raises(DuetError, match=needle.replace(".", r"\.")):
        mod.check(method_options(method, **options))


def test_one_gamma_rule_for_every_command(capsys):
    """γ ≥ 1 is one function (runtime/arg_rules.py): each command words it the same."""
    from apps.server.__main__ import check_args as server_check
    from runtime.generate import check_args as generate_check

    for check, ap in ((generate_check, parsers()["generate"]), (server_check, parsers()["server"])):
        a = ap.parse_args(
            ["--method", "sd", "--gamma", "0"]
            + (["--prompt", "x"] if check is generate_check else [])
        )
        with pytest.raises(DuetError, match="--gamma must be at least 1 for --method sd"):
            check(a)
