"""What a converted `.mlpackage` declares, read from its spec (works on any OS).

`describe` flattens the protobuf into plain data; `check_structure` is the
structure half of Core ML parity: the functions, states, deployment target and
tensor names/shapes the runtime and the companion app rely on.
"""

from __future__ import annotations

import json
from pathlib import Path

from runtime.errors import DuetError

# Core ML specification version 9 is what iOS 18 / macOS 15 (and state) require.
SPEC_VERSION_IOS18 = 9
_DTYPES = {65552: "float16", 65568: "float32", 131104: "int32", 65600: "float64"}


def _array(t) -> dict:
    a = t.multiArrayType if t.HasField("multiArrayType") else t.stateType.arrayType
    return {"shape": [int(s) for s in a.shape], "dtype": _DTYPES.get(a.dataType, str(a.dataType))}


def describe(package: str | Path) -> dict:
    """Functions (inputs/outputs/states with shapes), default function, spec version, report."""
    import coremltools as ct

    p = Path(package)
    if not (p / "Manifest.json").is_file():
        raise DuetError(f"{p}: not a Core ML package (no Manifest.json)")
    spec = ct.utils.load_spec(str(p))
    d = spec.description
    funcs = {}
    for f in d.functions:
        funcs[f.name] = {
            "inputs": {i.name: _array(i.type) for i in f.input},
            "outputs": {o.name: _array(o.type) for o in f.output},
            "states": {s.name: _array(s.type) for s in f.state},
        }
    meta = dict(d.metadata.userDefined)
    return {
        "spec_version": int(spec.specificationVersion),
        "default_function": d.defaultFunctionName,
        "functions": funcs,
        "report": json.loads(meta["duet.report"]) if "duet.report" in meta else None,
    }


def check_structure(desc: dict) -> list[str]:
    """Problems (empty when sound) with a Duet draft package's declared structure."""
    problems = []
    if desc["spec_version"] < SPEC_VERSION_IOS18:
        problems.append(
            f"spec version {desc['spec_version']} < {SPEC_VERSION_IOS18} (iOS 18 / macOS 15)"
        )
    funcs = desc["functions"]
    if set(funcs) != {"prefill", "decode"}:
        problems.append(f"functions {sorted(funcs)}, expected ['decode', 'prefill']")
        return problems
    report = desc["report"] or {}
    stateful = report.get("flavour", "stateful") == "stateful"
    for name, f in funcs.items():
        length = f["inputs"].get("input_ids", {}).get("shape", [None, None])[1]
        want_in = {"input_ids", "position_ids", "cache_offset", "attention_mask"}
        if not stateful:
            want_in |= {"k_cache", "v_cache"}
        if set(f["inputs"]) != want_in:
            problems.append(f"{name}: inputs {sorted(f['inputs'])}, expected {sorted(want_in)}")
            continue
        if name == "decode" and length != 1:
            problems.append(f"decode: query length {length}, expected 1")
        cache = f["states"] if stateful else {k: f["inputs"][k] for k in ("k_cache", "v_cache")}
        if set(cache) != {"k_cache", "v_cache"}:
            problems.append(f"{name}: cache tensors {sorted(cache)}, expected k_cache and v_cache")
            continue
        s = cache["k_cache"]["shape"][2]
        if s % 32:
            problems.append(f"{name}: cache length {s} is not a multiple of 32")
        if f["inputs"]["attention_mask"]["shape"] != [1, 1, length, s]:
            problems.append(
                f"{name}: attention_mask {f['inputs']['attention_mask']['shape']} "
                f"!= [1, 1, {length}, {s}]"
            )
        if any(c["dtype"] != "float16" for c in cache.values()):
            problems.append(f"{name}: cache is not float16")
        logits = f["outputs"].get("logits", {}).get("shape")
        if not logits or logits[:2] != [1, length]:
            problems.append(f"{name}: logits shape {logits}, expected [1, {length}, V]")
    return problems
