-- Per-agent credentials: the sha256 of the token issued at the agent's first register.
ALTER TABLE agents ADD COLUMN token_hash TEXT;
