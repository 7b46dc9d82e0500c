"""What `dg scaffold defs dagster_stateful.StatefulAppComponent <name>` writes: a `defs.yaml` and an app.

Owns `StatefulAppScaffolder`: in the new folder, an `apps.py` holding one app with one stateful
step (it counts the messages of each key) and a `defs.yaml` naming it, with every setting a
deployment usually changes (secrets as `{env: NAME}`), ready for `dg check defs` as written. The
folder's name gives the app's Python name and its name in Kafka.
"""

from __future__ import annotations

import re

from dagster.components import Scaffolder, ScaffoldRequest, scaffold_component

__all__ = ["StatefulAppScaffolder"]


class StatefulAppScaffolder(Scaffolder):
    """`dg scaffold defs dagster_stateful.StatefulAppComponent <name>`: a `defs.yaml` and `apps.py`
    holding one app with one stateful step, ready for `dg check defs`."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        attribute, app_name = _scaffold_names(request.target_path.name)
        (request.target_path / "apps.py").write_text(_APP_MODULE.format(attribute=attribute, app_name=app_name))
        if request.scaffold_format == "yaml":
            yaml = _DEFS_YAML.format(type_name=request.type_name, attribute=attribute)
            (request.target_path / "defs.yaml").write_text(yaml)
        else:
            scaffold_component(request)


def _scaffold_names(folder: str) -> tuple[str, str]:
    """The Python attribute and the app name (its consumer group) a scaffolded folder gets."""
    attribute = re.sub(r"\W+", "_", folder).strip("_").lower() or "app"
    if attribute[0].isdigit():
        attribute = f"app_{attribute}"
    return attribute, attribute.replace("_", "-")


_APP_MODULE = '''\
"""The stateful app of this component, with one stateful step: it counts the messages of each key
on the topic `{app_name}-input` and sends the counts to `{app_name}-counts`.

`defs.yaml` names `{attribute}` below; write your steps here (see dagster_stateful's docs/apps.md,
"An app, end to end").
"""

from dagster_stateful.core import App, State


def count_per_key(message: dict, state: State) -> dict:
    """A stateful step: `state` holds this message key's values only."""
    count = state.get("count", 0) + 1
    state.set("count", count)
    return {{"count": count, "last": message}}


{attribute} = App(
    name="{app_name}",
    source="{app_name}-input",
    stores=["counts"],
    output="{app_name}-counts",
)
{attribute}.to_topic({attribute}.dataframe().apply(count_per_key, stateful=True, store="counts"))
'''

_DEFS_YAML = """\
type: {type_name}

attributes:
  # The App(s) this component runs: `module:attribute`, or a list of them ('.' = this folder).
  app: .apps:{attribute}
  # The source topic's partition count (or a map topic -> count); a check verifies it.
  source_partitions: 1
  kafka:
    # Secrets only as `{{env: NAME}}` (Dagster's EnvVar, read when a run starts, never shown in the UI).
    bootstrap_servers: {{env: KAFKA_BOOTSTRAP_SERVERS}}
    # security_protocol: SASL_SSL
    # sasl_mechanism: SCRAM-SHA-512
    # sasl_username: {{env: KAFKA_USER}}
    # sasl_password: {{env: KAFKA_PASSWORD}}
  state_store:
    state_dir: "{{{{ env('DAGSTER_STATEFUL_STATE_DIR', '.dagster-stateful/state') }}}}"
    # snapshot_root: s3a://bucket/snapshots
  worker_every_minutes: 5
  automation_running: false
  lag_threshold: 1000
  # pool_size: 1
  # standby_replicas: 1
  # checks: {{check_cron: "*/10 * * * *", max_changelog_lag: 100000}}
  # snapshots: {{compaction_cron: "0 3 * * *", max_snapshot_age_hours: 48}}
"""
