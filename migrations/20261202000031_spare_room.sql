-- Spare room (issue 40): jobs that run only on GPUs no job within its quota waits for, counted
-- in no quota and stopped first (`JobSpec::spare`, inside the stored spec: no column). An
-- experiment's trials run there by default; experiments made before this migration keep their
-- trials under quota, as they were created.
ALTER TABLE experiments ADD COLUMN spare boolean NOT NULL DEFAULT false;
ALTER TABLE experiments ALTER COLUMN spare SET DEFAULT true;
