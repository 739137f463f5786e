"""On-the-fly exports the engine asks for, supplied from the layer above (STYLE 11).

Given a checkpoint directory, the ONNX backends export it once into the directory's
`.duet/` cache (a draft's graph, a speculative-streaming draft's graph, an MTP head's step).
The exporters are converters/, which the engine must not import: importing the `converters`
package registers them here (converters/__init__.py), and every command does import it
(runtime/cli_args.py, runtime/api.py, apps/, devices/, the tests' conftest). A program that
drives the engine alone without `import converters` gets one line naming the export command.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.errors import DuetError

# kind -> exporter: "onnx" (model dir, out), "onnx-ss" (SS draft dir, out),
# "onnx-mtp" (target module, MTP head, out), "onnx-mtp-int8" (fp32 step, out, config)
EXPORTERS: dict[str, Callable] = {}


def register(kind: str, fn: Callable) -> None:
    """Make `fn` the exporter the engine calls for `kind`."""
    EXPORTERS[kind] = fn


def export(kind: str, *args, source=None, **kwargs):
    """Run the exporter registered for `kind`; one clear error when none is."""
    fn = EXPORTERS.get(kind)
    if fn is None:
        where = f"{source}: " if source is not None else ""
        raise DuetError(
            f"{where}this needs an on-the-fly {kind} export, which converters/ provides: "
            "`import converters` first, or export it with `python -m converters export`"
        )
    return fn(*args, **kwargs)
