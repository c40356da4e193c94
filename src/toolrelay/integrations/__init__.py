"""Adapters that put a :class:`~toolrelay.Dispatcher`'s tools inside agent frameworks.

Each module needs its framework installed (one optional extra per framework):
``openai_agents`` (``toolrelay[openai-agents]``), ``pydantic_ai`` (``toolrelay[pydantic-ai]``)
and ``langchain`` (``toolrelay[langchain]``).
"""
