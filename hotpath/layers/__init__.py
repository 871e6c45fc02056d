"""Model building blocks; each layer's forward reads like the math and calls into hotpath.ops."""
