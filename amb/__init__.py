"""The command-line layer: one module per command group, assembled in ``amb.main``.

Nothing imports this package; it imports everything else.
"""
