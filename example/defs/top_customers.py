"""The top customers by total: a report computed from the latest snapshot of `order_totals`' store `totals`.

The asset takes the store's snapshot asset as an input and receives its decoded table (a pandas
DataFrame, as the input is annotated): one row per customer and state key, `total` and `orders`.
Materialize the snapshot (the `order_totals__snapshots` assets, or the daily compaction) first.
"""

import pandas as pd
from dagster import AssetIn, AssetKey, AssetsDefinition, MaterializeResult, MetadataValue, asset

from dagster_stateful.naming import snapshot_key
from example.apps import order_totals

TOP = 10


def top_customers_by_total(totals: pd.DataFrame, count: int = TOP) -> pd.DataFrame:
    """The `count` customers with the largest totals (ties by name), with their totals and order counts."""
    wide = totals.pivot(index="key", columns="state_key", values="value").reset_index()
    wide = wide.rename(columns={"key": "customer"}).astype({"orders": "int64"})
    ranked = wide.sort_values(["total", "customer"], ascending=[False, True]).head(count)
    return ranked[["customer", "total", "orders"]].reset_index(drop=True)


def top_customers_asset(snapshot: AssetKey, count: int = TOP) -> AssetsDefinition:
    """The report as an asset downstream of the snapshot asset `snapshot` (a store kept as `add_to_total` keeps it)."""

    @asset(
        name="top_customers",
        key_prefix=snapshot.path[:-1],
        group_name=snapshot.path[0],
        ins={"totals": AssetIn(snapshot)},
        kinds={"pandas"},
        description=f"The {count} customers with the largest order totals, from the latest snapshot of the totals.",
    )
    def top_customers(totals: pd.DataFrame) -> MaterializeResult:
        report = top_customers_by_total(totals, count)
        return MaterializeResult(
            metadata={
                "dagster/row_count": len(report),
                "customers": len(totals["key"].unique()),
                "top_customers": MetadataValue.md(report.to_markdown(index=False, floatfmt=".2f")),
                "report": MetadataValue.json(report.to_dict(orient="records")),
            }
        )

    return top_customers


top_customers = top_customers_asset(snapshot_key(order_totals, "totals"))
