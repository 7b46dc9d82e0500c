"""A migration of the example's state, for the transform-state job (`example.migrations:orders_as_order_count`).

Version 2 of `add_to_total` would count each customer's orders under the state key `order_count`
instead of `orders`: the migration renames those rows of the `totals` store, and the changelog
and a new snapshot carry the rename to every restore.
"""

import pandas as pd


def orders_as_order_count(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of `order_totals`' store `totals` with the state key `orders` renamed `order_count`."""
    return rows.assign(state_key=rows["state_key"].replace({"orders": "order_count"}))
