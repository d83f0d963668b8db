"""The kustomize overlays render, pass the Kubernetes schema, and are wired to their config."""

from __future__ import annotations

import re

import pytest
import yaml
from kubernetes_validate import SchemaNotFoundError, validate

from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.process import io_handler
from agentkernel.pipeline.transport.nats.owners import lease_seconds
from tests.deploy import artifacts as a

KUBERNETES_VERSION = "1.30.0"  # oldest minor still in the providers' support windows
CORE_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ConfigMap",
    "Service",
    "Deployment",
    "PodDisruptionBudget",
    "NetworkPolicy",
}
KEDA = "keda.sh/v1alpha1"


def config(overlay: str, tmp_path) -> AKConfig:
    path = tmp_path / "config.yaml"
    path.write_text(a.overlay_config_text(overlay))
    return AKConfig.load(path)


@pytest.mark.parametrize("overlay", a.OVERLAYS)
def test_core_objects_pass_the_strict_schema(overlay: str) -> None:
    kinds = set()
    for obj in a.rendered(overlay):
        if obj["apiVersion"].startswith(("keda.sh/", "jetstream.nats.io/")):
            with pytest.raises(SchemaNotFoundError):
                validate(obj, KUBERNETES_VERSION, strict=True)
            continue
        validate(obj, KUBERNETES_VERSION, strict=True)
        kinds.add(obj["kind"])
    assert kinds == CORE_KINDS


def test_the_schema_check_catches_a_wrong_field() -> None:
    deployment = yaml.safe_load(yaml.safe_dump(a.objects("sqs", "Deployment")["agentkernel-io"]))
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(Exception, match="terminationGracePeriod"):
        validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", a.OVERLAYS)
def test_selectors_match_their_pods(overlay: str) -> None:
    deployments = a.objects(overlay, "Deployment")
    labels = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments.items()}
    for name, d in deployments.items():
        assert d["spec"]["selector"]["matchLabels"].items() <= labels[name].items()
    service = a.objects(overlay, "Service")["agentkernel-io"]
    assert service["spec"]["selector"].items() <= labels["agentkernel-io"].items()
    for pdb in a.objects(overlay, "PodDisruptionBudget").values():
        assert (
            pdb["spec"]["selector"]["matchLabels"].items()
            <= labels[pdb["metadata"]["name"]].items()
        )
    for policy in a.objects(overlay, "NetworkPolicy").values():
        target = policy["spec"]["podSelector"]["matchLabels"]
        assert target.items() <= labels[policy["metadata"]["name"]].items()


