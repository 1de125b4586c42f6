-- The images an attempt actually ran, by digest (`repo@sha256:...`), as the executor reported
-- them from the containers' status: what a rerun must use to be exact. Empty when the executor
-- runs no images (the local backend) or never saw a container start.
ALTER TABLE job_attempts ADD COLUMN image_digests text[] NOT NULL DEFAULT '{}';
