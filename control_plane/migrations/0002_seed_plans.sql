-- The plans every installation starts with. Operators change them with PUT /v1/plans/{plan}.

INSERT INTO plans (name, publish_msgs_per_s, publish_bytes_per_s, consume_msgs_per_s, consume_bytes_per_s,
                   max_topics, max_queues, storage_bytes, max_retention_hours)
VALUES
    ('free',         100,     1048576,   200,    2097152,   5,    20,   1073741824,    24),
    ('standard',     5000,    52428800,  10000,  104857600, 100,  800,  107374182400,  168),
    ('enterprise',   100000,  1073741824, 200000, 2147483648, 2000, 16000, 10995116277760, 720);
