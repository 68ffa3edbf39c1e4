-- Agents' labels (see agent_fleet::labels), as JSON objects: what the agent reported with
-- its last register or connect (NULL: it never said, an agent from before labels), and
-- what operators set on the server, which wins on the same key.
ALTER TABLE agents ADD COLUMN labels TEXT;
ALTER TABLE agents ADD COLUMN server_labels TEXT NOT NULL DEFAULT '{}';
