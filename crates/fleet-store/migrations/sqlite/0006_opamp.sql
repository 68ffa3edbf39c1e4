-- OpAMP agents live in `agents` beside the native ones (protocol 'opamp'); what only
-- they have is kept beside them: the server's view of the agent (agent_opamp::view::
-- AgentView as JSON), the last sequence_num merged (as a signed 64-bit integer) and
-- whether it is connected (false after agent_disconnect). seen_at is unix milliseconds.
ALTER TABLE agents ADD COLUMN protocol TEXT NOT NULL DEFAULT 'native';

CREATE TABLE agent_opamp (
    agent_id         TEXT PRIMARY KEY NOT NULL,
    view             TEXT NOT NULL,
    sequence_num     INTEGER,
    online           INTEGER NOT NULL DEFAULT 1,
    accepts_packages INTEGER NOT NULL DEFAULT 0,
    accepts_remote_config INTEGER NOT NULL DEFAULT 0,
    seen_at          INTEGER NOT NULL
);
