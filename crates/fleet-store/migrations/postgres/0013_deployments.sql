-- Deployments: who gets which release (see agent_fleet::deployments). A deployment is a
-- name, a selector over agents' labels, the release its agents run, a priority and its
-- rollout policy. `default` always exists: it selects every agent, comes last, and its
-- release is the fleet's current release (release_history), so its release_id stays NULL;
-- its policy is NULL until an operator sets one (then [rollout] of server.toml only
-- seeded it).
CREATE TABLE deployments (
    name       TEXT PRIMARY KEY NOT NULL,
    selector   TEXT NOT NULL DEFAULT '',
    release_id TEXT,
    priority   BIGINT NOT NULL DEFAULT 0,
    policy     TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
INSERT INTO deployments (name, selector, release_id, priority, policy, created_at, updated_at)
VALUES ('default', '', NULL, 0, NULL, 0, 0);

-- A bundle rollout belongs to a deployment: its agent_group column names it ('' for
-- `default`), so two deployments may roll out the same bundle, each its own rollout.
DROP INDEX rollouts_bundle_once;
CREATE UNIQUE INDEX rollouts_bundle_once ON rollouts (agent_group, target, signed_at) WHERE rollout_kind = 'bundle';
