-- The job a preemption's victim is being stopped for (issue 22). The room a victim frees is
-- that job's until the victim has ended: another job that needs room looks for victims of its
-- own instead of counting on it (and waiting a whole stop, then racing for it). Read by the
-- scheduler only while the victim's stop is under way (`preempt_requested_at` set); no foreign
-- key: a hint, and the job it names may have been admitted, cancelled or removed since.
ALTER TABLE jobs ADD COLUMN preempted_for uuid;
