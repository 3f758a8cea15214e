-- Load samples from brokers' load reports (POST /internal/v1/load, docs/elasticity.md), kept
-- load_history_hours (pruned by the control plane). `at` is the broker's time of the report.
-- Per tenant topic and broker: appended = the sum of its queues' max offsets (messages appended
-- so far), queues = its queue count there, refused = sends and pulls refused since the last report.
CREATE TABLE topic_load_samples (
    tenant_id  text NOT NULL,
    topic      text NOT NULL,
    broker     text NOT NULL,
    at         timestamptz NOT NULL,
    appended   bigint NOT NULL CHECK (appended >= 0),
    queues     integer NOT NULL CHECK (queues >= 0),
    refused    bigint NOT NULL DEFAULT 0 CHECK (refused >= 0),
    PRIMARY KEY (tenant_id, topic, at, broker)
);
CREATE INDEX topic_load_samples_by_time ON topic_load_samples (at);

-- Per consumer group, topic and broker: committed = the sum of the group's committed offsets on
-- the queues it committed on, backlog = the sum of (max offset - committed) over those queues.
CREATE TABLE group_load_samples (
    tenant_id       text NOT NULL,
    consumer_group  text NOT NULL,
    topic           text NOT NULL,
    broker          text NOT NULL,
    at              timestamptz NOT NULL,
    committed       bigint NOT NULL CHECK (committed >= 0),
    backlog         bigint NOT NULL CHECK (backlog >= 0),
    PRIMARY KEY (tenant_id, consumer_group, topic, at, broker)
);
CREATE INDEX group_load_samples_by_group ON group_load_samples (tenant_id, consumer_group, at);
CREATE INDEX group_load_samples_by_time ON group_load_samples (at);
