"""Quantized linear layers: one file per format (fp8_block.py, fp8_channel.py, awq.py, gptq.py),
the interface they share (base.py), and the detection of a checkpoint's format (detect.py).

Importing this package imports only base.py (Linear reads it); import the formats from their files.
"""
