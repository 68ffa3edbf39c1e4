-- The health an agent reported with its last register or connect: the "health" JSON
-- object as received, and the two facts /metrics counts without parsing it.
ALTER TABLE agents ADD COLUMN health TEXT;
ALTER TABLE agents ADD COLUMN healthy BIGINT;
ALTER TABLE agents ADD COLUMN workload_restarts BIGINT;
