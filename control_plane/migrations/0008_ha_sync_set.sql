-- Failover that stays safe and available under partitions (docs/ha.md#failover):
-- * a lease belongs to one process of a member (its instance), not to the member id;
-- * a member "hears" the control plane when its heartbeat echoes the last answer it was sent;
--   only members that hear are renewed or elected;
-- * the in-sync set: the members holding every acknowledged message, as the master reports
--   them (NULL: not known, every live member is electable);
-- * candidates are ordered by the epoch of the log they hold, then by how far it reaches;
-- * a master that the other members cannot reach on its client address is asked to step down
--   (release_seq: the answer that asked; the lease is released once it heard it);
-- * every election is kept, for operators and for checking that tenures never overlap.
ALTER TABLE ha_group
    ADD COLUMN master_instance text NOT NULL DEFAULT '',
    ADD COLUMN sync_set        integer[],
    ADD COLUMN release_seq     bigint NOT NULL DEFAULT 0;
ALTER TABLE ha_member
    ADD COLUMN instance   text    NOT NULL DEFAULT '',
    ADD COLUMN answers    bigint  NOT NULL DEFAULT 0,
    ADD COLUMN hearing    boolean NOT NULL DEFAULT true,
    ADD COLUMN log_epoch  bigint  NOT NULL DEFAULT 0,
    ADD COLUMN interval_s real    NOT NULL DEFAULT 1,
    ADD COLUMN master_unreachable_s real;  -- how long its probes of the master's client address failed (NULL: no probe)

CREATE TABLE ha_epoch (
    cluster_name text        NOT NULL,
    broker_name  text        NOT NULL,
    epoch        bigint      NOT NULL,
    master_id    integer     NOT NULL,
    log_epoch    bigint      NOT NULL,
    max_offset   bigint      NOT NULL,
    elected_at   timestamptz NOT NULL,
    PRIMARY KEY (cluster_name, broker_name, epoch),
    FOREIGN KEY (cluster_name, broker_name) REFERENCES ha_group ON DELETE CASCADE
);
