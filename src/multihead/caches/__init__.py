"""Every cache kind: the keys and values a decoding layer keeps between steps."""
