"""NKI kernels for the training step (one file per kernel); see kernels/README.md."""
