-- Checkpoints as first-class outputs (issue 43): a run fine-tuned from another job's checkpoint
-- (a template's `checkpoint` parameter, `init_from=JOB[:STEP]`) records that job and step, for
-- its run record and lineage. The source is a job of the same tenant, enforced by the foreign
-- key over (tenant_id, id).
ALTER TABLE jobs ADD CONSTRAINT jobs_tenant_and_id_unique UNIQUE (tenant_id, id);

ALTER TABLE jobs
    ADD COLUMN init_from_job  uuid,
    ADD COLUMN init_from_step bigint CONSTRAINT jobs_init_from_step_range CHECK (init_from_step >= 0),
    ADD CONSTRAINT jobs_init_from_whole CHECK ((init_from_job IS NULL) = (init_from_step IS NULL)),
    ADD CONSTRAINT jobs_init_from_same_tenant FOREIGN KEY (tenant_id, init_from_job) REFERENCES jobs (tenant_id, id);
-- Lineage walks from a job to the runs fine-tuned from it.
CREATE INDEX jobs_by_init_from ON jobs (init_from_job) WHERE init_from_job IS NOT NULL;
