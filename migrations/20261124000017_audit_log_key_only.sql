-- The audit log keeps only its key: every audited change (a submit among them) pays for each
-- index, while reads are rare and take the newest entries by key, filtered (a tenant's, an
-- action's, an actor's).
DROP INDEX audit_log_by_action;
DROP INDEX audit_log_by_tenant;