@pytest.mark.parametrize("overlay", a.OVERLAYS)
def test_io_probes_use_the_apis_health_and_ready_routes(overlay: str, tmp_path) -> None:
    io = a.objects(overlay, "Deployment")["agentkernel-io"]["spec"]["template"]["spec"]
    container = io["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert int(env["AK_API__PORT"]) == port
    policy = a.objects(overlay, "NetworkPolicy")["agentkernel-io"]
    assert policy["spec"]["ingress"][0]["ports"][0]["port"] == port


def fetch_wait_seconds(config: AKConfig) -> float:
    """How long a stopping consumer thread may still sit in one fetch (consumer.py)."""
    if config.execution.queues.type == "sqs":
        assert config.execution.queues.sqs is not None
        return config.execution.queues.sqs.wait_time_seconds  # SQS slices waits by long poll
    return 1.0  # ConsumerLoop's default slice for transports without their own


@pytest.mark.parametrize("overlay", a.OVERLAYS)
def test_termination_grace_exceeds_the_drain(overlay: str, tmp_path) -> None:
    cfg = config(overlay, tmp_path)
    deployments = a.objects(overlay, "Deployment")
    runner = deployments["agentkernel-runner"]
    max_turn = float(runner["metadata"]["annotations"]["agentkernel/max-turn-seconds"])
    grace = runner["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > max_turn + fetch_wait_seconds(cfg)
    io = deployments["agentkernel-io"]["spec"]["template"]["spec"]
    pre_stop = float(io["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    io_drain = (
        pre_stop
        + fetch_wait_seconds(cfg)
        + io_handler.OUTPUT_DRAIN_SECONDS
        + io_handler.HTTP_DRAIN_SECONDS
        + io_handler.LISTENER_DRAIN_SECONDS
    )
    assert io["terminationGracePeriodSeconds"] > io_drain


@pytest.mark.parametrize("overlay", a.OVERLAYS)
def test_one_scaled_object_targets_the_runner(overlay: str) -> None:
    scaled = [o for o in a.rendered(overlay) if o["kind"] == "ScaledObject"]
    assert len(scaled) == 1 and scaled[0]["apiVersion"] == KEDA
    spec = scaled[0]["spec"]
    assert spec["scaleTargetRef"]["name"] in a.objects(overlay, "Deployment")
    assert spec["scaleTargetRef"]["name"] == "agentkernel-runner"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]


def triggers(overlay: str) -> list[dict]:
    return a.objects(overlay, "ScaledObject")["agentkernel-runner"]["spec"]["triggers"]


def test_nats_triggers_watch_every_input_partition_consumer(tmp_path) -> None:
    nats = config("nats", tmp_path).execution.queues.nats
    assert nats is not None
    expected = {f"{nats.input_stream}-p{p}" for p in range(nats.partitions)}
    found = triggers("nats")
    assert {t["type"] for t in found} == {"nats-jetstream"}
    assert {t["metadata"]["stream"] for t in found} == {nats.input_stream}
    assert {t["metadata"]["consumer"] for t in found} == expected
    assert len(found) == nats.partitions


def test_nats_runners_at_most_replicas_do_not_outnumber_the_partitions(tmp_path) -> None:
    """Each partition has one owning consumer: consumers beyond the partitions get no work."""
    queues = config("nats", tmp_path).execution.queues
    assert queues.nats is not None
    spec = a.objects("nats", "ScaledObject")["agentkernel-runner"]["spec"]
    assert spec["maxReplicaCount"] * queues.input.no_of_consumers <= queues.nats.partitions


def test_nats_jetstream_objects_match_what_the_transport_expects(tmp_path) -> None:
    cfg = config("nats", tmp_path)
    queues, nats = cfg.execution.queues, cfg.execution.queues.nats
    assert nats is not None and nats.auto_provision is False
    streams = {o["spec"]["name"]: o["spec"] for o in a.rendered("nats") if o["kind"] == "Stream"}
    consumers = [o["spec"] for o in a.rendered("nats") if o["kind"] == "Consumer"]
    queue_settings = {
        nats.input_stream: (nats.input_subject_prefix, queues.input.max_receive_count),
        nats.output_stream: (nats.output_subject_prefix, queues.output.max_receive_count),
    }
    owners = {f"{stream}_OWNERS" for stream in queue_settings}
    assert set(streams) == set(queue_settings) | owners
    lease = lease_seconds(nats.ack_wait)  # what the transport provisions; a declared one is read
    for name in owners:
        spec = streams[name]
        assert spec["subjects"] == [f"{name}.>"] and spec["retention"] == "limits"
        assert spec["maxMsgsPerSubject"] == 1
        assert spec["maxAge"] == spec["duplicateWindow"] == f"{int(lease // 60)}m{int(lease % 60)}s"
    for stream, (prefix, max_receive_count) in queue_settings.items():
        spec = streams[stream]
        assert spec["subjects"] == [f"{prefix}.>"]
        assert spec["retention"] == "workqueue"
        assert spec["duplicateWindow"] == "5m" and nats.duplicate_window == 300.0
        assert spec["maxAge"] == "24h" and nats.max_age == 86400.0
        mine = {c["durableName"]: c for c in consumers if c["streamName"] == stream}
        assert set(mine) == {f"{stream}-p{p}" for p in range(nats.partitions)}
        for name, consumer in mine.items():
            partition = name.rsplit("-p", 1)[1]
            assert consumer["filterSubject"] == f"{prefix}.{partition}"
            assert consumer["maxAckPending"] == nats.max_ack_pending
            assert consumer["maxDeliver"] == max_receive_count + 1  # NatsTransport.from_config
            assert consumer["ackPolicy"] == "explicit"
            assert consumer["ackWait"] == "5m" and nats.ack_wait == 300.0


def test_kafka_trigger_watches_the_input_consumer_group(tmp_path) -> None:
    kafka = config("kafka", tmp_path).execution.queues.kafka
    assert kafka is not None
    (trigger,) = triggers("kafka")
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert meta["consumerGroup"] == f"{kafka.group_id}-input"  # KafkaConsumer's group name
    assert meta["topic"] == kafka.input_topic
    assert meta["bootstrapServers"] == kafka.bootstrap_servers
    assert kafka.bookkeeping == "redis", "several runner pods need shared receive counts"


def test_sqs_trigger_watches_the_input_queue(tmp_path) -> None:
    queues = config("sqs", tmp_path).execution.queues
    assert queues.sqs is not None
    (trigger,) = triggers("sqs")
    assert trigger["type"] == "aws-sqs-queue"
    assert trigger["metadata"]["queueURL"] == queues.input.url
    assert trigger["metadata"]["awsRegion"] == queues.sqs.region_name
    auth = a.objects("sqs", "TriggerAuthentication")[trigger["authenticationRef"]["name"]]
    assert auth["spec"]["podIdentity"]["provider"] == "aws"


@pytest.mark.parametrize("overlay", a.OVERLAYS)
def test_pods_run_as_the_images_non_root_user(overlay: str) -> None:
    user = next(args for stage in a.dockerfile_stages()[-1:] for i, args in stage if i == "USER")
    uid = int(user.split(":")[0])
    for deployment in a.objects(overlay, "Deployment").values():
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == uid
        assert spec["automountServiceAccountToken"] is False
        container = spec["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_sqs_overlay_names_what_the_terraform_modules_create(tmp_path) -> None:
    cfg = config("sqs", tmp_path)
    prefix = a.defaults(a.ECS)["name"]
    queues = a.resources(a.MODULES / "queues", "aws_sqs_queue")["queue"]["name"]
    for queue in ("input", "output"):
        url = getattr(cfg.execution.queues, queue).url
        expected = queues.replace("${var.name_prefix}", prefix).replace("${each.key}", queue)
        assert url is not None and url.rsplit("/", 1)[1] == expected
    tables = a.expression(a.locals_of(a.MODULES / "tables")["tables"])
    store, sessions = cfg.execution.response_store.dynamodb, cfg.session.dynamodb
    assert store is not None and sessions is not None
    for table, key in ((store.table_name, "response"), (sessions.table_name, "session")):
        suffix = re.search(rf'{key} = \{{name = "\$\{{var.name_prefix\}}-([a-z-]+)"', tables)
        assert suffix is not None and table == f"{prefix}-{suffix.group(1)}"


@pytest.mark.parametrize("overlay", a.OVERLAYS)
def test_runner_probes_use_its_health_port(overlay: str) -> None:
    runner = a.objects(overlay, "Deployment")["agentkernel-runner"]["spec"]["template"]
    container = runner["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["health"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert int(env["AK_EXECUTION__RUNNER__HEALTH_PORT"]) == port
    assert env["AK_EXECUTION__RUNNER__HEALTH_HOST"] == "0.0.0.0"
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "health"}
    assert runner["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    policy = a.objects(overlay, "NetworkPolicy")["agentkernel-runner"]
    assert policy["spec"]["ingress"][0]["ports"][0]["port"] == port


def containers(overlay: str) -> dict[str, list[dict]]:
    """Every container (init containers first) of each Deployment, by Deployment name."""
    found = {}
    for name, deployment in a.objects(overlay, "Deployment").items():
        spec = deployment["spec"]["template"]["spec"]
        found[name] = [*spec.get("initContainers", []), *spec["containers"]]
    return found


def secret_refs(container: dict) -> dict[str, tuple[str, str]]:
    """The container's variables taken from a Secret: name -> (secret, key)."""
    return {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def test_redis_trigger_watches_the_input_ready_stream(tmp_path) -> None:
    from agentkernel.pipeline.transport.redis.keys import QueueKeys

    redis = config("redis", tmp_path).execution.queues.redis
    assert redis is not None and redis.auto_provision is False
    (trigger,) = triggers("redis")
    assert trigger["type"] == "redis-streams"
    meta = trigger["metadata"]
    assert meta["stream"] == QueueKeys.of(redis.prefix, "input").ready
    assert meta["consumerGroup"] == redis.group
    assert meta["address"] == redis.url.split("//", 1)[1].split("/", 1)[0]
    auth = a.objects("redis", "TriggerAuthentication")[trigger["authenticationRef"]["name"]]
    assert auth["spec"]["secretTargetRef"][0]["name"] == "agentkernel-redis"


def test_redis_only_pods_take_every_url_from_the_secret(tmp_path) -> None:
    cfg = config("redis", tmp_path)
    store, session = cfg.execution.response_store.redis, cfg.session.redis
    assert cfg.execution.queues.type == "redis" and store is not None and session is not None
    urls = {"AK_EXECUTION__QUEUES__REDIS__URL", "AK_EXECUTION__RESPONSE_STORE__REDIS__URL"}
    urls.add("AK_SESSION__REDIS__URL")
    for (container,) in containers("redis").values():
        refs = secret_refs(container)
        assert {v: refs.get(v) for v in urls} == dict.fromkeys(urls, ("agentkernel-redis", "url"))
    assert "@" not in a.overlay_config_text("redis")  # no password in the ConfigMap


def test_postgres_pods_migrate_first_with_the_password_from_the_secret(tmp_path) -> None:
    cfg = config("postgres", tmp_path)
    blocks = [cfg.execution.queues.postgres, cfg.execution.response_store.postgres]
    blocks.append(cfg.session.postgres)
    assert all(b is not None and b.auto_provision is False for b in blocks)
    assert "@" in blocks[0].dsn and ":" not in blocks[0].dsn.split("//")[1].split("@")[0]
    mount = "/etc/agentkernel/config.yaml"
    for name, (migrate, process) in containers("postgres").items():
        assert migrate["command"] == ["agentkernel", "db", "migrate", "--config", mount], name
        assert migrate["image"] == process["image"]
        for container in (migrate, process):
            assert secret_refs(container) == {"PGPASSWORD": ("agentkernel-postgres", "password")}
            assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_postgres_trigger_counts_the_input_queue(tmp_path) -> None:
    pg = config("postgres", tmp_path).execution.queues.postgres
    assert pg is not None
    (trigger,) = triggers("postgres")
    assert trigger["type"] == "postgresql"
    meta = trigger["metadata"]
    assert f"FROM {pg.db_schema}.queue_messages" in meta["query"]
    assert f"queue = '{pg.input_queue}'" in meta["query"]
    assert f"@{meta['host']}:{meta['port']}/{meta['dbName']}" in pg.dsn
    assert pg.dsn.split("//")[1].startswith(f"{meta['userName']}@")
    auth = a.objects("postgres", "TriggerAuthentication")[trigger["authenticationRef"]["name"]]
    assert auth["spec"]["secretTargetRef"][0]["name"] == "agentkernel-postgres"
