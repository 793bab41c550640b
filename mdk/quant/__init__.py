"""Chip quantization (the contract: docs/pipeline.md). Import the submodules directly; this package stays import-light.

- ``layers``: ChipConv, the one chip layer (flags: quant_weight, quant_act, observer; buffers cap, fused)
- ``rounding``: round half away from zero
- ``weights``: CHIP_BITS, chip_bits, compute_shift, quantize_conv (STE), conv_mantissas
- ``activation``: quantize_activation (5-bit, STE)
- ``calibrate``: the calibration methods (observers), finalize_caps, save_caps / load_caps
- ``bn_fold``: fold_bn;  ``fusion``: fuse_gains, is_fused;  ``modes``: apply_mode (QuantMode: stage_config)
- ``chip_model``: ChipModel, chip_model_from, save/load_chip_model;  ``export``: export_chip_model, ONNX
- ``integer_ref``: integer-only reference forward and the exactness check
- ``gti_sdk``: the GTI SDK hand-off files (filter/bias text, layer-spec and model JSON)
"""
