"""The backend interface the console and the CLI use, its embedded and remote
implementations, and ``connect()`` for scripts and web apps."""
