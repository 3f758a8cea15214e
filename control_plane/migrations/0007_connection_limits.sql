-- Per-tenant limits on each broker: the connections a tenant may hold to one broker, and the
-- requests it may have in flight there (being handled, or held: a long-polling pull, a send
-- waiting for its flush or slave). Each broker gets the whole value, not a share: a client
-- connects to every broker that serves its topics. Overrides as for the other limits (NULL: the plan's).
ALTER TABLE plans
    ADD COLUMN max_connections        integer NOT NULL DEFAULT 1000 CHECK (max_connections >= 0),
    ADD COLUMN max_inflight_requests  integer NOT NULL DEFAULT 10000 CHECK (max_inflight_requests >= 0);
ALTER TABLE quota_overrides
    ADD COLUMN max_connections        integer,
    ADD COLUMN max_inflight_requests  integer;
UPDATE plans SET max_connections = 50, max_inflight_requests = 500 WHERE name = 'free';
UPDATE plans SET max_connections = 10000, max_inflight_requests = 100000 WHERE name = 'enterprise';
