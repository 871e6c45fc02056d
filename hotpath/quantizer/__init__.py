"""The quantizer behind `hotpath quantize`: writes a model's checkpoint quantized in one of the
published layouts (formats.py). fp8 streams tensor by tensor (fp8.py); AWQ (awq.py) and GPTQ
(gptq.py) calibrate layer by layer on a prompt set (calibration.py). Entry point: quantize.py."""
