"""The example configurations and the demo scenario, installed as ``cellcal.examples``.

Data only: pyproject.toml maps this folder to ``cellcal.examples`` and ships its ``*.toml``;
``cellcal.daemon.examples.example_path`` finds them.
"""
