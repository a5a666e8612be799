"""The ``schedtui`` command line: the parser and ``serve`` in ``main``, one module per verb group."""
