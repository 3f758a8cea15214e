-- Billing aggregates written by the Spark metering pipeline (spark_integration/pipelines/metering.py)
-- from the brokers' usage records in the system topic ORBIT_SYS_USAGE. The control plane's own
-- usage_records (reported over HTTP) stay as they are; these tables are the pipeline's output.

-- Per tenant, minute and broker: counters add up; stored_bytes is that broker's largest sample in
-- the minute (a gauge). A tenant's minute is the sum over its brokers.
CREATE TABLE billing_usage_minute (
    tenant_id     text NOT NULL,
    minute        timestamptz NOT NULL,
    broker        text NOT NULL,
    requests_4k   bigint NOT NULL CHECK (requests_4k >= 0),
    bytes_in      bigint NOT NULL CHECK (bytes_in >= 0),
    bytes_out     bigint NOT NULL CHECK (bytes_out >= 0),
    stored_bytes  bigint NOT NULL CHECK (stored_bytes >= 0),
    records       integer NOT NULL CHECK (records > 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, minute, broker)
);

-- Per tenant and hour: counters add up; stored_bytes_peak is the hour's largest minute (summed
-- over brokers), as the control plane's usage API shows it.
CREATE TABLE billing_usage_hour (
    tenant_id          text NOT NULL,
    hour               timestamptz NOT NULL,
    requests_4k        bigint NOT NULL CHECK (requests_4k >= 0),
    bytes_in           bigint NOT NULL CHECK (bytes_in >= 0),
    bytes_out          bigint NOT NULL CHECK (bytes_out >= 0),
    stored_bytes_peak  bigint NOT NULL CHECK (stored_bytes_peak >= 0),
    records            integer NOT NULL CHECK (records > 0),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, hour)
);

-- How far each pipeline has applied each queue of its topic: the next offset not yet counted.
-- Written in the same transaction as the aggregates, so a replayed micro-batch (or a restart
-- with a new checkpoint) counts nothing twice.
CREATE TABLE billing_pipeline_offsets (
    pipeline     text NOT NULL,
    topic        text NOT NULL,
    broker       text NOT NULL,
    queue_id     integer NOT NULL CHECK (queue_id >= 0),
    next_offset  bigint NOT NULL CHECK (next_offset >= 0),
    batch_id     bigint NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, broker, queue_id)
);
