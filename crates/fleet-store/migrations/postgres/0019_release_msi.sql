-- A release may carry its Windows MSI (`agent-<version>-<target>.msi`) beside its
-- bundles: a row of release_files of kind 'msi'. Its bundles are kind 'bundle', as every
-- row before this was; only they make the release's identity and its rollout.
ALTER TABLE release_files ADD COLUMN kind TEXT NOT NULL DEFAULT 'bundle';
