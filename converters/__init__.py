"""Checkpoints into what each device runs (ONNX, Core ML, quantized MLX), with parity checks.

Importing the package registers the on-the-fly exporters the engine asks for when it is given
a checkpoint directory for an ONNX backend (runtime/backends/exporters.py): the engine never
imports converters/, the commands do (STYLE 11). Each exporter imports its module on first use.
"""

from runtime.backends.exporters import register


def _onnx(model_dir, out):
    from converters.onnx_export import export_onnx

    return export_onnx(model_dir, out)


def _onnx_ss(model_dir, out):
    from converters.onnx_ss_export import export_ss_onnx

    return export_ss_onnx(model_dir, out)


def _onnx_mtp(target_module, head, out):
    from converters.onnx_mtp import export_mtp_onnx

    return export_mtp_onnx(target_module, head, out)


def _onnx_mtp_int8(src, out, cfg):
    from converters.onnx_mtp import quantize_mtp_onnx

    return quantize_mtp_onnx(src, out, cfg)


def _onnx_target(model_dir, out, start, stop, head, quantize, taps=()):
    from converters.onnx_target_export import export_target_part

    return export_target_part(model_dir, out, start, stop, head, quantize, taps=taps)


def _onnx_eagle(target_module, head, folder, quant):
    from converters.onnx_eagle import export_eagle_onnx

    return export_eagle_onnx(target_module, head, folder, quant)


register("onnx", _onnx)
register("onnx-target", _onnx_target)
register("onnx-ss", _onnx_ss)
register("onnx-mtp", _onnx_mtp)
register("onnx-eagle", _onnx_eagle)
register("onnx-mtp-int8", _onnx_mtp_int8)
