"""Helpers the tests share (tiny models, engine and server runners, fault injection): a package, imported as
`support.<module>` (pytest puts tests/ on the path through its root conftest), never by sys.path edits."""
