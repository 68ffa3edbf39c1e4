-- Where agents export their own telemetry (the OpAMP seed's own_metrics/own_logs):
-- `update-server telemetry set --selector S --metrics URL [--logs URL] [--header K=V]`.
-- One row per label selector as the operator wrote it (setting it again replaces it);
-- an agent exports to the destination of the most specific selector that matches its
-- labels (see agent_fleet::telemetry). Live fleet data: every server of the fleet reads
-- it with the settings, and agents enrolled later match too.
CREATE TABLE telemetry_destinations (
    selector   TEXT PRIMARY KEY,
    metrics    TEXT NOT NULL,
    logs       TEXT,
    -- A JSON object of header names to values.
    headers    TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
