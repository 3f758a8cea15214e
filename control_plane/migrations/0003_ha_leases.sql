-- Automatic failover (docs/ha.md#failover): who is master of each broker group, under which
-- epoch, until when; and what each member last said of itself.
CREATE TABLE ha_group (
    cluster_name     text        NOT NULL,
    broker_name      text        NOT NULL,
    epoch            bigint      NOT NULL DEFAULT 0,
    master_id        integer,                -- the member (configured broker id) that is master; NULL: none
    master_role      text        NOT NULL DEFAULT 'SYNC_MASTER' CHECK (master_role IN ('SYNC_MASTER', 'ASYNC_MASTER')),
    lease_expires_at timestamptz NOT NULL,
    changed_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster_name, broker_name)
);

CREATE TABLE ha_member (
    cluster_name  text        NOT NULL,
    broker_name   text        NOT NULL,
    member_id     integer     NOT NULL CHECK (member_id >= 0),
    addr          text        NOT NULL,
    ha_addr       text        NOT NULL,
    max_offset    bigint      NOT NULL,
    epoch         bigint      NOT NULL,
    acting_master boolean     NOT NULL,
    lag_bytes     bigint,
    last_seen     timestamptz NOT NULL,
    PRIMARY KEY (cluster_name, broker_name, member_id),
    FOREIGN KEY (cluster_name, broker_name) REFERENCES ha_group ON DELETE CASCADE
);
