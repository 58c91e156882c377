"""Kinds of target beyond a plain module: functions, token-sparse functions, MLA, KV-cache modules."""
