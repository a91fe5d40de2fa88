"""The HTTP server over ortinf's tasks: the OpenAI-, Anthropic- and Ollama-compatible front-ends (api/), each served
package a ServedModel (models.py), and the app, its middleware, metrics and Ray deployment around them."""
