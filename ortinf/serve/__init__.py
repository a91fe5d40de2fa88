"""The OpenAI-compatible server (issue 4)."""
