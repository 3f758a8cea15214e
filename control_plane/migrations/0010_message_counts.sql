-- Usage in messages, and refusals (docs/quotas_and_metering.md, "Usage metering"): counters that
-- add up like requests_4k. messages_in: messages a tenant published that a broker stored;
-- messages_out: messages delivered to its consumers (pulls and POP receives); throttled_requests:
-- its requests a broker refused because it was over a quota or limit. Records of brokers that
-- count none of them carry none (0).
ALTER TABLE usage_records
    ADD COLUMN messages_in         bigint NOT NULL DEFAULT 0 CHECK (messages_in >= 0),
    ADD COLUMN messages_out        bigint NOT NULL DEFAULT 0 CHECK (messages_out >= 0),
    ADD COLUMN throttled_requests  bigint NOT NULL DEFAULT 0 CHECK (throttled_requests >= 0);
ALTER TABLE billing_usage_minute
    ADD COLUMN messages_in         bigint NOT NULL DEFAULT 0 CHECK (messages_in >= 0),
    ADD COLUMN messages_out        bigint NOT NULL DEFAULT 0 CHECK (messages_out >= 0),
    ADD COLUMN throttled_requests  bigint NOT NULL DEFAULT 0 CHECK (throttled_requests >= 0);
ALTER TABLE billing_usage_hour
    ADD COLUMN messages_in         bigint NOT NULL DEFAULT 0 CHECK (messages_in >= 0),
    ADD COLUMN messages_out        bigint NOT NULL DEFAULT 0 CHECK (messages_out >= 0),
    ADD COLUMN throttled_requests  bigint NOT NULL DEFAULT 0 CHECK (throttled_requests >= 0);
