-- Messages a broker deleted inside their retention at its disk's emergency watermark (per tenant,
-- broker and minute, as the broker reported them): a counter that adds up like requests_4k.
ALTER TABLE usage_records
    ADD COLUMN forced_deleted_messages bigint NOT NULL DEFAULT 0 CHECK (forced_deleted_messages >= 0);
