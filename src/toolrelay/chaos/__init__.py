"""Chaos engineering: a misbehaving stand-in upstream, and experiments that use it."""
