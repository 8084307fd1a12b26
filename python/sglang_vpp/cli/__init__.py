"""The ``sglang-vpp`` command line (Typer). One module per command; ``app.py`` wires them."""
