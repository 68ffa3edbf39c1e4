-- Agents that left (`agent uninstall`) or were removed by an operator: their credentials
-- are refused from then on, and no rollout or configuration wave counts them.
CREATE TABLE agents_revoked (
    id TEXT PRIMARY KEY,
    how TEXT NOT NULL,
    at BIGINT NOT NULL
);
