"""Models handed to ckcheck.run() in this process, by key, as factories --model can name."""

_factories = {}


def add(factory) -> str:
    key = f"m{len(_factories) + 1}"
    _factories[key] = factory
    globals()[key] = factory
    return f"ckcheck._registry:{key}"


def remove(spec: str) -> None:
    key = spec.rpartition(":")[2]
    _factories.pop(key, None)
    globals().pop(key, None)
