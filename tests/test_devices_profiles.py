"""Every shipped profile loads and validates; malformed ones are refused naming file and field."""

import copy
import re
import tomllib

import pytest

from devices.latency import per_token_time
from devices.model_sizes import model_size
from devices.profile import (
    LATENCY_FIELDS,
    ProfileError,
    load_all,
    load_profile,
    profile_names,
    read_profile_file,
)
from devices.profile_toml import dumps_toml

REQUIRED = {
    "m1",
    "m2",
    "m3",
    "m4",
    "m1-max",
    "m3-max",
    "m4-max",
    "m2-ultra",
    "a17-pro",
    "snapdragon-8-gen-3",
    "jetson-agx-orin",
    "raspberry-pi-5",
    "a800",
    "h800",
    "v100",
}


def test_all_shipped_profiles_validate():
    profiles = load_all()
    names = {p.name for p in profiles}
    assert len(profiles) >= 13
    assert REQUIRED <= names, REQUIRED - names
    for p in profiles:
        assert set(p.latency) == set(LATENCY_FIELDS)
        assert all(len(s) > 10 for s in p.sources().values()), p.name
        bw, _ = p.hardware("draft")
        assert bw > 0
        assert p.hardware("target")[0] > 0


def test_every_source_is_a_url_a_paper_a_derivation_or_a_calibration():
    pat = re.compile(
        r"https?://|FlexSpec|Mirror-SD|CU-HLM|^derived:|^roofline:|^calibrated on"
        r"|^the remote target"
    )
    for p in load_all():
        for field, src in p.sources().items():
            if src.startswith("unpublished:") or field == "count" and p.count.value == 1:
                continue
            assert pat.search(src), f"{p.name} {field}: {src}"


def test_roofline_figures_match_the_code():
    """A 'roofline:' alpha_edge was computed by devices.latency: recompute it from the profile."""
    checked = 0
    for p in load_all():
        f = p.latency["alpha_edge"]
        if f.source.startswith("roofline:"):
            bw, peak = p.hardware("draft")
            want = per_token_time(model_size(p.reference_draft), bw, peak)
            assert f.si == pytest.approx(want, rel=1e-3), p.name
            checked += 1
    assert checked >= 10


def _write(tmp_path, data, name="bad"):
    f = tmp_path / f"{name}.toml"
    f.write_text(dumps_toml(data))
    return f


def test_dump_round_trips(tmp_path):
    raw = load_profile("m3-max").raw
    f = _write(tmp_path, raw, "m3-max-copy")
    assert tomllib.loads(f.read_text()) == raw
    assert read_profile_file(f).latency == load_profile("m3-max").latency


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["memory"]["bandwidth"].pop("source"), "memory.bandwidth"),
        (lambda d: d["memory"]["bandwidth"].update(unit="MB/s"), "memory.bandwidth"),
        (lambda d: d["latency"].pop("t_rv"), "latency.t_rv"),
        (lambda d: d["latency"]["beta"].update(value=-1.0), "latency.beta"),
        (lambda d: d["draft"].update(accelerator="tpu"), "draft.accelerator"),
        (lambda d: d["draft"].update(provider="qnn"), "draft.provider"),
        (lambda d: d.update(kind="phone"), "kind"),
        (lambda d: d["accelerators"]["gpu"].pop("peak"), "accelerators.gpu.peak"),
    ],
)
def test_malformed_profile_is_refused_with_file_and_field(tmp_path, mutate, field):
    data = copy.deepcopy(load_profile("m3-max").raw)
    mutate(data)
    f = _write(tmp_path, data)
    with pytest.raises(ProfileError) as e:
        read_profile_file(f)
    msg = str(e.value)
    assert str(f) in msg and f"'{field}'" in msg and "\n" not in msg


def test_not_toml_and_unknown_name(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text("name = [unclosed")
    with pytest.raises(ProfileError, match="not valid TOML"):
        read_profile_file(f)
    with pytest.raises(Exception, match="unknown device profile 'nope'"):
        load_profile("nope")
    assert "m3-max" in profile_names()
