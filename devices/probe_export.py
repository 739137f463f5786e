"""The pair probe's in-memory figures (devices/probe_memo.py) as JSON entries and back:
devices/probe_store.py keeps them per pair and machine between processes.
"""

from __future__ import annotations

from devices import probe_memo as memo
from devices.pair_laws import RunLengths


def export_state(target, draft) -> list[dict]:
    """This pair's cached figures (stage times, windows, trial rates, pooled runs, α) as JSON
    entries for devices/probe_store.py: the models' ids in each key become "@target" and
    "@draft". An entry is the pair's when its key holds both."""
    marks = {id(target): "@target", id(draft): "@draft"}
    out = []
    for table, tab in ((memo.CACHE, "cache"), (memo.ALPHA, "alpha")):
        for key, value in table.items():
            if id(target) not in key or id(draft) not in key:
                continue
            k = [marks.get(x, x) if type(x) is int else x for x in key]
            if isinstance(value, RunLengths):
                v = {"runs": {"risk": value.risk.tolist(), "survived": value.survived.tolist()}}
            elif key[0] == "windows":
                v = {"by_gamma": {str(g): w for g, w in value.items()}}
            else:
                v = {"value": value}
            out.append({"table": tab, "key": k, **v})
    return out


KEPT = ", kept from "  # restore_state's note in a stage-times source


def restore_state(target, draft, entries: list[dict], note: str = "") -> int:
    """Put export_state's entries back, keyed by these models; an entry the process already
    holds stays (it is newer). Stage times' "source" gains `note`. Returns how many were put."""
    ids = {"@target": id(target), "@draft": id(draft)}
    put = 0
    for e in entries:
        key = tuple(tuple(x) if isinstance(x, list) else ids.get(x, x) for x in e["key"])
        table = memo.ALPHA if e["table"] == "alpha" else memo.CACHE
        if key in table:
            continue
        if "runs" in e:
            value = RunLengths()
            value.risk[:] = e["runs"]["risk"]
            value.survived[:] = e["runs"]["survived"]
        elif "by_gamma" in e:
            value = {int(g): w for g, w in e["by_gamma"].items()}
        else:
            value = e["value"]
            if isinstance(value, dict) and "source" in value and note:
                base = value["source"].split(KEPT)[0]  # an earlier restore's note goes
                value = dict(value, source=f"{base}{KEPT}{note}")
        table[key] = value
        put += 1
    return put
