-- Orbit control plane: the whole schema. PostgreSQL is the only state.

CREATE TABLE plans (
    name                 text PRIMARY KEY,
    publish_msgs_per_s   bigint NOT NULL CHECK (publish_msgs_per_s >= 0),
    publish_bytes_per_s  bigint NOT NULL CHECK (publish_bytes_per_s >= 0),
    consume_msgs_per_s   bigint NOT NULL CHECK (consume_msgs_per_s >= 0),
    consume_bytes_per_s  bigint NOT NULL CHECK (consume_bytes_per_s >= 0),
    max_topics           integer NOT NULL CHECK (max_topics >= 0),
    max_queues           integer NOT NULL CHECK (max_queues >= 0),
    storage_bytes        bigint NOT NULL CHECK (storage_bytes >= 0),
    max_retention_hours  integer NOT NULL CHECK (max_retention_hours >= 1),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE tenants (
    id            text PRIMARY KEY,
    display_name  text NOT NULL DEFAULT '',
    plan          text NOT NULL REFERENCES plans (name),
    status        text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended', 'deleted')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- NULL: the plan's value applies.
CREATE TABLE quota_overrides (
    tenant_id            text PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    publish_msgs_per_s   bigint,
    publish_bytes_per_s  bigint,
    consume_msgs_per_s   bigint,
    consume_bytes_per_s  bigint,
    max_topics           integer,
    max_queues           integer,
    storage_bytes        bigint,
    max_retention_hours  integer,
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE broker_groups (
    name               text PRIMARY KEY,
    namesrv_addrs      text[] NOT NULL DEFAULT '{}',
    broker_addrs       text[] NOT NULL DEFAULT '{}',
    max_queues         integer NOT NULL CHECK (max_queues >= 0),
    max_msgs_per_s     bigint NOT NULL CHECK (max_msgs_per_s >= 0),
    storage_bytes      bigint NOT NULL CHECK (storage_bytes >= 0),
    status             text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'draining')),
    created_at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE broker_hosts (
    broker_group  text NOT NULL REFERENCES broker_groups (name) ON DELETE CASCADE,
    broker_id     integer NOT NULL CHECK (broker_id >= 0),
    host          text NOT NULL,
    address       text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (broker_group, broker_id)
);

CREATE TABLE topics (
    tenant_id                   text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name                        text NOT NULL,
    message_type                text NOT NULL CHECK (message_type IN ('NORMAL', 'FIFO', 'DELAY', 'TRANSACTION')),
    retention_hours             integer NOT NULL CHECK (retention_hours >= 1),
    throughput_hint_msgs_per_s  integer,
    queue_count                 integer NOT NULL CHECK (queue_count >= 1),
    description                 text NOT NULL DEFAULT '',
    status                      text NOT NULL DEFAULT 'provisioning' CHECK (status IN ('provisioning', 'active')),
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);

CREATE TABLE topic_placements (
    tenant_id     text NOT NULL,
    topic         text NOT NULL,
    broker_group  text NOT NULL REFERENCES broker_groups (name),
    queue_count   integer NOT NULL CHECK (queue_count >= 1),
    applied       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (tenant_id, topic, broker_group),
    FOREIGN KEY (tenant_id, topic) REFERENCES topics (tenant_id, name) ON DELETE CASCADE
);
CREATE INDEX topic_placements_by_group ON topic_placements (broker_group);

CREATE TABLE consumer_groups (
    tenant_id          text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name               text NOT NULL,
    retry_policy       text NOT NULL CHECK (retry_policy IN ('exponential', 'fixed')),
    fixed_interval_ms  integer NOT NULL,
    max_retries        integer NOT NULL CHECK (max_retries BETWEEN 0 AND 64),
    consume_orderly    boolean NOT NULL DEFAULT false,
    description        text NOT NULL DEFAULT '',
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);

-- secret_hash: scrypt, for the token endpoint. secret_sealed: AES-GCM under the master key,
-- for brokers checking RocketMQ ACL signatures; cleared when revoked.
CREATE TABLE credentials (
    access_key     text PRIMARY KEY,
    tenant_id      text REFERENCES tenants (id) ON DELETE CASCADE,
    role           text NOT NULL CHECK (role IN ('tenant', 'operator', 'broker')),
    secret_hash    text NOT NULL,
    secret_sealed  bytea,
    grants         jsonb NOT NULL DEFAULT '[]',
    description    text NOT NULL DEFAULT '',
    status         text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    created_at     timestamptz NOT NULL DEFAULT now(),
    revoked_at     timestamptz,
    CHECK ((role = 'tenant') = (tenant_id IS NOT NULL))
);
CREATE INDEX credentials_by_tenant ON credentials (tenant_id);

CREATE TABLE signing_keys (
    kid                 text PRIMARY KEY,
    algorithm           text NOT NULL,
    public_jwk          jsonb NOT NULL,
    private_key_sealed  bytea NOT NULL,
    status              text NOT NULL CHECK (status IN ('active', 'retired')),
    created_at          timestamptz NOT NULL DEFAULT now(),
    retired_at          timestamptz
);
CREATE UNIQUE INDEX signing_keys_one_active ON signing_keys (status) WHERE status = 'active';

-- One row per usage record a broker reported; report_id makes a resent report a no-op.
CREATE TABLE usage_records (
    report_id     text PRIMARY KEY,
    broker        text NOT NULL,
    tenant_id     text NOT NULL,
    minute        timestamptz NOT NULL,
    requests_4k   bigint NOT NULL CHECK (requests_4k >= 0),
    bytes_in      bigint NOT NULL CHECK (bytes_in >= 0),
    bytes_out     bigint NOT NULL CHECK (bytes_out >= 0),
    stored_bytes  bigint NOT NULL CHECK (stored_bytes >= 0),
    received_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX usage_records_by_tenant_minute ON usage_records (tenant_id, minute);
