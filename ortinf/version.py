"""ortinf's version: one home, read by the package (`ortinf.__version__`), the CLI (`--version`), the server's
/version and its system fingerprint, and an export's record of what made it. pyproject.toml reads it from here."""

__version__ = "0.1.0"
