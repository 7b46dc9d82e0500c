"""The checks sensor: evaluates the automation conditions of an app's asset checks and launches them.

Owns the sensor factory. With a `check_cron`, each changelog and snapshot check of the app carries
an automation condition (`checks.stateful_checks`: the cron's ticks and each materialization of
the asset it checks, unless it is running already); this Dagster automation-condition sensor
evaluates them, so the checks never stay "Not evaluated".
"""

from dagster import AssetChecksDefinition, AssetSelection, AutomationConditionSensorDefinition, DefaultSensorStatus

from dagster_stateful.core.app import App
from dagster_stateful.naming import job_name


def checks_sensor(
    app: App, checks: list[AssetChecksDefinition], default_status: DefaultSensorStatus
) -> AutomationConditionSensorDefinition:
    """The sensor that evaluates the automation conditions of `app`'s checks (and launches them)."""
    return AutomationConditionSensorDefinition(
        job_name(app, "checks_sensor"),
        target=AssetSelection.checks(*checks),
        default_status=default_status,
        description=f"Evaluates the checks of app `{app.name}` on their schedule.",
    )
