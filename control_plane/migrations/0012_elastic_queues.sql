-- Elastic queues (docs/elasticity.md): a placement's queues are [0, queue_count) on its broker
-- group, of which [0, write_queue_count) take new messages; the others are read-only, being
-- drained by their consumers before they go. write_queue_count 0: the group only drains the topic.
ALTER TABLE topic_placements ADD COLUMN write_queue_count integer;
UPDATE topic_placements SET write_queue_count = queue_count;
ALTER TABLE topic_placements
    ALTER COLUMN write_queue_count SET NOT NULL,
    ADD CONSTRAINT topic_placements_write_within_read CHECK (write_queue_count BETWEEN 0 AND queue_count);

-- What the autoscaler did to a topic, and why (the tenant lists them): grow (queues added or
-- read-only ones taking messages again), shrink (queues made read-only to drain), remove (drained
-- queues gone), move (a draining broker group's queues made read-only, their share placed
-- elsewhere), refuse (a change the load asked for and could not have: the reason says why).
CREATE TABLE topic_scaling_events (
    id             bigserial PRIMARY KEY,
    tenant_id      text NOT NULL,
    topic          text NOT NULL,
    at             timestamptz NOT NULL DEFAULT now(),
    action         text NOT NULL CHECK (action IN ('grow', 'shrink', 'remove', 'move', 'refuse')),
    write_queues   integer NOT NULL CHECK (write_queues >= 0),  -- writable queues after the change
    read_queues    integer NOT NULL CHECK (read_queues >= 0),   -- every queue after the change
    publish_rate   double precision,  -- msgs/s the decision saw (NULL: not a load decision)
    reason         text NOT NULL,
    FOREIGN KEY (tenant_id, topic) REFERENCES topics (tenant_id, name) ON DELETE CASCADE
);
CREATE INDEX topic_scaling_events_by_topic ON topic_scaling_events (tenant_id, topic, at DESC);
