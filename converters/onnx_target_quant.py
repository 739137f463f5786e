"""A target graph's MatMuls as ONNX Runtime's MatMulNBits, by the recipe
(runtime/backends/onnx/target.recipe): the whole graph at once after a float build
(converters/onnx_target_export.py), or one MatMul at a time as a GGUF's graph is built
(converters/gguf_target.py). Why each weight gets the bits it gets: onnx_target_export's
docstring."""

from __future__ import annotations

from runtime.backends.onnx.target import HEAD_ACCURACY_LEVEL


def quantize_graph(model, rec: dict, gguf: bool = False):
    """MatMulNBits over every MatMul with a constant weight (onnxruntime.quantization). Under
    int4 with `gguf` (the weights dequantized from a GGUF), a weight off every 4-bit grid was
    stored at more bits there, and keeps 8 (recipe `gguf_finer`)."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    from converters.onnx_head_split import one_matmul8, split_matmul
    from converters.onnx_target_graph import HEAD_NODE

    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    bits, block, level = rec["bits"], rec["block_size"], rec["accuracy_level"]
    if bits == 4:
        from converters.onnx_grid_q4 import keep_grids

        head8 = rec.get("head_bits") == 8 and any(n.name == HEAD_NODE for n in model.graph.node)
        keep = keep_grids(model, block, level, {HEAD_NODE}) if rec.get("grid") else []
        finer = []
        if gguf and rec.get("gguf_finer"):
            consts = {i.name for i in model.graph.initializer}
            finer = [
                n.name
                for n in model.graph.node
                if n.op_type == "MatMul"
                and n.input[1] in consts
                and n.name not in (*keep, HEAD_NODE)
            ]
        algo = DefaultWeightOnlyQuantConfig(
            block_size=block, is_symmetric=rec["symmetric"], accuracy_level=level, bits=4
        )
        q = MatMulNBitsQuantizer(
            model,
            bits=4,
            block_size=block,
            is_symmetric=rec["symmetric"],
            accuracy_level=level,
            algo_config=algo,
            nodes_to_exclude=keep + finer + ([HEAD_NODE] if head8 else []),
        )
        q.process()
        model = q.model.model
        eight = finer + ([HEAD_NODE] if head8 else [])
    else:  # every weight at 8 bits
        consts = {i.name for i in model.graph.initializer}
        eight = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in consts]
    one = rec.get("int8_as", "").startswith("one")  # a VNNI CPU (converters/onnx_head_split.py)
    for name in eight:  # fast and unclippable
        (one_matmul8 if one else split_matmul)(
            model, name, block, HEAD_ACCURACY_LEVEL if name == HEAD_NODE else level
        )
    return model
