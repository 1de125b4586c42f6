-- Lineage (`yard lineage`) walks from a dataset version to the jobs that read it and to the job
-- that produced it. Both are looked up by index, so a walk costs the same however many jobs a
-- tenant has run.
CREATE INDEX jobs_by_datasets ON jobs USING gin (datasets jsonb_path_ops) WHERE datasets IS NOT NULL;
CREATE INDEX datasets_by_source_job ON datasets (tenant_id, source_job) WHERE source_job IS NOT NULL;
