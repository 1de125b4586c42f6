-- One index beside the audit log's key: every audited change pays for each index (a submit
-- among them); a filter by action or actor walks the newest entries by key, or a tenant's
-- entries by `audit_log_by_tenant`.
DROP INDEX audit_log_by_action;
