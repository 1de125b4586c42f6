-- What a rerun could not pin (issue #20): a `path` parameter naming a file or folder on the
-- machine, an image given by a tag. A rerun of such a job is refused unless the caller accepts
-- them; an accepted rerun keeps the list here, [{input, message}], written with the job in the
-- same statement (so the run record written at launch copies it), and never without the link
-- to the job it reruns.
ALTER TABLE jobs
    ADD COLUMN rerun_unpinned jsonb,
    ADD CONSTRAINT jobs_rerun_unpinned_of_a_rerun CHECK (
        rerun_unpinned IS NULL OR (rerun_of IS NOT NULL AND jsonb_typeof(rerun_unpinned) = 'array'));
