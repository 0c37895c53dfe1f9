"""OpenAI-compatible HTTP serving: durable video jobs over the AsyncEngine (FastAPI + uvicorn)."""
