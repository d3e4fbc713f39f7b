"""A tiny inventory module: the code the demo's review loop looks at."""


def add_item(stock, name, count=1):
    """Adds `count` of `name` to `stock` and returns the new count."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}; pass 1 or more")
    stock[name] = stock.get(name, 0) + count
    return stock[name]


def remove_item(stock, name, count=1):
    """Removes `count` of `name`; refuses to go below zero."""
    have = stock.get(name, 0)
    if count > have:
        raise ValueError(f"only {have} of {name!r} in stock; remove at most {have}")
    stock[name] = have - count
    return stock[name]


def total(stock):
    """Returns how many items there are in all (0 for an empty stock)."""
    return sum(stock.values())
