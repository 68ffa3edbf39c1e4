-- What operators asked of agents beyond a release (the OpAMP seed's commands and
-- connection settings): a restart of the agent or its workload, a credential rotation,
-- a move to another server URL. One row per agent and kind, the latest asked: it is
-- delivered at the agent's contacts until the agent (or, for a rotation, the server
-- taking the new credential) says how it ended.
CREATE TABLE agent_commands (
    agent_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    argument TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    error TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (agent_id, kind)
);
CREATE UNIQUE INDEX agent_commands_id ON agent_commands (id);
CREATE INDEX agent_commands_status ON agent_commands (status);
-- A rotation's offered credential (its sha256) until the agent proves it; then it is
-- the agent's token_hash and the old one is refused.
ALTER TABLE agents ADD COLUMN token_candidate TEXT;
-- When the agent's credential was set (unix seconds): its age, and what
-- agents.rotate-every measures.
ALTER TABLE agents ADD COLUMN credential_at BIGINT;
-- What a native agent said at its last register: the commands it takes (JSON array)
-- and the server URL it used.
ALTER TABLE agents ADD COLUMN capabilities TEXT;
ALTER TABLE agents ADD COLUMN endpoint TEXT;
