"""Where a quantized model loses accuracy: per-layer SQNR, sensitivity and the stage waterfall
(the quantization report, ``python -m mdk.tools.quant_report``; docs/pipeline.md)."""
