-- Broker credentials bound to one host of one broker group (the host part of one of the group's
-- broker_addrs): one row per host naming its current credential, a `credentials` row of role
-- broker. Issuing again revokes the credential named here and points the row at the new one; a
-- host leaving broker_addrs has its credential revoked and its row removed in the same transaction.
-- No ON DELETE action: a broker group cannot be deleted while rows here still name it.
CREATE TABLE broker_host_credentials (
    broker_group  text NOT NULL REFERENCES broker_groups (name),
    host          text NOT NULL,
    access_key    text NOT NULL UNIQUE REFERENCES credentials (access_key),
    bound_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (broker_group, host)
);
