"""The runtime layer: model, optimizers, trainer, checkpoints, devices, kernel dispatch.

A submission carries this package, so it may import only the standard library, torch,
numpy and the trusted ``prepare`` module. Never import typer, rich, pydantic or yaml here.
"""
