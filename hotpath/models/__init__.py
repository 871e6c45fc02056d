"""Model definitions; `registry.get_model_class` maps an HF architecture name to one."""
