-- Tiered storage (docs/quotas_and_metering.md, "Retention in two tiers"): brokers move sealed
-- CommitLog files to object storage and read them back from there.
--
-- topics.retention_hours is the total retention: 1..8760 hours, or NULL for unlimited (allowed on
-- a plan, or override, with unlimited_retention). A topic promised more than 8760 hours keeps its
-- messages for good, which keeps the promise. topics.local_retention_hours is how long a broker
-- keeps the topic's messages on its own disk too (NULL: the broker's local_retention_hours); never
-- more than a finite retention_hours.
ALTER TABLE topics ALTER COLUMN retention_hours DROP NOT NULL;
UPDATE topics SET retention_hours = NULL WHERE retention_hours > 8760;
ALTER TABLE topics
    ADD CONSTRAINT topics_retention_hours_max CHECK (retention_hours <= 8760),
    ADD COLUMN local_retention_hours integer CHECK (local_retention_hours BETWEEN 1 AND 8760);
ALTER TABLE topics
    ADD CONSTRAINT topics_local_retention_within_total CHECK (local_retention_hours <= retention_hours);

-- Plans: unlimited_retention lets topics ask for retention_hours "unlimited"; max_tiered_bytes caps
-- the bytes a tenant keeps in object storage (NULL: no cap), apart from storage_bytes, which caps
-- the bytes on brokers' disks; tiered bytes are priced per GB-month (GB = 2^30 bytes) in
-- millionths of the billing currency. Overrides as for the other limits (NULL: the plan's); the
-- price is the plan's alone.
ALTER TABLE plans
    ADD COLUMN unlimited_retention               boolean NOT NULL DEFAULT false,
    ADD COLUMN max_tiered_bytes                  bigint CHECK (max_tiered_bytes >= 0),
    ADD COLUMN tiered_price_per_gb_month_micros  bigint NOT NULL DEFAULT 0
        CHECK (tiered_price_per_gb_month_micros >= 0);
ALTER TABLE quota_overrides
    ADD COLUMN unlimited_retention  boolean,
    ADD COLUMN max_tiered_bytes     bigint;
UPDATE plans SET max_tiered_bytes = 1073741824 WHERE name = 'free';
UPDATE plans SET tiered_price_per_gb_month_micros = 23000 WHERE name = 'standard';
UPDATE plans SET tiered_price_per_gb_month_micros = 20000, unlimited_retention = true WHERE name = 'enterprise';

-- Usage: tiered_bytes is a gauge beside stored_bytes (the bytes on the broker's disk): the tenant's
-- bytes the broker keeps in object storage only. Records of brokers without a tier carry none (0).
ALTER TABLE usage_records
    ADD COLUMN tiered_bytes bigint NOT NULL DEFAULT 0 CHECK (tiered_bytes >= 0);
ALTER TABLE billing_usage_minute
    ADD COLUMN tiered_bytes bigint NOT NULL DEFAULT 0 CHECK (tiered_bytes >= 0);
ALTER TABLE billing_usage_hour
    ADD COLUMN tiered_bytes_peak bigint NOT NULL DEFAULT 0 CHECK (tiered_bytes_peak >= 0);
